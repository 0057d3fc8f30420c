"""speedproof: the logic behind the Snakemake workflow (rules stay thin and call in here)."""

# Before anything imports torch: the CPU kernel family every job computes with (its docstring says why).
from workflow_src.provenance import cpu_kernels as _cpu_kernels

_cpu_kernels.apply()
