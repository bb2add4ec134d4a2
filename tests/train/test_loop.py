"""The training loop in this process: a non-finite loss or a full disk stops it with the last
checkpoint kept, damaged checkpoints are refused in one line or fall back to the one before,
``keep_checkpoints`` keeps the newest, packing under the pipe engine is refused. The faults of a
2-process run (SIGKILL, SIGTERM, Ctrl-C, a dead or hung rank, a damaged rank file) are
``tests/integration/train/test_faults.py``; the speed options' and bf16's parity with DDP
``tests/integration/train/test_parity_loop.py``."""

import json
import logging
import os
from pathlib import Path

import pytest
import torch
from conftest import assert_same_weights
from helpers.checkpoints import damages
from helpers.parity import RunSpec, define, trains


def test_a_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(
    tmp_path, tiny_model_dir, piqa_small
) -> None:
    from conftest import train_in

    from tango_fairscale.train.guards import NonFiniteLossError

    # lr 1e6 drives an fp32 run to inf/NaN within a few steps.
    with pytest.raises(NonFiniteLossError) as error:
        train_in(
            tmp_path,
            tiny_model_dir,
            piqa_small,
            "tango_fairscale::ddp",
            1,
            20,
            optimizer={"type": "torch::AdamW", "lr": 1e6},
            max_grad_norm=None,
        )
    message = str(error.value)
    assert "non-finite loss at step" in message and "training examples" in message
    assert "\n" not in message
    first_bad = int(message.split("non-finite loss at step ")[1].split()[0])
    latest = tmp_path / "checkpoints" / "latest"
    if first_bad > 5:  # a checkpoint from before the failure exists and is intact
        assert int(latest.read_text()[4:]) < first_bad
    else:
        assert not latest.exists()
    assert not (tmp_path / "final_weights.pt").exists()


@pytest.mark.parametrize(
    "scaled, losses, fails_at",
    [
        (False, [1.0, 1.0, float("nan"), 1.0], 3),
        (True, [1.0] + [float("inf")] * 10 + [1.0], None),  # the scaler skips up to 10 in a row
        (True, [1.0] + [float("nan")] * 11 + [1.0], 2),
    ],
)
def test_non_finite_guard(scaled, losses, fails_at) -> None:
    """The guard raises on the step the run breaks (naming the first bad step), not later."""
    from tango_fairscale.data.schedules import BatchSchedule
    from tango_fairscale.train.guards import NonFiniteGuard, NonFiniteLossError

    guard = NonFiniteGuard(scaled, BatchSchedule(100, 4, seed=0).global_batch, vocab_size=1000)
    breaks_at = None if fails_at is None else fails_at + guard.bound
    for step, loss in enumerate(losses, start=1):
        if step == breaks_at:
            with pytest.raises(NonFiniteLossError, match=f"at step {fails_at} "):
                guard.observe(step, loss)
            return
        guard.observe(step, loss)
    assert fails_at is None


