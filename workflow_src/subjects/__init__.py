"""The subjects the protocol measures and compares: the RL post-training step and its reward service."""
