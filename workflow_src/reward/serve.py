"""Run a command beside a reward service that lives exactly as long as the command.

    python -m workflow_src.reward.serve --reward-section results/config/reward.json --service tuned \\
        [--python PY | --python-from results/env/reward_environment.json] [--record FILE] -- COMMAND ...

Starts gunicorn on a free loopback port with the named service settings (`reward.services.NAME`),
waits for /health, runs COMMAND with SPEEDPROOF_REWARD_URL pointing at it, and stops the service
when COMMAND ends — on success, failure, SIGTERM or SIGINT alike. The exit status is COMMAND's
(1 when the service never became healthy: COMMAND is then not run). `--record` writes what ran:
the settings, the URL, the interpreter, gunicorn's version and the service's lifetime.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..processes import stop_process
from ..provenance.atomic import atomic_write_json
from ..provenance.stamp import load_config_section
from .environment import python_path
from .service import RewardService, RewardServiceStartError

URL_VARIABLE = "SPEEDPROOF_REWARD_URL"
# How to start an equal service: the service binds loopback, so ranks on another node of a multi-node
# launch cannot reach it and start their own from this (workflow_src/protocol/ranks.py).
SERVE_VARIABLE = "SPEEDPROOF_REWARD_SERVE"


def serve_options(spec: dict, record: str | None) -> list[str]:
    """This CLI's options for the service `spec` (SERVE_VARIABLE's JSON) writing its record to `record`."""
    options = ["--reward-section", spec["reward_section"], "--service", spec["service"]]
    if spec.get("python"):
        options += ["--python", spec["python"]]
    elif spec.get("python_from"):
        options += ["--python-from", spec["python_from"]]
    return options + (["--record", record] if record else [])


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_stop(signum, frame):  # noqa: ARG001
    raise _Stop(signum)


def service_settings(section: dict, name: str) -> dict:
    services = section.get("services", {})
    if name not in services:
        raise SystemExit(f"reward serve: no service {name!r} in reward.services (known: {sorted(services)})")
    return services[name]


def gunicorn_version(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import gunicorn; print(gunicorn.__version__)"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("reward serve: give the command after --")
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reward-section", required=True, help="results/config/reward.json")
    ap.add_argument("--service", required=True, help="name of the settings in reward.services")
    py = ap.add_mutually_exclusive_group()
    py.add_argument("--python", help="interpreter that runs gunicorn (default: this one)")
    py.add_argument("--python-from", help="reward_environment.json whose `python` runs gunicorn")
    ap.add_argument("--record", help="write the service's settings and lifetime here (JSON)")
    a = ap.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("reward serve: the command after -- is empty")

    section = load_config_section(a.reward_section)["value"]
    settings = service_settings(section, a.service)
    python = a.python or (python_path(json.loads(Path(a.python_from).read_text())["python"]) if a.python_from
                          else sys.executable)
    svc = RewardService(workers=settings["workers"], threads=settings["threads"],
                        omp_threads=settings.get("omp_threads"), python=python,
                        max_body_bytes=section["max_body_bytes"], body_timeout_s=section["body_timeout_s"],
                        startup_timeout_s=section["startup_timeout_s"])
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_stop)
    started = time.time()
    child = None
    rc = 1
    try:
        try:
            svc.start()
        except RewardServiceStartError as e:
            print(f"reward serve: the reward service did not start, so the command was not run: {e}",
                  file=sys.stderr)
            return 1
        print(f"reward serve: service {a.service!r} ({settings['workers']} workers × {settings['threads']} "
              f"threads) at {svc.url}", file=sys.stderr, flush=True)
        spec = {"reward_section": str(Path(a.reward_section).resolve()), "service": a.service, "python": a.python,
                "python_from": str(Path(a.python_from).resolve()) if a.python_from else None,
                "record": str(Path(a.record).resolve()) if a.record else None}
        child = subprocess.Popen(command, env={**os.environ, URL_VARIABLE: svc.url, SERVE_VARIABLE: json.dumps(spec)})
        rc = child.wait()
        return rc
    except _Stop as stop:
        rc = 128 + stop.signum
        return rc
    finally:
        if child is not None:
            stop_process(child, grace_s=30)
        url = svc.url if svc.port is not None else None
        svc.stop()
        if a.record:
            atomic_write_json(a.record, {
                "service": a.service, "settings": settings, "url": url, "python": python,
                "gunicorn": gunicorn_version(python), "started_unix": started, "stopped_unix": time.time(),
                "command_exit_code": rc})


if __name__ == "__main__":
    sys.exit(main())
