"""A checkpoint's manifest (``records/manifest.py``), the parts ``test_checkpoints.py`` leaves
out: the identity's text and its strict reading, the JSON's version and shape refused with a
short reason, and a file recorded while ``torch.save`` writes it through :class:`HashingFile`.
(The digest round trip, ``model_only`` and paths outside the checkpoint are tested there.)"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tango_fairscale.records.manifest import (
    MANIFEST_VERSION,
    FileRecord,
    HashingFile,
    Identity,
    Manifest,
    _digest,
    file_record,
    write_file,
)

IDENTITY = Identity("0123456789abcdef", 40, 1)


def test_an_identity_reads_as_a_sentence() -> None:
    assert str(IDENTITY) == "step 40 of run 0123456789abcdef on 1 process"
    assert str(Identity("r", 5, 4)) == "step 5 of run r on 4 processes"


def test_an_identity_round_trips_and_nothing_else_reads_as_one() -> None:
    assert Identity.from_dict(IDENTITY.as_dict()) == IDENTITY
    good = IDENTITY.as_dict()
    for bad in (
        [1, 2, 3],
        {**good, "extra": 1},
        {k: v for k, v in good.items() if k != "step"},
        {**good, "step": True},  # a bool is no step
        {**good, "step": 40.0},
        {**good, "run_id": 7},
    ):
        with pytest.raises(ValueError, match="not a checkpoint identity"):
            Identity.from_dict(bad)


def sealed(body: dict[str, Any]) -> str:
    """``body`` as a manifest's JSON with a valid digest (what a careful forger writes)."""
    return json.dumps({**body, "digest": _digest(body)})


def body(**changes: Any) -> dict[str, Any]:
    manifest = Manifest("rank-files", IDENTITY, {"rank0.pt": FileRecord(3, "ab" * 32)})
    fields = json.loads(manifest.to_json())
    fields.pop("digest")
    return {**fields, **changes}


def test_the_json_carries_its_version_and_sorted_files() -> None:
    files = {"b.pt": FileRecord(1, "01"), "a.pt": FileRecord(2, "02")}
    text = Manifest("rank-files", IDENTITY, files).to_json()
    fields = json.loads(text)
    assert fields["version"] == MANIFEST_VERSION == 1
    assert list(fields["files"]) == ["a.pt", "b.pt"]
    assert Manifest.from_json(sealed(body())) == Manifest.from_json(
        Manifest("rank-files", IDENTITY, {"rank0.pt": FileRecord(3, "ab" * 32)}).to_json()
    )


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"version": 2}, "version 2; this tango_fairscale reads 1"),
        ({"files": [1]}, "malformed (AttributeError"),
        ({"files": {"a.pt": {"size": 1}}}, "malformed (KeyError"),
        ({"identity": {"run_id": "r"}}, "not a checkpoint identity"),
    ],
)
def test_a_sealed_manifest_of_another_shape_is_refused(changes: dict, reason: str) -> None:
    with pytest.raises(ValueError) as error:
        Manifest.from_json(sealed(body(**changes)))
    assert str(error.value).startswith(reason)


def test_a_format_that_is_no_text_is_refused_by_its_name() -> None:
    with pytest.raises(ValueError, match="^format 3, not a format's name$"):
        Manifest.from_json(sealed(body(format=3)))


def test_json_that_is_no_object_is_refused() -> None:
    with pytest.raises(ValueError, match="does not match its digest"):
        Manifest.from_json("[1, 2]")
    with pytest.raises(ValueError, match="does not match its digest"):
        Manifest.from_json(json.dumps(body()))  # no digest at all


def test_torch_save_through_a_hashing_file_records_what_it_wrote(tmp_path: Path) -> None:
    state = {"weight": torch.arange(1000, dtype=torch.float32), "step": 3}
    path = tmp_path / "rank0.pt"
    record = write_file(path, lambda file: torch.save(state, file))
    data = path.read_bytes()
    assert record == FileRecord(len(data), hashlib.sha256(data).hexdigest()) == file_record(path)
    assert torch.equal(torch.load(path, weights_only=True)["weight"], state["weight"])


def test_large_writes_are_hashed_on_a_thread_and_recorded_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of 1 MiB or more is hashed on a daemon thread while the file takes it (a process
    that ends through ``exit_now`` joins every other thread); with small writes between large
    ones, the record is still the whole file's SHA-256."""
    import threading

    from tango_fairscale.records import manifest

    hash_beside = manifest._hash_beside
    sizes: list[int] = []
    threads: list[threading.Thread] = []

    def spy(digest, data):
        sizes.append(memoryview(data).nbytes)
        threads.append(hash_beside(digest, data))
        return threads[-1]

    monkeypatch.setattr(manifest, "_hash_beside", spy)
    state = {
        "big": torch.randn(3, 1 << 18),  # 3 MiB
        "small": torch.arange(10),
        "other": torch.randn(1 << 19),  # 2 MiB
        "step": 7,
    }
    path = tmp_path / "rank0.pt"
    record = write_file(path, lambda file: torch.save(state, file))
    data = path.read_bytes()
    assert record == FileRecord(len(data), hashlib.sha256(data).hexdigest())
    assert sorted(sizes) == [2 << 20, 3 << 20]
    assert all(thread.daemon and not thread.is_alive() for thread in threads)
    assert torch.equal(torch.load(path, weights_only=True)["big"], state["big"])


def test_a_files_record_is_its_sha256_read_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``file_record`` hashes each chunk on a thread while it reads the next: the digest is the
    whole file's, in order, whatever the chunk size."""
    from tango_fairscale.records import manifest

    data = bytes(range(256)) * 1000 + b"tail"
    (tmp_path / "f").write_bytes(data)
    expected = FileRecord(len(data), hashlib.sha256(data).hexdigest())
    for chunk in (4096, 100_000, 1 << 24):
        monkeypatch.setattr(manifest, "_READ_BYTES", chunk)
        assert file_record(tmp_path / "f") == expected
    (tmp_path / "empty").write_bytes(b"")
    assert file_record(tmp_path / "empty") == FileRecord(0, hashlib.sha256().hexdigest())


def test_a_hashing_file_passes_position_and_flush_through(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb") as raw:
        hashing = HashingFile(raw)
        assert hashing.write(b"abc") == 3 and hashing.tell() == 3
        hashing.write(bytearray(b"de"))
        hashing.flush()
        assert hashing.fileno() == raw.fileno() and "f'" in repr(hashing)
        assert (tmp_path / "f").read_bytes() == b"abcde"
    assert hashing.record() == FileRecord(5, hashlib.sha256(b"abcde").hexdigest())


def test_a_write_is_abandoned_once_its_event_is_set(tmp_path: Path) -> None:
    """Under ``abandoned_when``, a file's next write raises once the event is set; outside it,
    writes go on whatever the event."""
    import threading

    from tango_fairscale.records.manifest import WriteAbandoned, abandoned_when

    event = threading.Event()
    with abandoned_when(event), open(tmp_path / "a", "wb") as raw:
        file = HashingFile(raw)
        file.write(b"before")
        event.set()
        with pytest.raises(WriteAbandoned, match="abandoned"):
            file.write(b"after")
    with open(tmp_path / "b", "wb") as raw:
        HashingFile(raw).write(b"not under the block")
    assert (tmp_path / "a").read_bytes() == b"before"
