"""Checkpoints: hub download (pinned + sha256), local directories, synthetic tiny-model pretraining, random-initialized
public shapes (timing only)."""

# The error is defined where checkpoints are verified (provenance.checkpoint_files, below this layer).
from workflow_src.provenance.checkpoint_files import CheckpointError

__all__ = ["CheckpointError"]
