"""speedproof: the logic behind the Snakemake workflow (rules stay thin and call in here)."""
