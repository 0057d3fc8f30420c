"""The `speedproof` command: the packaged workflow run by Snakemake in the current directory (results/ lands here).

    speedproof run [TARGET ...] [--configfile FILE ...] [--cores N] [-n] [-- SNAKEMAKE_ARGS ...]
    speedproof compare --repo PATH --baseline REV [--optimized REV] --command 'python train.py' \\
        (--control-switches NAME ... | --control-command CMD | --no-control) [--experiment NAME] \\
        [--warmup N --windows N --window-steps N --repeats N|auto --bitwise-steps N --ranks N --allow-dirty] \\
        [--no-check-flags] [--require-counts] [-n]
    speedproof report [--configfile FILE ...] [--out results/report/EXP.html]

`compare` writes the config of a user's own pair, `speedproof-{experiment}.yaml` (run it again with
`speedproof run pair --configfile speedproof-{experiment}.yaml`), and runs the target `pair`: each revision in a
git worktree of its own, launches A → opt → B, the deterministic runs (the baseline twice, the optimized side, the
negative control), the comparison, manifest, summary and report text, none of the embedded model; it ends by
printing the verdict (exit status 0, or 3 with `--require-counts` where the verdict does not count); with `-n` it
plans and writes nothing.
`--optimized` left out measures the checkout as it is (with `--allow-dirty` when it has uncommitted changes; every
record then says dirty).
`report` without `--configfile` reports the pair whose `speedproof-*.yaml` is the one in this directory.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from snakemake.utils import update_config

from workflow_src.config_checks import validated
from workflow_src.config_schema import PACKAGE_DIR, WORKFLOW_DIR, ConfigError
from workflow_src.jobs.external import pair_claim

REPORT_CSS = PACKAGE_DIR / "report" / "report.css"  # the landing view from the top (workflow_src/report/report.css)
# Snakemake 9's report step warns once per rule that its default disk resource's coroutine was never awaited
# (snakemake/snakemake#4280, open; harmless): that one warning is silenced, no other (the Makefile does the same).
REPORT_WARNING = "ignore:coroutine 'InputFiles._predicated_size_files:RuntimeWarning"


def snakefile() -> Path:
    return WORKFLOW_DIR / "Snakefile"


def snakemake(args: list[str], configfiles: list[str], cores: str, dry_run: bool, report: bool = False) -> int:
    """Snakemake on the packaged workflow, in the current directory; its exit status."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile()), "--directory", os.getcwd(), "--cores", cores,
           *args]
    if dry_run:
        cmd.append("-n")
    # The Snakefile's own config/config.yaml is the working directory's, which a clone has and this directory
    # does not: without config files of the user's, the embedded default's, from the package.
    configfiles = configfiles or [str(WORKFLOW_DIR / "config" / "config.yaml")]
    cmd += ["--configfile", *[str(Path(f).resolve()) for f in configfiles]]  # last: the flag takes every word after it
    print("speedproof: " + " ".join(cmd[2:]), file=sys.stderr, flush=True)
    env = dict(os.environ)
    if report:
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), REPORT_WARNING]))
    return subprocess.call(cmd, env=env)


def experiment_name(repo: str) -> str:
    """A plain experiment name from the repo's directory name: pair_<name>."""
    return re.sub(r"[^A-Za-z0-9_]", "_", f"pair_{Path(repo).resolve().name}")


