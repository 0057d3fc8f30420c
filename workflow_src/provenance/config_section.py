"""Write one validated config section (a dotted path such as `checkpoint.synthetic`) to
results/config/{section}.json.

Rules depend on the section files they use instead of on the whole config, so that changing
one section reruns only what reads it (Snakemake reruns this rule when its params change).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workflow_src.provenance.atomic import atomic_write_json
from workflow_src.provenance.hashing import sha256_json


def section_document(section: str, value: Any) -> dict[str, Any]:
    return {"format": "speedproof.config-section/1", "section": section, "value": value, "sha256": sha256_json(value)}


def json_argument(value: str) -> str:
    """A JSON option's text: the value itself, or standard input's for "-"."""
    return sys.stdin.read() if value == "-" else value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--section", required=True)
    parser.add_argument("--value-json", required=True,
                        help="the section's value as JSON, or - to read it from standard input (the rule's way: a "
                             "section such as an explicit seed list is longer than one command-line argument may be)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    atomic_write_json(args.out, section_document(args.section, json.loads(json_argument(args.value_json))))


if __name__ == "__main__":
    main()
