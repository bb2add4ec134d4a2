"""``records/run_info.py``: the typed record of what a run resolved, written and read back; a
missing, unreadable or hand-edited file reads as unknown fields, never as an error."""

from __future__ import annotations

from pathlib import Path

from tango_fairscale.records.run_info import RunInfo, precision_label


def test_a_record_reads_back_as_written(tmp_path: Path) -> None:
    info = RunInfo("bf16-mixed", 2, "cuda", 32, 2, "FairScaleEngine")
    info.write(tmp_path / "run_info.json")
    assert RunInfo.read(tmp_path / "run_info.json") == info


def test_missing_unreadable_and_mistyped_fields_read_as_unknown(tmp_path: Path) -> None:
    assert RunInfo.read(None) == RunInfo() == RunInfo.read(tmp_path / "absent.json")
    path = tmp_path / "run_info.json"
    path.write_text("{not json")
    assert RunInfo.read(path) == RunInfo()
    path.write_text("[1, 2]")
    assert RunInfo.read(path) == RunInfo()
    # An older file without some fields; a hand-edited one with wrong types.
    path.write_text('{"precision": "32-true", "world_size": true, "device": 3, "extra": 1}')
    assert RunInfo.read(path) == RunInfo(precision="32-true")
    path.write_text('{"world_size": 4, "global_batch": "16"}')
    assert RunInfo.read(path) == RunInfo(world_size=4)


def test_a_float8_run_is_recorded_with_its_recipe() -> None:
    """A float8 run is told apart from a plain one of the same precision (``results`` labels)."""
    assert precision_label("bf16-mixed", "tensorwise") == "bf16-mixed+tensorwise"
    assert precision_label("bf16-mixed", None) == "bf16-mixed"
