"""Checkpoints: asynchronous DCP saves (`saver`), completion markers that tell a whole checkpoint
from a partial one (`markers`), the registry of finished checkpoints, resume from the newest whole
one, and holds that keep a checkpoint a pending proposal needs."""
