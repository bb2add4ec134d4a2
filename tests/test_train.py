"""The training loop: crash safety and resumption, on 2 CPU processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tango_fairscale.model import ModelWrapper

TRAIN = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from conftest import train_tiny
from tango_fairscale.data import read_piqa
train_tiny(Path({workspace!r}), Path({model!r}), read_piqa(Path({piqa!r}), limit=64),
           "tango_fairscale::fairscale", 2, train_steps={steps})
"""


def train_command(workspace: Path, model: Path, piqa: Path, steps: int) -> list[str]:
    code = TRAIN.format(
        tests=str(Path(__file__).parent),
        workspace=str(workspace),
        model=str(model),
        piqa=str(piqa),
        steps=steps,
    )
    return [sys.executable, "-c", code]


def latest_checkpoint(workspace: Path) -> str | None:
    for latest in workspace.glob("cache/*/work/checkpoints/latest"):
        return latest.read_text().strip()
    return None


def test_sigkill_then_rerun_resumes_and_matches(tmp_path, tiny_model_dir, piqa_dir) -> None:
    steps = 40
    interrupted, uninterrupted = tmp_path / "interrupted", tmp_path / "uninterrupted"
    command = train_command(interrupted, tiny_model_dir, piqa_dir, steps)
    job = subprocess.Popen(
        command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while latest_checkpoint(interrupted) is None:
        assert job.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGKILL)  # the launcher and both workers, mid-training
    job.wait()
    killed_at = latest_checkpoint(interrupted)
    assert killed_at is not None and killed_at < f"step{steps:07d}", killed_at
    assert not list(interrupted.glob("cache/*/work/final_weights.pt"))

    subprocess.run(command, check=True, capture_output=True, timeout=300)
    subprocess.run(
        train_command(uninterrupted, tiny_model_dir, piqa_dir, steps),
        check=True,
        capture_output=True,
        timeout=300,
    )

    resumed, reference = (
        ModelWrapper(str(next(ws.glob("cache/TrainStep-*")))) for ws in (interrupted, uninterrupted)
    )
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value, rtol=0, atol=1e-5, msg=key)
    log = [
        json.loads(line)
        for line in next(interrupted.glob("cache/TrainStep-*/training_log.jsonl"))
        .read_text()
        .splitlines()
    ]
    assert [r["step"] for r in log if "train_loss" in r] == list(range(1, steps + 1))
    # The raw log shows the rerun resumed instead of starting over: step 1 was trained once.
    raw = next(interrupted.glob("cache/*/work/training_log.jsonl")).read_text().splitlines()
    first_steps = [r for r in map(json.loads, raw) if r["step"] == 1 and "train_loss" in r]
    assert len(first_steps) == 1


def test_a_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(
    tmp_path, tiny_model_dir, piqa_small
) -> None:
    from conftest import train_in

    from tango_fairscale.train import NonFiniteLossError

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


class FakeEngine:
    def __init__(self, scaled: bool) -> None:
        self.grad_scaler = object() if scaled else None
        self.device = torch.device("cpu")


@pytest.mark.parametrize(
    "scaled, losses, fails_at",
    [
        (False, [1.0, 1.0, float("nan"), 1.0], 3),
        (True, [1.0] + [float("inf")] * 10 + [1.0], None),  # the scaler skips up to 10 in a row
        (True, [1.0] + [float("nan")] * 11 + [1.0], 2),
    ],
)
def test_non_finite_guard(scaled, losses, fails_at) -> None:
    from tango_fairscale.batching import BatchSchedule
    from tango_fairscale.train import NonFiniteGuard, NonFiniteLossError

    guard = NonFiniteGuard(FakeEngine(scaled), BatchSchedule(100, 4, seed=0))
    for step, loss in enumerate(losses, start=1):
        guard.update(step, torch.tensor(loss))
    if fails_at is None:
        guard.check()
    else:
        with pytest.raises(NonFiniteLossError, match=f"at step {fails_at} "):
            guard.check()
