"""Processes: the process group, spawning and signals, torchrun / SLURM launchers."""
