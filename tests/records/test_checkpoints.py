"""The checkpoint directory protocol in pure Python (``tango_fairscale.records.checkpoints``): the
manifest, file records, verification, listing, committing and pruning, the run id. No process
group, no torch."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tango_fairscale.records.checkpoints import (
    LATEST,
    MANIFEST,
    CheckpointError,
    DamagedCheckpoint,
    FileRecord,
    Identity,
    Manifest,
    NoManifest,
    check_file,
    clear_partials,
    commit,
    complete_checkpoints,
    discard,
    file_record,
    find_checkpoint,
    install,
    latest_checkpoint,
    partial_dir,
    read_manifest,
    run_id,
    share,
    step_name,
    step_of,
    write_file,
    write_manifest,
)

IDENTITY = Identity("0123456789abcdef", 200, 2)


def checkpoint(directory: Path, step: int = 200, **files: bytes) -> Path:
    """A checkpoint directory holding ``files`` (by name) and their manifest."""
    directory.mkdir(parents=True)
    records = {}
    for name, data in (files or {"rank0.pt": b"zero" * 100, "rank1.pt": b"one" * 50}).items():
        records[name] = write_file(directory / name, lambda file, data=data: file.write(data))
    identity = Identity(IDENTITY.run_id, step, IDENTITY.world_size)
    write_manifest(directory, Manifest("rank-files", identity, records))
    return directory


def flip_a_byte(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_manifest_round_trips_and_refuses_any_change(tmp_path) -> None:
    manifest = Manifest("torch-dcp", IDENTITY, {"a.distcp": FileRecord(3, "ab" * 32)})
    text = manifest.to_json()
    assert Manifest.from_json(text) == manifest
    body = json.loads(text)
    body["files"]["a.distcp"]["size"] = 4  # edited by hand: the manifest's own digest differs
    with pytest.raises(ValueError, match="does not match its digest"):
        Manifest.from_json(json.dumps(body))
    with pytest.raises(ValueError, match="not JSON"):
        Manifest.from_json(text[:-20])


def test_a_model_only_manifest_says_so_and_others_keep_their_bytes() -> None:
    files = {"rank0.pt": FileRecord(3, "ab" * 32)}
    full, model_only = (
        Manifest("rank-files", IDENTITY, files),
        Manifest("rank-files", IDENTITY, files, model_only=True),
    )
    assert "model_only" not in full.to_json()  # a manifest of before: the same bytes, digest
    assert Manifest.from_json(full.to_json()) == full and not full.model_only
    assert Manifest.from_json(model_only.to_json()) == model_only
    body = json.loads(model_only.to_json())
    body["model_only"] = "yes"
    body.pop("digest")
    from tango_fairscale.records.manifest import _digest

    body["digest"] = _digest(body)
    with pytest.raises(ValueError, match="model_only is 'yes', not a boolean"):
        Manifest.from_json(json.dumps(body))


def test_a_manifest_naming_a_file_outside_the_checkpoint_is_refused() -> None:
    forged = Manifest("rank-files", IDENTITY, {"../../etc/passwd": FileRecord(1, "00")})
    with pytest.raises(ValueError, match="outside the checkpoint"):
        Manifest.from_json(forged.to_json())


def test_a_file_is_recorded_while_written_as_when_read_back(tmp_path) -> None:
    import array

    values = array.array("d", range(1000))  # a buffer of 8-byte items: counted in bytes
    record = write_file(
        tmp_path / "f", lambda file: (pickle.dump({"x": 1}, file), file.write(values))
    )
    assert record == file_record(tmp_path / "f")
    assert record.size == (tmp_path / "f").stat().st_size


def test_check_file_names_what_is_wrong(tmp_path) -> None:
    directory = checkpoint(tmp_path / step_name(200))
    records = read_manifest(directory).files
    assert check_file(directory, "rank0.pt", records["rank0.pt"]) is None
    flip_a_byte(directory / "rank0.pt")  # same size, other content
    assert check_file(directory, "rank0.pt", records["rank0.pt"]) == "checksum mismatch"
    (directory / "rank1.pt").write_bytes(b"one" * 10)
    assert check_file(directory, "rank1.pt", records["rank1.pt"]) == "30 bytes, 150 in the manifest"
    (directory / "rank1.pt").unlink()
    assert check_file(directory, "rank1.pt", records["rank1.pt"]) == "missing"


def test_read_manifest_refuses_in_one_line(tmp_path) -> None:
    directory = checkpoint(tmp_path / step_name(200))
    assert read_manifest(directory).identity == IDENTITY
    flip_a_byte(directory / MANIFEST, 40)
    with pytest.raises(DamagedCheckpoint, match=f"is damaged \\({MANIFEST}: "):
        read_manifest(directory)
    (directory / MANIFEST).unlink()
    with pytest.raises(NoManifest, match="before tango_fairscale checksummed") as error:
        read_manifest(directory)
    assert "\n" not in str(error.value)
    moved = checkpoint(tmp_path / step_name(300))  # a manifest of step 200 in step0000300
    write_manifest(moved, Manifest("rank-files", IDENTITY, {}))
    with pytest.raises(DamagedCheckpoint, match="of step 200 of run .*, not of step 300"):
        read_manifest(moved)


def test_a_damaged_checkpoint_crosses_processes() -> None:
    damage = DamagedCheckpoint(Path("/c/step0000200"), "rank1.pt", "checksum mismatch")
    copy = pickle.loads(pickle.dumps(damage))
    assert str(copy) == str(damage) == "/c/step0000200 is damaged (rank1.pt: checksum mismatch)"
    assert copy.detail == "rank1.pt: checksum mismatch"


def test_each_file_is_verified_by_one_rank_with_balanced_bytes() -> None:
    files = {f"__{r}_0.distcp": FileRecord(1000 + r, "") for r in range(4)}
    files.update({"trainer.pt": FileRecord(10, ""), ".metadata": FileRecord(20, "")})
    shares = [share(files, rank, 4) for rank in range(4)]
    assert sorted(name for part in shares for name in part) == sorted(files)
    assert all(sum(1 for name in part if name.endswith(".distcp")) == 1 for part in shares)
    assert share(files, 0, 1) == sorted(files, key=lambda name: (-files[name].size, name))


def test_commit_renames_names_latest_and_keeps_the_newest(tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    for step in (100, 200, 300):
        partial = checkpoint(partial_dir(checkpoints, step), step)
        assert complete_checkpoints(checkpoints)[:1] != [partial]  # never listed while partial
        final = commit(partial, keep=2)
        assert (
            final == checkpoints / step_name(step)
            and (checkpoints / LATEST).read_text() == final.name
        )
    assert complete_checkpoints(checkpoints) == [
        checkpoints / "step0000300",
        checkpoints / "step0000200",
    ]
    commit(checkpoint(partial_dir(checkpoints, 400), 400), keep=1)
    assert [path.name for path in complete_checkpoints(checkpoints)] == ["step0000400"]
    # The same step again (a rerun that fell back past it): the new one replaces it.
    again = checkpoint(partial_dir(checkpoints, 400), 400, **{"rank0.pt": b"again"})
    commit(again, keep=1)
    assert (checkpoints / "step0000400" / "rank0.pt").read_bytes() == b"again"
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST, "step0000400"]


def test_a_commit_after_a_fallback_keeps_itself_and_drops_the_later_steps(tmp_path) -> None:
    """A rerun fell back from a damaged step 23 to step 10 and now commits step 20 (another
    cadence): step 20 is kept and named in ``latest``, the abandoned step 23 is deleted."""
    checkpoints = tmp_path / "checkpoints"
    for step in (10, 23):
        commit(checkpoint(partial_dir(checkpoints, step), step), keep=2)
    commit(checkpoint(partial_dir(checkpoints, 20), 20), keep=1)
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST, "step0000020"]
    assert latest_checkpoint(checkpoints) == checkpoints / "step0000020"
    commit(checkpoint(partial_dir(checkpoints, 30), 30), keep=2)
    assert [path.name for path in complete_checkpoints(checkpoints)] == [
        "step0000030",
        "step0000020",
    ]


def test_install_replaces_a_checkpoint_of_the_same_step(tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    commit(checkpoint(partial_dir(checkpoints, 100), 100), keep=2)
    replacement = checkpoint(partial_dir(checkpoints, 100), 100, **{"rank0.pt": b"model only"})
    assert install(replacement) == checkpoints / "step0000100"
    assert (checkpoints / "step0000100" / "rank0.pt").read_bytes() == b"model only"
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST, "step0000100"]
    discard(checkpoints / "step0000100")
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST]


def test_latest_checkpoint_is_the_one_latest_names(tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    assert latest_checkpoint(checkpoints) is None
    for step in (100, 200):
        commit(checkpoint(partial_dir(checkpoints, step), step), keep=2)
    assert latest_checkpoint(checkpoints) == checkpoints / "step0000200"
    (checkpoints / LATEST).write_text("step0000100")  # a rerun that fell back to step 100
    assert latest_checkpoint(checkpoints) == checkpoints / "step0000100"
    (checkpoints / LATEST).write_text("step0000300")  # gone: the newest complete one
    assert latest_checkpoint(checkpoints) == checkpoints / "step0000200"
    (checkpoints / LATEST).write_text("../elsewhere")
    assert latest_checkpoint(checkpoints) == checkpoints / "step0000200"


def test_listing_ignores_everything_but_step_directories(tmp_path) -> None:
    checkpoints = tmp_path / "checkpoints"
    checkpoint(checkpoints / "step0000100", 100)
    checkpoint(checkpoints / "step0001000", 1000)  # newer by step, not by name length
    checkpoint(partial_dir(checkpoints, 2000), 2000)
    (checkpoints / LATEST).write_text("step0001000")
    run_id(checkpoints)
    assert [p.name for p in complete_checkpoints(checkpoints)] == ["step0001000", "step0000100"]
    assert step_of("step0001000") == 1000 and step_of(".partial-step0002000") is None
    clear_partials(checkpoints)
    assert not partial_dir(checkpoints, 2000).exists()
    assert complete_checkpoints(tmp_path / "nowhere") == []


@pytest.mark.parametrize("landed", [False, True], ids=["before-the-rename", "after-it"])
def test_a_replacement_stopped_midway_keeps_one_whole_checkpoint(tmp_path, landed) -> None:
    """``install`` set the complete step 100 aside for a new one and the process died before
    (or after) renaming the new one into place: the next start puts the old one back (or keeps
    the new one), never neither."""
    checkpoints = tmp_path / "checkpoints"
    commit(checkpoint(partial_dir(checkpoints, 100), 100, **{"rank0.pt": b"old"}), keep=2)
    new = checkpoint(partial_dir(checkpoints, 100), 100, **{"rank0.pt": b"new"})
    (checkpoints / "step0000100").rename(checkpoints / ".partial-replaced-step0000100")
    if landed:
        new.rename(checkpoints / "step0000100")
    clear_partials(checkpoints)
    survivor = b"new" if landed else b"old"
    assert (checkpoints / "step0000100" / "rank0.pt").read_bytes() == survivor
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST, "step0000100"]


def test_every_process_gets_the_same_run_id(tmp_path) -> None:
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: run_id(tmp_path / "checkpoints"), range(32)))
    assert len(ids) == 1 and len(ids.pop()) == 16
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["run_id"]  # no leftovers


def test_find_checkpoint(tmp_path) -> None:
    checkpoints = tmp_path / "work" / "checkpoints"
    final = commit(checkpoint(partial_dir(checkpoints, 100), 100), keep=2)
    for given in (tmp_path / "work", checkpoints, final):
        assert find_checkpoint(given) == final
    older = checkpoints / "step0000050"  # written before manifests: found, refused when read
    older.mkdir()
    (older / "rank0.pt").write_bytes(b"x")
    assert find_checkpoint(older) == older
    with pytest.raises(CheckpointError, match="is a partial checkpoint"):
        find_checkpoint(checkpoint(partial_dir(checkpoints, 200), 200))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        find_checkpoint(tmp_path / "empty")


def test_the_module_imports_neither_torch_nor_tango() -> None:
    code = (
        "import sys, tango_fairscale.records.checkpoints\n"
        "assert not {'torch', 'tango'} & sys.modules.keys(), 'imported torch or tango'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
