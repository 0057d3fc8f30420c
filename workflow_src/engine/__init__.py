"""Engines: batched generation backends behind one calling convention (prompts in, completions out)."""
