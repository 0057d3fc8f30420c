"""Operators of the fast paths, each beside its torch reference.

An operator module defines the fast implementation, the reference it must reproduce bit for bit
(transformers' own module where one exists), and `cases(scale, device)`: the grid it is checked on. The
registry of operators and the operator-check receipt that runs them live in the bitwise family
(`workflow_src/bitwise/operators.py`, `workflow_src/bitwise/operator_receipt.py`); GPU Triton kernels join the
same registry and the same receipt.
"""
