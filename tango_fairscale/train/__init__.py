"""The training step, its loop, checkpoints, guards and log."""