def compare_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config of `speedproof compare`: one external comparison of two revisions and its bitwise runs."""
    external: dict[str, Any] = {"repo": str(Path(args.repo).resolve()), "baseline_ref": args.baseline,
                                "optimized_ref": args.optimized, "command": args.command}
    if args.allow_dirty:
        external["allow_dirty"] = True
    if args.no_check_flags:
        external["check_flags"] = False
    if args.ranks is not None:
        external["ranks"] = args.ranks
    if args.sources:
        external["sources"] = args.sources
    experiment = args.experiment or experiment_name(args.repo)
    # the comparison's launches live in results/speedup/<comparison>/: named after the experiment by default, so
    # a second pair run in the same directory does not take the first one's
    comparison = args.comparison or experiment
    speedup: dict[str, Any] = {"comparisons": {comparison: {"subject": "external"}}, "external": external}
    for key in ("warmup", "windows", "window_steps", "repeats", "mode"):
        value = getattr(args, key)
        if value is not None:
            speedup[key] = value if key != "repeats" or value == "auto" else int(value)
    # the baseline twice: a side that does not repeat its own bits cannot vouch for the optimized side's
    runs: dict[str, Any] = {"baseline": {"subject": "external", "impl": "baseline"},
                            "baseline_repeat": {"subject": "external", "impl": "baseline"},
                            "optimized": {"subject": "external", "impl": "optimized"}}
    if args.control_switches:
        runs["control"] = {"subject": "external", "impl": "optimized", "switches": args.control_switches,
                           "expect": "fail"}
    elif args.control_command:
        runs["control"] = {"subject": "external", "impl": "optimized", "command": args.control_command,
                           "expect": "fail"}
    bitwise: dict[str, Any] = {"runs": runs}
    if args.bitwise_steps is not None:
        bitwise["steps"] = args.bitwise_steps
    return {"experiment": experiment, "speedup": speedup, "bitwise": bitwise}


def pair_settings(config: dict[str, Any], directory: Path | None = None) -> tuple[dict[str, Any], str]:
    """`config` over the directory's own config/config.yaml (where it has one, as the Snakefile reads it), with the
    schema's defaults filled in, and what the workflow would refuse in it: empty when nothing."""
    base = (directory or Path.cwd()) / "config" / "config.yaml"
    merged = yaml.safe_load(base.read_text()) or {} if base.is_file() else {}
    update_config(merged, copy.deepcopy(config))
    try:
        validated(merged)
    except ConfigError as e:
        return merged, str(e)
    return merged, ""


def cmd_run(args: argparse.Namespace, rest: list[str]) -> int:
    return snakemake(args.targets + rest, args.configfile, args.cores, args.dry_run)


def cmd_compare(args: argparse.Namespace, rest: list[str]) -> int:
    if not (args.control_switches or args.control_command or args.no_control):
        raise SystemExit("speedproof compare: name a negative control, a change that must break the bits "
                         "(--control-switches NAME: the optimized command given --switches NAME; or "
                         "--control-command CMD), or pass --no-control (then no comparison counts)")
    config = compare_config(args)
    settings, problems = pair_settings(config)
    if problems:
        raise SystemExit(f"speedproof compare: the pair's config is refused, and nothing was written: {problems}")
    if args.dry_run:  # plan only: the config the run would write, in a file of its own removed afterwards
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"speedproof-{config['experiment']}.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            return snakemake(["pair", *rest], [str(path)], args.cores, True)
    path = Path(args.config_out or f"speedproof-{config['experiment']}.yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    print(f"speedproof compare: config written to {path} (again: speedproof run pair --configfile {path})",
          file=sys.stderr)
    rc = snakemake(["pair", *rest], [str(path)], args.cores, False)
    if rc:
        return rc
    counts, text = verdict(Path.cwd(), config)
    print(f"speedproof compare: {text}\n  (results/summary/{config['experiment']}.md; its record "
          f"results/evidence/{pair_claim(settings)}/record.json)", file=sys.stderr)
    return EXIT_DOES_NOT_COUNT if args.require_counts and not counts else 0


# `compare --require-counts`: the run went well and its verdict does not count (a script or CI can gate on it)
EXIT_DOES_NOT_COUNT = 3


def verdict(directory: Path, config: dict[str, Any]) -> tuple[bool, str]:
    """Whether the pair's verdict counts, and its line (comparison, verdict, headline) from its speedup.json."""
    comparison = next(iter(config["speedup"]["comparisons"]))
    doc = json.loads((directory / "results" / "speedup" / comparison / "speedup.json").read_text())
    return bool(doc["verdict"]["counts"]), f"{comparison}: {doc['verdict']['text']}: {doc['headline']['text']}"


def pair_configs(directory: Path) -> list[str]:
    """The config `compare` wrote in this directory, where there is exactly one; none: the embedded default's."""
    found = sorted(str(p.name) for p in directory.glob("speedproof-*.yaml"))
    if len(found) > 1:
        raise SystemExit(f"speedproof report: {len(found)} pairs' configs here ({', '.join(found)}); name one with "
                         "--configfile")
    return found


