"""The FSDP2 engine reads its checkpoints through allow-lists. Its parity with DDP and its resumes
on another number of processes are ``tests/integration/parallel/test_parity_fsdp2.py``."""

from pathlib import Path

import pytest
from conftest import train_in
from helpers.parity import RunSpec, define, trains


class Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


#: ``train_in``'s first 5 steps on one process, whose checkpoint the test plants a payload in.
FIVE_STEPS = define(
    "fsdp2/five-steps-one-process",
    RunSpec("fsdp2", 1, train_steps=5, checkpoint_every=5, validate=False),
)


@trains(FIVE_STEPS)
@pytest.mark.parametrize("payload", ["pickled-class", "dotted-global", "byte-entry"])
def test_malicious_checkpoint_files_are_refused(
    payload, trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """torch.distributed.checkpoint reads its metadata with plain pickle and its non-tensor
    entries with ``torch.load(weights_only=False)``: the engine reads both through allow-lists,
    so a planted payload never runs — a pickled class, a dotted name under an allowed module
    (``torch.distributed.checkpoint.metadata`` / ``os.system``), an optimizer entry. The manifest
    is forged to match the planted files (a digest proves integrity, not intent)."""
    import pickle
    import shutil

    from helpers.checkpoints import reseal
    from helpers.hostile_pickles import calling_pickle, plant_byte_entry
    from tango.common.exceptions import ConfigurationError

    work = tmp_path / "run"
    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", work / "checkpoints")
    checkpoint = work / "checkpoints" / "step0000005"
    marker = tmp_path / "payload-ran"
    if payload == "pickled-class":
        (checkpoint / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    elif payload == "dotted-global":
        dotted = calling_pickle("torch.distributed.checkpoint.metadata", "os.system", marker)
        (checkpoint / ".metadata").write_bytes(dotted)
    else:
        key = "optimizer.param_groups.0.lr"
        plant_byte_entry(checkpoint, key, calling_pickle("os", "system", marker))
    reseal(checkpoint)
    with pytest.raises(ConfigurationError, match=f"checkpoint {checkpoint} cannot be loaded"):
        train_in(work, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", 1, 10)
    assert not marker.exists()
