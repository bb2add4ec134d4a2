"""``local_fingerprint``: what local files contribute to cache keys.

* small files by content, weights and files over 64 MiB by size and mtime (every file by content
  with ``TANGO_FAIRSCALE_HASH_WEIGHTS=1``); directories recursively, hidden files left out;
* a missing path is recorded, not an error, and differs from an empty file;
* the digests equal those the package computed before the mechanism moved here (pinned), so the
  cache keys of existing workspaces stay valid;
* the module imports neither torch nor Tango.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tango_fairscale.records.fingerprint import (
    CONTENT_LIMIT_BYTES,
    HASH_WEIGHTS_VARIABLE,
    local_fingerprint,
)

MTIME_NS = 1_700_000_000_000_000_000


def model_dir(root: Path) -> Path:
    """A small model-like directory with fixed contents and a fixed weights mtime."""
    directory = root / "model"
    (directory / "sub").mkdir(parents=True)
    (directory / "config.json").write_bytes(b'{"a": 1}')
    (directory / "sub" / "tokenizer.json").write_bytes(b"{}")
    (directory / "model.safetensors").write_bytes(b"weights")
    (directory / ".lock").write_bytes(b"x")
    os.utime(directory / "model.safetensors", ns=(MTIME_NS, MTIME_NS))
    return directory


def test_digests_are_those_of_the_previous_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Computed with ``model/fingerprint.py``'s ``directory_fingerprint`` and
    ``files_fingerprint`` at 2dc960c: a model directory and a task's ``data_dir`` files keep
    their keys."""
    monkeypatch.chdir(tmp_path)
    directory = model_dir(tmp_path).relative_to(tmp_path)
    assert local_fingerprint([directory], relative_to=directory) == (
        "ccddc9f9bc4860d40b9e0b7ca79f61e5"
    )
    files = [directory / "config.json", directory / "sub" / "tokenizer.json"]
    assert local_fingerprint(files) == "c9cf166fd9e520a02fe2b5917f7d4c76"


def test_small_files_by_content(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    before = local_fingerprint([directory])
    config = directory / "config.json"
    stat = config.stat()
    config.write_bytes(b'{"a": 2}')  # same size, same mtime
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert local_fingerprint([directory]) != before


def test_weights_by_size_and_mtime_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = model_dir(tmp_path)
    weights = directory / "model.safetensors"
    before = local_fingerprint([directory])
    weights.write_bytes(b"WEIGHTS")  # same size; the mtime restored: not read
    os.utime(weights, ns=(MTIME_NS, MTIME_NS))
    assert local_fingerprint([directory]) == before
    os.utime(weights, ns=(MTIME_NS, MTIME_NS + 1))
    assert local_fingerprint([directory]) != before
    monkeypatch.setenv(HASH_WEIGHTS_VARIABLE, "1")
    os.utime(weights, ns=(MTIME_NS, MTIME_NS))
    hashed = local_fingerprint([directory])
    weights.write_bytes(b"weights")
    os.utime(weights, ns=(MTIME_NS, MTIME_NS))
    assert local_fingerprint([directory]) != hashed


def test_large_files_by_size_and_mtime(tmp_path: Path) -> None:
    large = tmp_path / "train.jsonl"
    with large.open("wb") as file:  # sparse: no disk, no time
        file.truncate(CONTENT_LIMIT_BYTES + 1)
    os.utime(large, ns=(MTIME_NS, MTIME_NS))
    before = local_fingerprint([large])
    with large.open("r+b") as file:
        file.seek(CONTENT_LIMIT_BYTES // 2)
        file.write(b"x")
    os.utime(large, ns=(MTIME_NS, MTIME_NS))
    assert local_fingerprint([large]) == before


def test_directories_recursively_without_hidden_files(tmp_path: Path) -> None:
    directory = model_dir(tmp_path)
    before = local_fingerprint([directory])
    (directory / ".lock").write_bytes(b"changed")
    (directory / ".cache").mkdir()
    (directory / ".cache" / "x").write_bytes(b"x")
    assert local_fingerprint([directory]) == before
    (directory / "sub" / "tokenizer.json").write_bytes(b'{"b": 1}')
    assert local_fingerprint([directory]) != before
    after = local_fingerprint([directory])
    (directory / "sub" / "extra.txt").write_bytes(b"")
    assert local_fingerprint([directory]) != after


def test_a_missing_path_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    missing = local_fingerprint([path])
    assert local_fingerprint([path]) == missing
    path.write_bytes(b"")
    assert local_fingerprint([path]) != missing


def test_imports_neither_torch_nor_tango() -> None:
    code = (
        "import sys, tango_fairscale.records.fingerprint; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tango')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
