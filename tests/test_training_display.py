"""What ``tango run`` shows while it trains (``train/progress.py``, ``train/run.py``): the bar's
postfix carries the loss, learning rate, tokens/s, memory and remaining time; each validation is
one line at Tango's default log level, and so is the run's time split at its end. Read from a
real run's output: the ``trained`` run of ``test_results.build_workspace`` (4 steps, validation
every 2), shared with the results tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_results import TRAIN_STEPS, build_workspace


@pytest.fixture(scope="session")
def trained_output(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, piqa_dir: Path
) -> str:
    base = tmp_path_factory.getbasetemp()
    build_workspace(base, tiny_model_dir, piqa_dir)
    return (base / "trained.out").read_text()


def test_the_bar_shows_loss_lr_throughput_memory_and_eta(trained_output: str) -> None:
    displays = [d for d in re.split(r"[\r\n]", trained_output) if d.startswith("Training:")]
    last = displays[-1]
    assert f"{TRAIN_STEPS}/{TRAIN_STEPS}" in last
    postfix = dict(
        item.split("=", 1) for item in last.split("[", 1)[1].rstrip("]").split(", ") if "=" in item
    )
    assert set(postfix) >= {"eta", "loss", "lr", "tok/s", "rss"}
    assert float(postfix["loss"]) > 0 and float(postfix["lr"]) == 1e-3
    assert re.fullmatch(r"\d+:\d\d", postfix["eta"])


def test_each_validation_is_one_line_at_the_default_log_level(trained_output: str) -> None:
    lines = [line for line in trained_output.splitlines() if "validation:" in line]
    assert [line.split(" validation:")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert re.search(r"piqa: acc 0\.\d{4} ± 0\.\d{4}, acc_norm 0\.\d{4} ± 0\.\d{4} \(16 ", lines[0])


def test_the_time_split_ends_the_training(trained_output: str) -> None:
    [line] = [line for line in trained_output.splitlines() if "time split:" in line]
    split = line.split("time split: ")[1]
    assert re.fullmatch(
        rf"data [\d.]+ s, engine [\d.]+ s, setup [\d.]+ s, first step [\d.]+ s, "
        rf"{TRAIN_STEPS - 1} more steps [\d.]+ s "
        r"\([\d.]+ ms each\), validation [\d.]+ s, checkpoints [\d.]+ s, final [\d.]+ s "
        r"\(\d+ written in the background in [\d.]+ s\)",
        split,
    ), split
