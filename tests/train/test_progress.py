"""The training bar's figures (``train/progress.py``) and the validation line (``train/run.py``):
a remaining time that leaves validation pauses out, the postfix's fields, one line naming each
task. What a real ``tango run`` shows: ``tests/test_training_display.py``."""

from __future__ import annotations

import pytest

from tango_fairscale.train import progress
from tango_fairscale.train.validation import describe_validation


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
