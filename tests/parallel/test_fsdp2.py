"""The FSDP2 engine reproduces DDP, and its checkpoints resume on another number of processes."""

import json
from pathlib import Path

import pytest
import torch
from conftest import assert_same_training, train_in, train_tiny


@pytest.mark.parametrize(
    "sharding",
    [
        {},
        {"activation_checkpointing": True, "cpu_offload": True},
        # Checkpointed modules need not be units (the fairscale engine refuses these two).
        {"activation_checkpointing": [r"model\.transformer\.h\.[0-9]+\.attn"]},
        {"modules_to_wrap": [], "activation_checkpointing": [r"model\.transformer\.h\.[0-9]+"]},
    ],
    ids=["per-block", "checkpointing+offload", "checkpointing-inside-units", "one-unit"],
)
def test_fsdp2_matches_ddp(sharding, ddp_reference, tmp_path, tiny_model_dir, piqa_small) -> None:
    trained = train_tiny(
        tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", 2, sharding=sharding
    )
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())


def read_run(work_dir: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    from tango_fairscale.train.log import read_training_log

    state = torch.load(work_dir / "final_weights.pt", weights_only=True)
    return read_training_log(work_dir / "training_log.jsonl"), state


@pytest.mark.parametrize("first, second", [(2, 1), (1, 2)], ids=["2-then-1", "1-then-2"])
def test_resume_on_another_device_count(
    first, second, ddp_reference, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """Save at step 10 on ``first`` processes, resume to step 20 on ``second``: the losses
    continue where they stopped and the run ends where an uninterrupted one does."""
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", first, 10)
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000010"
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", second, 20)
    log, state = read_run(tmp_path)
    raw = [json.loads(line) for line in (tmp_path / "training_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in raw if "train_loss" in r] == list(range(1, 21))  # no replay
    assert_same_training(ddp_reference, log, state)


def test_compiled_units_match_ddp(ddp_reference, tmp_path, tiny_model_dir, piqa_small) -> None:
    """``compile: true`` (torch.compile per block, before sharding) changes speed, not results."""
    trained = train_tiny(
        tmp_path,
        tiny_model_dir,
        piqa_small,
        "tango_fairscale::fsdp2",
        1,
        sharding={"compile": True},
    )
    assert_same_training(ddp_reference, trained.training_log, trained.state_dict())


class Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_metadata_is_refused(tmp_path, tiny_model_dir, piqa_small) -> None:
    """torch.distributed.checkpoint reads its metadata with plain pickle: the engine checks it
    with an allow-list first, so a planted payload never runs."""
    import pickle

    from tango.common.exceptions import ConfigurationError

    work = tmp_path / "run"
    train_in(work, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", 1, 5)
    metadata = work / "checkpoints" / "step0000005" / ".metadata"
    marker = tmp_path / "payload-ran"
    metadata.write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ConfigurationError, match="is not part of a distributed checkpoint"):
        train_in(work, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2", 1, 10)
    assert not marker.exists()
