"""The measured code of an external subject: which code each side (baseline, optimized) runs, as evidence.

A side's code lives either in a git checkout (`speedup.external.repo`) at a revision (`baseline_ref`,
`optimized_ref`: anything `git rev-parse` resolves), or, outside git, in files (`sources`: paths and globs).

- `identify` (at planning time, cheap): the side's identity: the resolved commit and its tree hash, or the
  working tree's state and a sha256 over its files. The rule that writes `results/code/{experiment}/{side}.json`
  takes it as a parameter, so Snakemake reruns that side (and only what reads its record) when it changes.
  Bad input (a revision that does not resolve, a path that is not a checkout, a dirty tree without
  `allow_dirty`, a glob that matches nothing) raises CodeError naming the key and the value.
- `prepare` (the rule's job): checks the side out in a git worktree of its own at the resolved commit (a side
  without a revision runs in the checkout as it is), hashes the measured files there, checks that the command
  takes `--steps` and `--out`, and returns the record.

    python -m workflow_src.provenance.code --side baseline --identity-json '{...}' --worktree DIR \\
        --command 'python train.py' [--check-flags] --out results/code/EXP/baseline.json
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import filelock

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.hashing import sha256_file, sha256_json

FORMAT = "speedproof.code/1"
SIDES = ("baseline", "optimized")
KEY = "speedup.external"
HELP_TIMEOUT_S = 120
HELP_TAIL_LINES = 8  # of what a failing --help printed, shown in the refusal
# What a record names of its code wherever it is cited (launch meta, speedup.json, manifest, evidence).
SUMMARY_KEYS = ("side", "kind", "repo", "ref", "commit", "tree", "state", "sources", "files_sha256")


class CodeError(ValueError):
    """Code that cannot be measured as configured; the message names the key and the value."""


def _git(repo: str | Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise CodeError(f"git {' '.join(args)} in {repo}: {e}") from None


def git_out(repo: str | Path, *args: str) -> str:
    proc = _git(repo, *args)
    if proc.returncode != 0:
        raise CodeError(f"git {' '.join(args)} in {repo} failed: {proc.stderr.strip()}")
    return proc.stdout


def checkout_root(repo: str | Path) -> Path:
    """The top of the git checkout at `repo`; CodeError when it is none."""
    where = f"{KEY}.repo: {str(repo)!r}"
    if not Path(repo).is_dir():
        raise CodeError(f"{where} is not a directory")
    proc = _git(repo, "rev-parse", "--show-toplevel")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CodeError(f"{where} is not a git checkout ({proc.stderr.strip() or 'git rev-parse failed'})")
    return Path(proc.stdout.strip()).resolve()


def resolve_commit(repo: Path, ref: str, key: str) -> str:
    proc = _git(repo, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CodeError(f"{key}: {ref!r} does not resolve to a commit in {repo}")
    return proc.stdout.strip()


def tree_of(repo: Path, commit: str) -> str:
    return git_out(repo, "rev-parse", f"{commit}^{{tree}}").strip()


def dirty_lines(repo: Path) -> list[str]:
    """`git status --porcelain` of the checkout: changed, staged and untracked (not ignored) files."""
    return [line for line in git_out(repo, "status", "--porcelain").splitlines() if line.strip()]


def checkout_files(repo: Path) -> list[str]:
    """The files of the checkout as it is: tracked and untracked-not-ignored, that exist."""
    names = git_out(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    return sorted({n for n in names if n and (repo / n).is_file()})


def commit_files(repo: Path, commit: str) -> list[str]:
    return sorted(n for n in git_out(repo, "ls-tree", "-r", "-z", "--name-only", commit).split("\0") if n)


def select(paths: Sequence[str], patterns: Sequence[str], key: str) -> list[str]:
    """The paths (POSIX, relative) matched by the patterns: a glob, or a file or directory named as it is;
    CodeError naming the pattern that matches nothing. No patterns: every path."""
    if not patterns:
        return sorted(paths)
    chosen = set()
    for pattern in patterns:
        pat = pattern.strip("/")
        hits = {p for p in paths if fnmatch.fnmatchcase(p, pat) or p.startswith(pat + "/")}
        if not hits:
            raise CodeError(f"{key}: {pattern!r} matches no file")
        chosen |= hits
    return sorted(chosen)


def source_files(patterns: Sequence[str], key: str, root: Path) -> dict[str, Path]:
    """Files outside git: each pattern a path or glob (`**` recursive), relative to `root` unless absolute;
    a directory stands for every file below it. Keyed by the path as the pattern names it."""
    if not patterns:
        raise CodeError(f"{key}: no path or glob given")
    found: dict[str, Path] = {}
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        base = pattern if os.path.isabs(pattern) else str(root / pattern)
        hits = []
        for hit in sorted(glob.glob(base, recursive=True)):
            p = Path(hit)
            hits += [q for q in sorted(p.rglob("*")) if q.is_file()] if p.is_dir() else [p] if p.is_file() else []
        if not hits:
            raise CodeError(f"{key}: {pattern!r} matches no file (relative to {root})")
        for p in hits:
            name = str(p) if os.path.isabs(pattern) else p.relative_to(root).as_posix()
            found[name] = p
    return dict(sorted(found.items()))


def files_digest(files: Mapping[str, Path]) -> dict[str, Any]:
    hashes = {name: sha256_file(path) for name, path in sorted(files.items())}
    return {"files": hashes, "files_sha256": sha256_json(hashes)}


def side_sources(ext: Mapping[str, Any], side: str) -> list[str]:
    """speedup.external.sources: a list for both sides, or {baseline: [...], optimized: [...]}."""
    sources = ext.get("sources") or []
    return list(sources.get(side) or []) if isinstance(sources, Mapping) else list(sources)


def sources_key(ext: Mapping[str, Any], side: str) -> str:
    return f"{KEY}.sources" + (f".{side}" if isinstance(ext.get("sources"), Mapping) else "")


def identify(ext: Mapping[str, Any], side: str, root: Path | None = None) -> dict[str, Any]:
    """The identity of one side's code from the config's `speedup.external` (see the module docstring)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    root = Path(root or os.getcwd())
    patterns = side_sources(ext, side)
    skey = sources_key(ext, side)
    if ext.get("repo") is None:
        if ext.get(f"{side}_ref") is not None:
            raise CodeError(f"{KEY}.{side}_ref: {ext[f'{side}_ref']!r} names a revision, but {KEY}.repo (the git "
                            "checkout it is a revision of) is not set")
        if not patterns:
            raise CodeError(f"{KEY}: name the code the {side} side runs: repo (a git checkout, with baseline_ref "
                            "and optimized_ref) or sources (its files: paths or globs)")
        digest = files_digest(source_files(patterns, skey, root))
        return {"side": side, "kind": "files", "repo": None, "ref": None, "commit": None, "tree": None,
                "state": "files", "sources": patterns, "files_sha256": digest["files_sha256"]}
    repo_value = os.path.expanduser(ext["repo"])
    repo = checkout_root(repo_value if os.path.isabs(repo_value) else root / repo_value)
    ref = ext.get(f"{side}_ref")
    if ref is not None:
        commit = resolve_commit(repo, ref, f"{KEY}.{side}_ref")
        # a glob that matches nothing is refused now, naming the side's revision it searched
        select(commit_files(repo, commit), patterns, f"{skey} ({side} side, {ref} = {commit[:12]} of {repo})")
        return {"side": side, "kind": "git", "repo": str(repo), "ref": ref, "commit": commit,
                "tree": tree_of(repo, commit), "state": "clean", "sources": patterns, "files_sha256": None}
    # No revision: the checkout as it is, which is its HEAD only when nothing is changed.
    commit = resolve_commit(repo, "HEAD", f"{KEY}.repo")
    changed = dirty_lines(repo)
    if changed and not ext.get("allow_dirty"):
        shown = "; ".join(changed[:5]) + (f"; … {len(changed) - 5} more" if len(changed) > 5 else "")
        raise CodeError(f"{KEY}.{side}_ref: null measures the checkout {repo} as it is, and it has uncommitted "
                        f"changes ({shown}); commit them and name the revision, or set {KEY}.allow_dirty: true "
                        "(`speedproof compare --allow-dirty`; every record then says dirty)")
    names = select(checkout_files(repo), patterns, f"{skey} ({side} side, the checkout {repo} as it is)")
    digest = files_digest({n: repo / n for n in names})
    return {"side": side, "kind": "git", "repo": str(repo), "ref": None, "commit": commit,
            "tree": tree_of(repo, commit), "state": "dirty" if changed else "clean", "sources": patterns,
            "files_sha256": digest["files_sha256"]}


