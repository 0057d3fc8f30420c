"""Checkpoints: hub download (pinned + sha256), local directories, synthetic tiny-model pretraining, random-initialized
public shapes (timing only)."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be obtained or did not verify; the message says which file and why."""
