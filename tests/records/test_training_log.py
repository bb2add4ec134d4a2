"""The training log (``records/training_log.py``): rank 0 appends JSON lines, other ranks write
nothing, and reading merges the records of a step (a step replayed after a resume keeps its last
values); a record cut short by a crash is dropped, not a failure of every later read."""

from __future__ import annotations

from pathlib import Path

from tango_fairscale.records.training_log import TrainingLog, read_training_log, write_records


def test_only_an_enabled_log_writes(tmp_path: Path) -> None:
    path = tmp_path / "training_log.jsonl"
    TrainingLog(path, enabled=False).write({"step": 1, "train_loss": 2.0})
    assert not path.exists()
    log = TrainingLog(path, enabled=True)
    log.write({"step": 1, "train_loss": 2.0})
    log.write({"step": 2, "train_loss": 1.5})
    assert path.read_text() == '{"step": 1, "train_loss": 2.0}\n{"step": 2, "train_loss": 1.5}\n'


def test_reading_merges_a_steps_records_and_orders_by_step(tmp_path: Path) -> None:
    path = tmp_path / "training_log.jsonl"
    path.write_text(
        '{"step": 2, "train_loss": 1.5, "lr": 0.1}\n'
        "\n"
        '{"step": 1, "train_loss": 2.0}\n'
        '{"step": 2, "val_acc": 0.5}\n'
        '{"step": 2, "train_loss": 1.25}\n'  # replayed after a resume: the last value
    )
    assert read_training_log(path) == [
        {"step": 1, "train_loss": 2.0},
        {"step": 2, "train_loss": 1.25, "lr": 0.1, "val_acc": 0.5},
    ]


def test_a_missing_log_is_empty_and_write_records_replaces_it(tmp_path: Path) -> None:
    path = tmp_path / "training_log.jsonl"
    assert read_training_log(path) == []
    path.write_text('{"step": 9, "train_loss": 9.0}\n')
    records = [{"step": 1, "train_loss": 3.0}, {"step": 2, "val_acc": 0.25}]
    write_records(path, records)
    assert read_training_log(path) == records
    write_records(path, [])
    assert path.read_text() == "" and read_training_log(path) == []


def test_a_record_cut_short_by_a_crash_is_dropped_and_the_resumed_run_logs_its_step(
    tmp_path: Path,
) -> None:
    path = tmp_path / "training_log.jsonl"
    TrainingLog(path, enabled=True).write({"step": 10, "loss": 3.1})
    with path.open("a") as file:
        file.write('{"step": 20, "lo')  # the crash, mid-write
    assert read_training_log(path) == [{"step": 10, "loss": 3.1}]
    TrainingLog(path, enabled=True).write({"step": 20, "loss": 2.9})  # the resumed run
    assert read_training_log(path) == [{"step": 10, "loss": 3.1}, {"step": 20, "loss": 2.9}]
    assert path.read_text().count("\n") == 2
