"""Benchmarks and GPU checks: they time and compare the product code; nothing in the product imports them."""
