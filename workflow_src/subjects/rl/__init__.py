"""The built-in RL subject: a GRPO-style post-training step with a baseline and an optimized trainer."""