def runs_in(identity: Mapping[str, Any], worktree: str | Path) -> str | None:
    """Where the side's command runs: its worktree (a revision), the checkout (no revision) or, for files
    outside git, the workflow's directory (None)."""
    if identity["kind"] == "files":
        return None
    return str(Path(worktree).resolve()) if identity["ref"] is not None else identity["repo"]


def worktree_lock(repo: Path) -> filelock.FileLock:
    """The lock held while a repository's worktrees change. The two sides of a pair are prepared by two jobs at
    once, and one's `git worktree prune` removes the empty `.git/worktrees` that the other's `git worktree add` is
    filling ("could not create directory of '.git/worktrees/optimized'"). It sits in the repository's common git
    directory, so workflows in other folders over the same repository take it too."""
    common = Path(git_out(repo, "rev-parse", "--git-common-dir").strip())
    return filelock.FileLock(str((common if common.is_absolute() else repo / common) / "speedproof-worktrees.lock"))


def make_worktree(repo: Path, commit: str, path: Path) -> None:
    """A detached git worktree of `repo` at `commit` (replacing one left at `path` by an earlier run)."""
    path = path.resolve()
    with worktree_lock(repo):
        if path.exists():
            _git(repo, "worktree", "remove", "--force", str(path))
            shutil.rmtree(path, ignore_errors=True)
        _git(repo, "worktree", "prune")
        path.parent.mkdir(parents=True, exist_ok=True)
        git_out(repo, "worktree", "add", "--detach", "--force", str(path), commit)
    head = git_out(path, "rev-parse", "HEAD").strip()
    if head != commit or dirty_lines(path):
        raise CodeError(f"the worktree {path} is not a clean checkout of {commit}")