class Payload:
    """Unpickling this runs ``touch MARKER``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


#: ``train_in``'s first 5 steps (one process), whose checkpoint the damage tests damage.
FIVE_STEPS = define(
    "ddp/five-steps-one-process",
    RunSpec("ddp", 1, train_steps=5, checkpoint_every=5, validate=False),
)


@trains(FIVE_STEPS)
@pytest.mark.parametrize(
    "damage", ["truncated", "malicious", "wrong-shape", "forged-malicious", "forged-wrong-shape"]
)
def test_a_damaged_checkpoint_is_refused_in_one_line(
    damage, trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """With no earlier checkpoint to fall back to. ``forged-``: the manifest rewritten to match
    the files, so that the loaders themselves refuse them."""
    import shutil

    from conftest import train_in
    from helpers.checkpoints import reseal
    from tango.common.exceptions import ConfigurationError

    from tango_fairscale.model.causal_lm import ModelWrapper

    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", tmp_path / "checkpoints")
    state_file = tmp_path / "checkpoints" / "step0000005" / "rank0.pt"
    marker = tmp_path / "payload-ran"
    if damage == "truncated":
        state_file.write_bytes(state_file.read_bytes()[:1000])
    elif damage.endswith("malicious"):
        torch.save({"model": Payload(marker)}, state_file)
    else:  # a checkpoint of another model: wider embeddings
        other = tmp_path / "other-model"
        from conftest import save_tiny_gpt2, shared_data_dir

        save_tiny_gpt2(other, shared_data_dir() / "gpt2-tokenizer", n_embd=64)
        state = torch.load(state_file, weights_only=True)
        state["model"] = ModelWrapper(str(other)).state_dict()
        torch.save(state, state_file)
    if damage.startswith("forged"):
        reseal(state_file.parent)
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 10)
    message = str(error.value)
    assert "\n" not in message
    assert f"checkpoint {state_file.parent} cannot be loaded" in message
    if not damage.startswith("forged"):
        assert "(rank0.pt: " in message and "it is damaged" in message
    assert not marker.exists()  # the payload never ran


@trains(FIVE_STEPS)
def test_a_checkpoint_without_manifest_is_refused_in_one_line(
    trained_run, tmp_path, tiny_model_dir, piqa_small
) -> None:
    """A checkpoint written before checkpoints carried a manifest: nothing can verify it."""
    import shutil

    from conftest import train_in
    from tango.common.exceptions import ConfigurationError

    shutil.copytree(trained_run(FIVE_STEPS).work_dir / "checkpoints", tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / "step0000005" / "manifest.json").unlink(missing_ok=True)
    with pytest.raises(ConfigurationError) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 10)
    message = str(error.value)
    assert "\n" not in message and "step0000005 has no manifest" in message
    assert f"delete {tmp_path / 'checkpoints'} to start this step over" in message


def fallback_run(engine: str) -> str:
    """20 steps on one process, as ``train_in`` runs them (checkpoints every 5, validation every
    10), keeping the default 2 checkpoints: steps 15 and 20."""
    spec = RunSpec(engine, 1, train_steps=20, validate_every=10, checkpoint_every=5)
    return define(f"{engine}/20-steps-one-process", spec)


FALLBACK = {engine: fallback_run(engine) for engine in ("fairscale", "fsdp2")}


@pytest.mark.parametrize(
    "engine, file, damage",
    [
        pytest.param(engine, file, damage, marks=trains(FALLBACK[engine]))
        for engine, file, damage in [
            ("fairscale", "rank0.pt", "same-size"),
            ("fairscale", "rank0.pt", "of step 15"),
            ("fairscale", "rank0.pt", "of another run"),
            ("fsdp2", "__0_0.distcp", "same-size"),
            ("fsdp2", "__0_0.distcp", "truncated"),
            ("fsdp2", "trainer.pt", "same-size"),
        ]
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(
    engine, file, damage, trained_run, tmp_path, tiny_model_dir, piqa_small, caplog
) -> None:
    """The newest checkpoint (step 20) damaged: the rerun says so, resumes from step 15 and ends
    with the uninterrupted run's weights."""
    import shutil

    from conftest import train_in

    reference = trained_run(FALLBACK[engine])
    shutil.copytree(reference.work_dir / "checkpoints", tmp_path / "checkpoints")
    kept = sorted(path.name for path in (tmp_path / "checkpoints").glob("step*"))
    do, problem = damages()[damage]
    do(tmp_path / "checkpoints" / "step0000020" / file)
    with caplog.at_level(logging.WARNING):
        train_in(tmp_path, tiny_model_dir, piqa_small, f"tango_fairscale::{engine}", 1, 20)
    said = [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"checkpoint step0000020 is damaged ({file}: ")
    assert problem in said[0] and said[0].endswith("; resuming from step0000015"), said
    state = torch.load(tmp_path / "final_weights.pt", weights_only=True)
    assert_same_weights(reference.state_dict(), state)
    raw = (tmp_path / "training_log.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, raw) if "train_loss" in r] == list(range(16, 21))
    assert kept == ["step0000015", "step0000020"]  # keep_checkpoints' default: 2


def test_keep_checkpoints_keeps_the_newest(
    tmp_path, tiny_model_dir, piqa_small, monkeypatch
) -> None:
    """Checkpoints every 5 of 20 steps, ``keep_checkpoints: 3``: steps 10, 15 and 20 stay while
    the run trains (once it finished, the step keeps the last alone: ``tests/train/
    test_step.py``, here kept from running). The setting is not part of the cache key."""
    from conftest import train_tiny

    import tango_fairscale.train.step as step_module

    monkeypatch.setattr(step_module, "give_back_work_dir", lambda *args: None)
    train_tiny(tmp_path, tiny_model_dir, piqa_small, step_options={"keep_checkpoints": 3})
    [checkpoints] = tmp_path.glob("cache/*/work/checkpoints")
    kept = sorted(path.name for path in checkpoints.glob("step*"))
    assert kept == ["step0000010", "step0000015", "step0000020"]
    assert (checkpoints / "latest").read_text() == "step0000020"
    assert not list(checkpoints.glob(".partial-*"))
    # The same step with another keep_checkpoints: already done, nothing trains.
    train_tiny(tmp_path, tiny_model_dir, piqa_small, step_options={"keep_checkpoints": 1})
    assert sorted(path.name for path in checkpoints.glob("step*")) == kept


def test_a_full_disk_keeps_the_previous_checkpoint(
    tmp_path, tiny_model_dir, piqa_small, monkeypatch
) -> None:
    import errno

    from conftest import train_in

    from tango_fairscale.train.checkpoints import TrainingStopped

    save = torch.save

    def save_until_the_disk_is_full(obj, path, *args, **kwargs):
        if "step0000010" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_the_disk_is_full)
    with pytest.raises(TrainingStopped) as error:
        train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 20)
    message = str(error.value)
    assert "writing checkpoint step0000010 failed" in message and "No space left" in message
    assert "resume from checkpoint step0000005" in message and "\n" not in message
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step0000005"

    monkeypatch.setattr(torch, "save", save)  # space again: the rerun resumes at step 5
    train_in(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::ddp", 1, 20)
    raw = (tmp_path / "training_log.jsonl").read_text().splitlines()
    steps = [r["step"] for r in map(json.loads, raw) if "train_loss" in r]
    assert steps.count(5) == 1 and steps.count(6) == 2 and steps[-1] == 20
    assert not list((tmp_path / "checkpoints").glob(".partial-*"))


def test_packing_with_the_pipe_engine_is_refused(tmp_path, tiny_model_dir, piqa_small) -> None:
    from conftest import train_tiny
    from tango.common.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match="pack_sequences needs an engine .* set pack_seq"):
        train_tiny(
            tmp_path,
            tiny_model_dir,
            piqa_small,
            "tango_fairscale::pipe",
            step_options={"pack_sequences": True},
            pipe={"balance": [1, 1], "chunks": 2, "devices": ["cpu", "cpu"]},
        )
