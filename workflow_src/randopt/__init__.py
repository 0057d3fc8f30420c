"""RandOpt (docs/design.md §7): a population of Rademacher-perturbed copies of a model, W = W0 + σ·R(seed, i),
selected by train reward and combined by majority vote.

`noise.py` is the specification of the noise (hash, sign convention, parameter index layout, dtype
handling and rounding, population seeds) and its torch reference; the fused Triton reconstruct kernel
that must reproduce it bit for bit is `workflow_src/kernels/perturb.py`. The written spec with test
vectors is docs/randopt-noise.md. `plan` gives the rules (rules/randopt.smk) their inputs and outputs.
"""
