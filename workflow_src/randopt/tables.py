"""RandOpt's parquet tables with metadata.

Parquet outputs carry a JSON document in their schema metadata under the key `speedproof`
(`read_meta(path)`): format, identity (what must agree between files of one run), throughput per
phase, provenance, and kind-specific fields. Tables and metadata are written atomically.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from workflow_src.provenance.atomic import atomic_write_bytes

META_KEY = b"speedproof"

_ARROW = {"int64": "int64", "int8": "int8", "float64": "float64", "str": "string", "str|null": "string"}


def write_parquet(path: str | Path, df: pd.DataFrame, meta: dict[str, Any], columns: dict[str, str]) -> Path:
    """`df`'s `columns` (name → int64 | int8 | float64 | str | str|null, in this order, nothing else) with
    `meta` as JSON under the schema metadata key `speedproof`, written atomically."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"table lacks columns {missing}")
    arrays, fields = [], []
    for name, kind in columns.items():
        values = [None if isinstance(v, float) and math.isnan(v) else v for v in df[name].tolist()]
        if kind != "str|null" and any(v is None for v in values):
            raise ValueError(f"column {name} ({kind}) has missing values")
        typ = getattr(pa, _ARROW[kind])()
        arrays.append(pa.array(values, type=typ))
        fields.append(pa.field(name, typ, nullable=kind == "str|null"))
    table = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True, allow_nan=False).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return atomic_write_bytes(path, buf.getvalue())


def read_meta(path: str | Path) -> dict[str, Any]:
    md = pq.read_schema(path).metadata or {}
    if META_KEY not in md:
        raise ValueError(f"{path}: no speedproof metadata (not written by workflow_src.randopt)")
    return json.loads(md[META_KEY])


def read_population(path: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    meta = read_meta(path)
    if meta.get("format") != "speedproof.randopt.population/1":
        raise ValueError(f"{path}: not a gathered population (format {meta.get('format')!r})")
    return pd.read_parquet(path), meta
