"""The training display (``train/progress.py``, ``train/run.py``): the bar's postfix carries the
loss, learning rate, tokens/s, memory and a remaining time that leaves validation pauses out;
each validation is one line at Tango's default log level. Read from a real ``tango run``'s
output (the ``trained`` run of ``test_results.build_workspace``: 4 steps, validation every 2)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_results import TRAIN_STEPS, build_workspace

from tango_fairscale.train import progress
from tango_fairscale.train.run import describe_validation


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


def test_the_remaining_time_leaves_pauses_out(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    bar = progress.TrainingBar(0, 10, enabled=False)
    iter(bar)
    for done in (1, 2):
        now[0] += 2.0
        bar.stepped(done)
    now[0] += 500.0  # a validation, then a checkpoint
    bar.skip()
    now[0] += 2.0
    bar.stepped(3)
    assert bar.step_s == pytest.approx(2.0)
    bar.show(2.5, 1e-5, {"tokens_per_s": 1234.5, "peak_memory_gib": 3.25})
    assert bar.bar.postfix == "eta=00:14, 2.00s/it, loss=2.5000, lr=1e-05, tok/s=1,234, mem=3.2G"


def test_a_validation_line_names_each_task() -> None:
    metrics = {
        "acc": 0.5,
        "piqa/acc": 0.5,
        "piqa/acc_stderr": 0.1,
        "piqa/num_examples": 8,
        "arc_easy/acc": 0.25,
    }
    assert (
        describe_validation(metrics)
        == "piqa: acc 0.5000 ± 0.1000 (8 examples); arc_easy: acc 0.2500"
    )
