"""DCP's files as the package writes them (``parallel/dcp_storage.py``): each file whole on the
disk (flushed, then synced) before ``save_dcp`` returns its records, so that the manifest and
``latest`` never name bytes still in a buffer."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tango_fairscale.parallel import dcp_storage
from tango_fairscale.records.checkpoints import Identity


def test_every_file_is_synced_whole_before_its_record_is_returned(tmp_path, monkeypatch) -> None:
    synced: dict[str, int] = {}  # a file's size at its last fsync, by name
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced[Path(os.readlink(f"/proc/self/fd/{fd}")).name] = os.fstat(fd).st_size
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)  # DCP's own calls and the package's
    state = {"model": {"weight": torch.arange(1000.0), "bias": torch.zeros(3)}}
    records = dcp_storage.save_dcp(state, tmp_path, Identity("run-1", 5, 1), no_dist=True)
    assert ".metadata" in records and any(name.endswith(".distcp") for name in records)
    for name, record in records.items():
        written_as = name if name in synced else f"{name}.tmp"  # .metadata is renamed into place
        assert synced[written_as] == record.size == (tmp_path / name).stat().st_size, name
