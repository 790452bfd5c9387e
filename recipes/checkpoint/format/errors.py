"""The one error of the checkpoint format."""
from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read, with what to do about it."""
