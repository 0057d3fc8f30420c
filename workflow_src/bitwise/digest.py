"""Bit-exact encodings for the bitwise comparison (docs/design.md §6, docs/bitwise.md).

Tensor digest: sha256 over the dtype name, the shape and the raw little-endian bytes of the contiguous
tensor. Scalars: the exact hex of their IEEE-754 bits (float32 as 8 hex digits, float64 as 16), so two records
are equal exactly when the bits are.

The definitions live in `records_writer.py`, the one file an external subject imports or copies, so the
built-in subject and external ones cannot drift apart; this module keeps the workflow's imports stable.
"""

from workflow_src.bitwise.records_writer import scalar_hex, tensor_digest

__all__ = ["scalar_hex", "tensor_digest"]