def check_flags(command: str, cwd: str | None, key: str) -> str:
    """The command must take --steps and --out (the rules append them): its --help must name both."""
    prefix = f"cd {shlex.quote(cwd)} && " if cwd else ""
    try:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", f"{prefix}{command} --help"], capture_output=True,
                              text=True, timeout=HELP_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CodeError(f"{key}: {command!r} --help did not finish in {HELP_TIMEOUT_S} s") from None
    text = proc.stdout + proc.stderr
    missing = [flag for flag in ("--steps", "--out") if flag not in text]
    if proc.returncode != 0:
        # what the command said is the likeliest cause (a file that is not there, an import that fails)
        said = "\n".join(text.strip().splitlines()[-HELP_TAIL_LINES:])
        raise CodeError(f"{key}: {command!r} --help exited with status {proc.returncode}"
                        + (f"; its last words:\n{said}\n" if said else "; it printed nothing; ")
                        + f"(the check runs the command with --help in {cwd or os.getcwd()}; set {KEY}.check_flags: "
                        "false, or `speedproof compare --no-check-flags`, to skip it)")
    if missing:
        raise CodeError(f"{key}: {command!r} does not take --steps and --out (its --help does not name "
                        f"{' or '.join(missing)}); the rules run it as COMMAND [--switches ...] [--deterministic] "
                        f"--steps N --out DIR (set {KEY}.check_flags: false, or `speedproof compare "
                        "--no-check-flags`, to skip this check)")
    return "--help names --steps and --out"


def prepare(identity: Mapping[str, Any], worktree: str | Path, root: Path | None = None) -> dict[str, Any]:
    """Check the side out (where it has a revision), hash its measured files and return its record."""
    root = Path(root or os.getcwd())
    side, patterns = identity["side"], identity["sources"]
    skey = f"{KEY}.sources"
    if identity["kind"] == "files":
        digest = files_digest(source_files(patterns, skey, root))
    elif identity["ref"] is not None:
        make_worktree(Path(identity["repo"]), identity["commit"], Path(worktree))
        path = Path(worktree).resolve()
        digest = files_digest({n: path / n for n in select(checkout_files(path), patterns, skey)})
    else:
        repo = Path(identity["repo"])
        digest = files_digest({n: repo / n for n in select(checkout_files(repo), patterns, skey)})
    if identity["files_sha256"] is not None and digest["files_sha256"] != identity["files_sha256"]:
        raise CodeError(f"the {side} side's files changed between planning and this job; run again")
    record = {"format": FORMAT, **identity, "files_sha256": digest["files_sha256"], "files": digest["files"],
              "runs_in": runs_in(identity, worktree)}
    record["identity_sha256"] = sha256_json(dict(identity))
    return record


def summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a record cites of one side's code (the per-file hashes stay in results/code/)."""
    return {k: record.get(k) for k in SUMMARY_KEYS}


def describe(record: Mapping[str, Any]) -> str:
    """One line naming the code: 'commit 1a2b3c4d5e6f (tree 9f8e…, ref main, clean), files sha256 …'."""
    files = f"files sha256 {record['files_sha256'][:12]}" if record.get("files_sha256") else "files not hashed"
    if record["kind"] == "files":
        return f"{', '.join(record['sources'])} ({files})"
    ref = f"ref {record['ref']}" if record["ref"] is not None else "the checkout as it is"
    return (f"{record['repo']} at commit {record['commit'][:12]} (tree {record['tree'][:12]}, {ref}, "
            f"{record['state']}; {files})")


def load(path: str | Path) -> dict[str, Any]:
    doc = json.loads(Path(path).read_text())
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a code record (format {doc.get('format')!r})")
    return doc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--side", required=True, choices=SIDES)
    parser.add_argument("--identity-json", required=True, help="identify()'s result, as planned")
    parser.add_argument("--worktree", required=True, help="where a side with a revision is checked out")
    parser.add_argument("--command", help="the side's command, for --check-flags")
    parser.add_argument("--command-key", default=f"{KEY}.command", help="the config key of --command (messages)")
    parser.add_argument("--check-flags", action="store_true", help="refuse a command whose --help lacks "
                        "--steps or --out")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    identity = json.loads(args.identity_json)
    if identity.get("side") != args.side:
        raise SystemExit(f"code {args.side}: the identity is of side {identity.get('side')!r}")
    try:
        record = prepare(identity, args.worktree)
        if args.check_flags:
            if not args.command:
                raise SystemExit("code: --check-flags needs --command")
            record["flags_checked"] = check_flags(args.command, record["runs_in"], args.command_key)
    except CodeError as e:
        print(f"code {args.side}: refused: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    atomic_write_json(args.out, record)
    print(f"code {args.side}: {describe(record)} → {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
