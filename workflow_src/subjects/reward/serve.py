"""Run a command beside a reward service that lives exactly as long as the command.

    python -m workflow_src.subjects.reward.serve --reward-section results/config/reward.json --service tuned \\
        [--python PY | --python-from results/env/reward_environment.json] [--record FILE] -- COMMAND ...

Starts the service with the named settings (`reward.services.NAME`), gunicorn's workers behind the buffering
front (front.py) on a free loopback port, waits for /health, runs COMMAND with SPEEDPROOF_REWARD_URL pointing at
it, and stops the service when COMMAND ends — on success, failure, SIGTERM or SIGINT alike. The exit status is COMMAND's
(1 when the service never became healthy: COMMAND is then not run). `--record` writes what ran:
the settings, the URL, how the service is fronted, the interpreter, gunicorn's version and the service's
lifetime.
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

from workflow_src.config_schema import ConfigError, resolve
from workflow_src.processes import stop_process
from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.stamp import load_config_section
from workflow_src.ranks import NODE_SERVICE_VARIABLE
from workflow_src.subjects.reward.environment import python_path
from workflow_src.subjects.reward.service import RewardService, RewardServiceStartError

URL_VARIABLE = "SPEEDPROOF_REWARD_URL"


def serve_args(reward_section: str, service: str, python: str | None, python_from: str | None) -> list[str]:
    """What follows `python` to start an equal service (its record apart): the node service of ranks.py."""
    args = ["-m", "workflow_src.subjects.reward.serve", "--reward-section", reward_section, "--service", service]
    if python:
        args += ["--python", python]
    elif python_from:
        args += ["--python-from", python_from]
    return args


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def _raise_stop(signum, frame):  # noqa: ARG001
    raise _Stop(signum)


def service_settings(section: dict, name: str) -> dict:
    services = section["services"]
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reward-section", required=True, help="results/config/reward.json")
    parser.add_argument("--service", required=True, help="name of the settings in reward.services")
    py = parser.add_mutually_exclusive_group()
    py.add_argument("--python", help="interpreter that runs gunicorn (default: this one)")
    py.add_argument("--python-from", help="reward_environment.json whose `python` runs gunicorn")
    parser.add_argument("--record", help="write the service's settings and lifetime here (JSON)")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("reward serve: the command after -- is empty")

    try:
        section = resolve("reward", load_config_section(args.reward_section)["value"])
    except ConfigError as e:
        raise SystemExit(f"reward serve: {e}") from None
    settings = service_settings(section, args.service)
    python = args.python or (python_path(json.loads(Path(args.python_from).read_text())["python"]) if args.python_from
                          else sys.executable)
    svc = RewardService(workers=settings["workers"], threads=settings["threads"],
                        omp_threads=settings["omp_threads"], python=python,
                        max_body_bytes=section["max_body_bytes"], body_timeout_s=section["body_timeout_s"],
                        header_timeout_s=section["header_timeout_s"],
                        startup_timeout_s=section["startup_timeout_s"],
                        scorer=section["scorer"] if section["kind"] == "model" else None)
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
        print(f"reward serve: service {args.service!r} ({settings['workers']} workers × {settings['threads']} "
              f"threads) at {svc.url}", file=sys.stderr, flush=True)
        node_service = {
            "args": serve_args(str(Path(args.reward_section).resolve()), args.service, args.python,
                               str(Path(args.python_from).resolve()) if args.python_from else None),
            "record": str(Path(args.record).resolve()) if args.record else None}
        child = subprocess.Popen(command, env={**os.environ, URL_VARIABLE: svc.url,
                                               NODE_SERVICE_VARIABLE: json.dumps(node_service)})
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
        if args.record:
            atomic_write_json(args.record, {
                "service": args.service, "settings": settings, "kind": section["kind"],
                "scorer": section["scorer"] if section["kind"] == "model" else None, "url": url,
                "front": svc.front_record() if url else None, "python": python,
                "gunicorn": gunicorn_version(python), "started_unix": started, "stopped_unix": time.time(),
                "command_exit_code": rc})


if __name__ == "__main__":
    sys.exit(main())
