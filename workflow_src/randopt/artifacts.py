"""Small helpers the RandOpt data CLIs share: reading the experiment's artifacts, JSON-safe numbers,
unrounded CSV text and the sha256 of the inputs a result was computed from."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workflow_src.provenance.hashing import sha256_file


class ArtifactError(RuntimeError):
    """An input artifact does not follow its contract; the message says which file and what."""


def read_json(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read JSON ({e})") from None


def read_table(path: str | Path, required: Iterable[str]) -> pd.DataFrame:
    try:
        df = pd.read_parquet(path)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read parquet ({e})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ArtifactError(f"{path}: missing columns {missing} (has {list(df.columns)})")
    return df


def input_hashes(paths: Mapping[str, str | Path | None]) -> dict[str, dict[str, str]]:
    """{name: {"path", "sha256"}} of every input given (None entries are left out)."""
    return {name: {"path": str(p), "sha256": sha256_file(p)} for name, p in sorted(paths.items()) if p is not None}


def clean(value: Any) -> Any:
    """A JSON-safe copy: numpy scalars become Python numbers, NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [clean(v) for v in value.tolist()]
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def cell_text(v: Any) -> str:
    """A value as unrounded text: floats as repr (round-trips exactly), None/NaN empty, booleans true/false."""
    v = clean(v)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def csv_text(fields: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> str:
    """A header and one row per mapping, cells as `cell_text` writes them (quoted by the csv module where needed)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(fields)
    writer.writerows([cell_text(r.get(f)) for f in fields] for r in rows)
    return buf.getvalue()


def answer_or_none(v: Any) -> str | None:
    """An extracted answer as a stripped string, or None where it is missing or empty (parquet nulls
    may come back as None, NaN or pd.NA)."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    s = str(v).strip()
    return s or None


PARQUET_META_KEY = b"speedproof"


def parquet_meta(path: str | Path) -> dict[str, Any] | None:
    """The JSON document the randopt evaluation stores in a parquet file's schema metadata (key `speedproof`),
    or None when the file carries none."""
    import pyarrow.parquet as pq
    try:
        md = pq.read_schema(path).metadata or {}
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read parquet schema ({e})") from None
    if PARQUET_META_KEY not in md:
        return None
    try:
        return json.loads(md[PARQUET_META_KEY])
    except ValueError as e:
        raise ArtifactError(f"{path}: bad speedproof metadata ({e})") from None
