"""Errors an engine raises, imported by every engine and by the trainer's callers."""


class WeightSyncError(RuntimeError):
    """The engine's weights do not match the trainer's after a sync: the run must stop, since
    sampling from other weights than the policy's breaks the on-policy assumption silently."""
