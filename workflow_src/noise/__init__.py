"""The weight-noise definitions shared by the perturbation kernel, the engines and RandOpt (docs/randopt-noise.md)."""
