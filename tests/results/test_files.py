"""A Tango ``JsonFormat`` result read without Tango (``results/files.py``): ``data.json`` or
``data.jsonl``, plain or compressed; a ``_dataclass`` entry (which Tango's ``JsonFormat`` calls)
is read as data."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
from pathlib import Path

import pytest

from tango_fairscale.results.files import read_json

OPENERS = {"": open, ".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}


@pytest.mark.parametrize("suffix", list(OPENERS))
def test_a_single_json_result_reads_compressed_or_not(tmp_path: Path, suffix: str) -> None:
    with OPENERS[suffix](tmp_path / f"data.json{suffix}", "wt") as file:
        json.dump({"acc": 0.5, "tasks": ["piqa"]}, file)
    assert read_json(tmp_path, suffix) == {"acc": 0.5, "tasks": ["piqa"]}


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_a_json_lines_result_is_its_items(tmp_path: Path, suffix: str) -> None:
    with OPENERS[suffix](tmp_path / f"data.jsonl{suffix}", "wt") as file:
        file.write('{"i": 1}\n\n{"i": 2}\n')
    assert read_json(tmp_path, suffix) == [{"i": 1}, {"i": 2}]


def test_the_single_file_wins_and_neither_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "data.json").write_text("[1]")
    (tmp_path / "data.jsonl").write_text("2\n")
    assert read_json(tmp_path, "") == [1]
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "empty", "")


def test_a_dataclass_entry_is_read_as_data(tmp_path: Path) -> None:
    planted = {"_dataclass": ["os", "system"], "command": f"touch {tmp_path / 'ran'}"}
    (tmp_path / "data.json").write_text(json.dumps({"x": planted}))
    assert read_json(tmp_path, "") == {"x": planted}
    assert not (tmp_path / "ran").exists()
