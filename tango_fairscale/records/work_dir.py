"""The file names of a training step's work directory (``cache/<step id>/work`` in a local
workspace), for every package that writes or reads them; pure Python.

The training processes write them (``train/``), the step stores the log and run info beside its
result, ``results`` reads them, ``clean`` and export find checkpoints by them."""

#: The consolidated model rank 0 leaves for the launching process (deleted once the step's result
#: is stored: :mod:`.retention`).
FINAL_WEIGHTS = "final_weights.pt"
#: The checkpoint directory (:mod:`.checkpoints`' protocol).
CHECKPOINTS = "checkpoints"
#: The training log: JSON lines ``{"step": ..., <metric>: ...}`` (``records/training_log.py``).
TRAINING_LOG = "training_log.jsonl"
#: What the run resolved (the precision behind ``auto``, devices, global batch), e.g.
#: ``{"precision": "bf16-mixed", "device": "cuda"}``; ``results`` reads it when present.
RUN_INFO = "run_info.json"
