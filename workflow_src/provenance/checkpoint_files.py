"""Verify before vouching: everything that reads or hashes a checkpoint's files goes through `verify_checkpoint`
(or `verified_checkpoint`) first: its files are checked against its MANIFEST.json (the file set, extras included,
and every sha256) before any weight is read, a log plotted or a hash recorded.

The manifest is written by the `checkpoint` rule from the files it built, copied or downloaded; a byte
flipped afterwards, a deleted file or an extra one is found here and named, with both hashes and the command
that rebuilds the checkpoint. Hashing a 15 GB checkpoint takes seconds, so the time is reported, and a file
already verified by this process is not hashed again while its inode, size and modification time are those
it had when it was hashed (any change rehashes it).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from workflow_src.provenance.hashing import sha256_file

MANIFEST_NAME = "MANIFEST.json"
FORMAT = "speedproof.checkpoint-manifest/1"



class CheckpointError(RuntimeError):
    """A checkpoint could not be obtained or did not verify; the message says which file and why."""


REBUILD = "snakemake --cores all --forcerun checkpoint"
# Snakemake marks a finished directory output with this file; it is not part of the checkpoint.
SNAKEMAKE_MARKER = ".snakemake_timestamp"

# (absolute path, device, inode, size, mtime_ns, ctime_ns) -> sha256, for files hashed by this process.
_hashed: dict[tuple, str] = {}


def _identity(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_sha256(path: Path) -> tuple[str, bool]:
    """(sha256, whether it came from this process's cache)."""
    key = _identity(path)
    if key in _hashed:
        return _hashed[key], True
    digest = sha256_file(path)
    if _identity(path) == key:  # changed while it was read: do not remember it
        _hashed[key] = digest
    return digest, False


def _listing(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*")
            if (p.is_file() or p.is_symlink()) and p.relative_to(directory).as_posix() not in
            (MANIFEST_NAME, SNAKEMAKE_MARKER)}


def verify_checkpoint(directory: str | Path, *, quiet: bool = False) -> dict[str, Any]:
    """Check `directory` against its MANIFEST.json; return the manifest, or raise CheckpointError naming each
    file that is missing, extra, linked, of another size or another sha256."""
    directory = Path(directory)
    manifest_path = directory / MANIFEST_NAME
    rebuild = f"rebuild it with `{REBUILD}`"
    if not manifest_path.is_file():
        raise CheckpointError(f"checkpoint {directory}: no {MANIFEST_NAME}, so nothing vouches for its files; {rebuild}")
    try:
        doc = json.loads(manifest_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {directory}: {manifest_path} cannot be read ({e}); {rebuild}") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if doc.get("format") != FORMAT or not isinstance(files, dict) or not files:
        raise CheckpointError(f"checkpoint {directory}: {manifest_path} is not a speedproof checkpoint manifest; "
                              f"{rebuild}")
    start = time.perf_counter()
    present = _listing(directory)
    problems, hashed_bytes, cached = [], 0, 0
    for name in sorted(files):
        want = files[name]
        path = directory / name
        if name not in present:
            problems.append(f"{name}: missing (expected sha256 {want['sha256']})")
            continue
        if path.is_symlink() or path.stat().st_nlink > 1:
            # A link shares its bytes with a file outside the checkpoint (a hub cache): editing either edits both.
            problems.append(f"{name}: a link (symbolic or hard) to bytes outside the checkpoint; checkpoints hold "
                            "copies")
            continue
        size = path.stat().st_size
        if size != want["bytes"]:
            problems.append(f"{name}: {size} bytes, expected {want['bytes']} (expected sha256 {want['sha256']})")
            continue
        digest, from_cache = file_sha256(path)
        cached += from_cache
        hashed_bytes += 0 if from_cache else size
        if digest != want["sha256"]:
            problems.append(f"{name}: sha256 {digest}, expected {want['sha256']}")
    problems += [f"{name}: not in {MANIFEST_NAME} (an extra file)" for name in sorted(present - set(files))]
    if problems:
        raise CheckpointError(f"checkpoint {directory} does not match its {MANIFEST_NAME}; {rebuild}:\n  "
                              + "\n  ".join(problems))
    if not quiet:
        seconds = time.perf_counter() - start
        print(f"checkpoint {directory}: {len(files)} files verified against {MANIFEST_NAME} "
              f"({hashed_bytes / 1e9:.2f} GB hashed in {seconds:.2f} s, {cached} from this process's cache)",
              file=sys.stderr)
    return doc


def is_checkpoint(directory: str | Path) -> bool:
    """The directory holds a checkpoint manifest (other outputs may hold a MANIFEST.json of their own format)."""
    try:
        return json.loads((Path(directory) / MANIFEST_NAME).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def verified_checkpoint(directory: str | Path) -> Path:
    """The checkpoint directory, once `verify_checkpoint` passed: what every loader hands to transformers,
    safetensors or vLLM."""
    verify_checkpoint(directory)
    return Path(directory)


def _main(argv: list[str] | None = None) -> None:
    import argparse
    parser = argparse.ArgumentParser(description="Check a checkpoint directory against its MANIFEST.json.")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    try:
        verify_checkpoint(args.directory)
    except CheckpointError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    _main()