def cmd_report(args: argparse.Namespace, rest: list[str]) -> int:
    if not args.configfile:
        args.configfile = pair_configs(Path.cwd())
        if args.configfile:
            print(f"speedproof report: the pair of {args.configfile[0]}", file=sys.stderr)
    configs = [yaml.safe_load(Path(f).read_text()) or {} for f in args.configfile]
    experiment = next((c["experiment"] for c in reversed(configs) if "experiment" in c), "default")
    out = args.out or f"results/report/{experiment}.html"
    return snakemake(["--report", out, "--report-stylesheet", str(REPORT_CSS), *rest], args.configfile, args.cores,
                     False, report=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speedproof", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command_name", required=True)

    def common(p: argparse.ArgumentParser, configfile: bool = True) -> None:
        if configfile:
            p.add_argument("--configfile", nargs="+", default=[], help="config files over config/config.yaml")
        p.add_argument("--cores", default="all", help="Snakemake's --cores (default: all)")
        p.add_argument("-n", "--dry-run", action="store_true", help="plan only")

    run = sub.add_parser("run", help="run targets of the workflow (default: all)")
    run.add_argument("targets", nargs="*")
    common(run)
    run.set_defaults(func=cmd_run)

    cmp = sub.add_parser("compare", help="a user's own pair: two revisions of one git repo, A → opt → B + bitwise")
    cmp.add_argument("--repo", required=True, help="the git checkout")
    cmp.add_argument("--baseline", required=True, help="the baseline's git revision")
    cmp.add_argument("--optimized", help="the optimized git revision (default: the checkout as it is)")
    cmp.add_argument("--command", required=True,
                     help="the shell command of both sides, run in each side's worktree; the rules append "
                          "[--switches ...] [--deterministic] --steps N --out DIR")
    ctl = cmp.add_mutually_exclusive_group()
    ctl.add_argument("--control-switches", nargs="+", help="the negative control: the optimized command with these "
                                                            "--switches, which must change the bits")
    ctl.add_argument("--control-command", help="the negative control's own command (run in the optimized worktree)")
    ctl.add_argument("--no-control", action="store_true", help="no negative control (no comparison then counts)")
    cmp.add_argument("--experiment", help="the experiment's name (default: pair_<repo directory>)")
    cmp.add_argument("--comparison", help="the comparison's name (results/speedup/NAME/; default: the experiment's)")
    cmp.add_argument("--sources", nargs="+", help="the files of each side that are hashed (default: all)")
    cmp.add_argument("--allow-dirty", action="store_true", help="measure a checkout with uncommitted changes")
    cmp.add_argument("--ranks", type=int, help="the ranks every launch's step log must hold (default: those it holds)")
    cmp.add_argument("--no-check-flags", action="store_true",
                     help="skip the check that the command's --help names --steps and --out")
    cmp.add_argument("--warmup", type=int)
    cmp.add_argument("--windows", type=int)
    cmp.add_argument("--window-steps", type=int)
    cmp.add_argument("--repeats", help="triples: a number, or auto")
    cmp.add_argument("--mode", choices=["production", "deterministic"])
    cmp.add_argument("--bitwise-steps", type=int)
    cmp.add_argument("--config-out", help="where the config is written (default: speedproof-EXPERIMENT.yaml)")
    cmp.add_argument("--require-counts", action="store_true",
                     help=f"exit {EXIT_DOES_NOT_COUNT} when the verdict does not count (default: 0 once the run "
                          "went well)")
    common(cmp, configfile=False)
    cmp.set_defaults(func=cmd_compare)

    rep = sub.add_parser("report", help="the Snakemake report of an experiment (its verdicts only)")
    rep.add_argument("--out", help="default: results/report/EXPERIMENT.html")
    common(rep)
    rep.set_defaults(func=cmd_report)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:  # what follows goes to Snakemake as it is
        rest = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    args = build_parser().parse_args(argv)
    raise SystemExit(args.func(args, rest))


if __name__ == "__main__":
    main()
