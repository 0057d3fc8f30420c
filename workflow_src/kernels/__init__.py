"""Operators of the fast paths, each beside its torch reference, and the operator-check receipt.

An operator module defines the fast implementation, the reference it must reproduce bit for bit
(transformers' own module where one exists), and `cases(scale, device)`: the grid it is checked on.
GPU Triton kernels join the same registry (`registry.py`) and the same receipt.
"""
