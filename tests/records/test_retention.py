"""What a training step's work dir gives back once the step is finished (``records/retention.py``),
in pure Python, on checkpoint directories of plain bytes: the plan, deletions that never leave a
half-deleted checkpoint listed, and the finished run's final checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_checkpoints import checkpoint

from tango_fairscale.records.checkpoints import (
    LATEST,
    Manifest,
    commit,
    complete_checkpoints,
    partial_dir,
    read_manifest,
    write_manifest,
)
from tango_fairscale.records.retention import (
    DELETE,
    MODEL_ONLY,
    Release,
    finished_checkpoint,
    finished_step,
    give_back,
    size_of,
    unfinished_step,
)


def work_dir(tmp_path: Path, steps=(100, 200, 300), keep: int = 2) -> Path:
    """A work dir as a run of ``steps`` leaves it: the newest ``keep`` checkpoints, a crash's
    leftover, ``final_weights.pt``, the log files."""
    work = tmp_path / "work"
    checkpoints = work / "checkpoints"
    for step in steps:
        commit(checkpoint(partial_dir(checkpoints, step), step), keep=keep)
    checkpoint(partial_dir(checkpoints, 400), 400)  # a crash while writing step 400
    (work / "final_weights.pt").write_bytes(b"w" * 1000)
    (work / "training_log.jsonl").write_text('{"step": 1}\n')
    (work / "run_info.json").write_text("{}\n")
    return work


def described(releases: list[Release]) -> list[tuple[str, str, int]]:
    return [(release.action, release.describe(), release.size) for release in releases]


def test_a_finished_step_keeps_its_final_checkpoint_without_optimizer_state(tmp_path) -> None:
    work = work_dir(tmp_path)
    checkpoints = work / "checkpoints"
    size = size_of(checkpoints / "step0000300")
    assert size == sum(path.stat().st_size for path in (checkpoints / "step0000300").iterdir())
    releases = finished_step(work)
    assert described(releases) == [
        (DELETE, ".partial-step0000400", size),
        (DELETE, "checkpoint step0000200", size),
        (DELETE, "final_weights.pt", 1000),
        (MODEL_ONLY, "the optimizer state of step0000300", size),  # last: after the deletions
    ]
    assert finished_step(work, keep_optimizer_state=True) == releases[:-1]
    every = finished_step(work, all_checkpoints=True)
    assert described(every) == [
        (DELETE, "final_weights.pt", 1000),
        (DELETE, "every checkpoint", size_of(checkpoints)),
    ]


def test_give_back_deletes_and_rewrites(tmp_path) -> None:
    work = work_dir(tmp_path)
    checkpoints = work / "checkpoints"
    rewritten: list[Path] = []

    def model_only(directory: Path) -> Path:  # what parallel/model_only.py does, in bytes
        manifest = read_manifest(directory)
        (directory / "rank1.pt").unlink()
        files = {k: v for k, v in manifest.files.items() if k != "rank1.pt"}
        write_manifest(directory, Manifest(manifest.format, manifest.identity, files, True))
        rewritten.append(directory)
        return directory

    before = size_of(work)
    freed = sum(give_back(release, model_only) for release in finished_step(work))
    assert freed == before - size_of(work) > 0
    assert rewritten == [checkpoints / "step0000300"]
    assert sorted(path.name for path in checkpoints.iterdir()) == [LATEST, "step0000300"]
    assert sorted(path.name for path in work.iterdir()) == [
        "checkpoints",
        "run_info.json",
        "training_log.jsonl",
    ]
    assert finished_checkpoint(checkpoints) == checkpoints / "step0000300"
    assert finished_step(work) == []  # nothing left to give back
    for release in finished_step(work, all_checkpoints=True):
        give_back(release, model_only)
    assert sorted(path.name for path in work.iterdir()) == ["run_info.json", "training_log.jsonl"]


def test_an_unfinished_step_gives_back_everything_it_would_resume_from(tmp_path) -> None:
    work = work_dir(tmp_path)
    releases = unfinished_step(work)
    assert [release.describe() for release in releases] == ["final_weights.pt", "every checkpoint"]
    for release in releases:
        give_back(release, lambda directory: directory)
    assert sorted(path.name for path in work.iterdir()) == ["run_info.json", "training_log.jsonl"]
    assert unfinished_step(work) == [] and finished_step(work) == []


def test_a_deleted_checkpoint_is_never_listed_half_deleted(tmp_path, monkeypatch) -> None:
    """Interrupted while deleting (the process killed in ``rmtree``): the checkpoint was renamed
    out of the listing first, and the next plan removes what is left."""
    import shutil

    work = work_dir(tmp_path)
    checkpoints = work / "checkpoints"

    class Killed(BaseException):
        pass

    def killed(path, *args, **kwargs):
        raise Killed

    older = [r for r in finished_step(work) if r.path.name == "step0000200"]
    monkeypatch.setattr(shutil, "rmtree", killed)
    try:
        give_back(older[0], lambda directory: directory)
    except Killed:
        pass
    monkeypatch.undo()
    assert complete_checkpoints(checkpoints) == [checkpoints / "step0000300"]
    leftovers = [r.path.name for r in finished_step(work) if r.action == DELETE]
    assert ".partial-discarded-step0000200" in leftovers


def test_the_finished_checkpoint_is_the_latest_when_it_is_model_only(tmp_path) -> None:
    work = work_dir(tmp_path)
    checkpoints = work / "checkpoints"
    assert finished_checkpoint(checkpoints) is None  # it holds its optimizer state: resume it
    final = checkpoints / "step0000300"
    manifest = read_manifest(final)
    write_manifest(final, Manifest(manifest.format, manifest.identity, manifest.files, True))
    assert finished_checkpoint(checkpoints) == final
    (checkpoints / LATEST).write_text("step0000200")  # a fallback: the newest is not latest
    assert finished_checkpoint(checkpoints) is None
    assert finished_checkpoint(tmp_path / "nowhere") is None


def test_the_module_imports_neither_torch_nor_tango() -> None:
    code = (
        "import sys, tango_fairscale.records.retention\n"
        "assert not {'torch', 'tango'} & sys.modules.keys(), 'imported torch or tango'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
