"""Atomic outputs: a killed job must leave nothing that looks finished.

Files are written to a temporary sibling and renamed into place; directories are built
under a temporary sibling name and renamed as a whole once complete.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Pretty, sorted JSON (stable bytes for the same value) written atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def _short_host() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class BuildInProgress(RuntimeError):
    """Another live process on this host is building the same output; the message names it."""


def _builder(path: Path, pid: int) -> psutil.Process | None:
    """The live process `pid` that made the staging directory `path`: started before the directory last changed
    (a later process that reuses the pid is not its builder)."""
    try:
        proc = psutil.Process(pid)
        return proc if proc.create_time() <= path.stat().st_mtime + 1.0 else None
    except (psutil.Error, OSError):
        return None


def _staging_dirs(final: Path) -> Iterator[tuple[Path, int | None]]:
    """This host's (or host-less) staging and old-copy directories of `final`, with the pid their name holds."""
    host = _short_host()
    for path in final.parent.glob(f".{glob.escape(final.name)}.*"):
        rest = path.name[len(final.name) + 2:]
        if not path.is_dir() or path == final:
            continue
        m = re.fullmatch(r"(?:(?P<host>[^.]+)-(?P<pid>[0-9]+)\..*\.staging|old-(?P<oldpid>[0-9]+)|[^.]*\.staging)", rest)
        if not m:
            continue
        pid = m.group("pid") or m.group("oldpid")
        if m.group("host") not in (None, host):
            continue
        yield path, None if pid is None else int(pid)


def remove_stale_staging(final: str | Path) -> list[Path]:
    """Remove what killed earlier builds of `final` left beside it: `.NAME.<host>-<pid>.*.staging` directories
    and `.NAME.old-<pid>` copies whose process on this host is gone (or whose name predates the pid in it).

    A directory of a build still running (its pid alive) or made on another host (a shared file system) is
    left alone (`live_builds` names the first kind)."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    removed = []
    for path, pid in _staging_dirs(final):
        if pid is not None and _builder(path, pid) is not None:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def live_builds(final: str | Path) -> list[str]:
    """Other live processes on this host building `final` (each as "pid N (command)")."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    found = []
    for path, pid in _staging_dirs(final):
        proc = None if pid is None or pid == os.getpid() else _builder(path, pid)
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                found.append(f"pid {pid} ({' '.join(proc.cmdline())[:300]}), staging {path.name}")
    return found


@contextlib.contextmanager
def atomic_directory(final: str | Path) -> Iterator[Path]:
    """Yield an empty staging directory; on success it becomes `final`, on error it is removed.

    An existing `final` is replaced only after the new one is complete. Staging directories left by killed
    earlier builds of `final` are removed first (`remove_stale_staging`); while another live process on this
    host builds `final` (one orphaned by a killed snakemake, say) it refuses with BuildInProgress, naming it.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    live = live_builds(final)
    if live:
        raise BuildInProgress(f"{final} is being built by another live process: {'; '.join(live)}; stop it or "
                              "wait for it to end")
    for path in remove_stale_staging(final):
        print(f"removed {path}, left by a killed earlier build of {final}", file=sys.stderr)
    prefix = f".{final.name}.{_short_host()}-{os.getpid()}."
    staging = Path(tempfile.mkdtemp(prefix=prefix, suffix=".staging", dir=final.parent))
    os.chmod(staging, 0o777 & ~_umask())
    try:
        yield staging
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
