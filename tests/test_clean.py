"""``tango-fairscale clean`` (``tango_fairscale/clean.py``): frees what finished training steps no
longer need, leaves cached results usable (the step is not run again, its model is the same),
leaves running and failed steps alone unless asked, and ``--dry-run`` deletes nothing.

The workspace (made once per module, cleaned in copies) holds two ``tango_fairscale::train``
steps run through the Python API: ``finished``, as a run finished by a version before the step
gave its files back (two checkpoints with AdamW's state, ``final_weights.pt``), and ``failed``,
stopped by a full disk after its step-5 checkpoint (resumable). Cleaning the ``tango run``
workspace of ``test_results.py`` and running ``tango run`` and ``results`` on it again is
``tests/integration/commands/test_clean_then_run.py``."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_close_by_key, train_tiny

from tango_fairscale.clean import clean_workspace, format_size
from tango_fairscale.cli import main
from tango_fairscale.records.checkpoints import read_manifest
from tango_fairscale.records.retention import size_of

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STEPS = 10  # checkpoints every 5: the finished step keeps steps 5 and 10
FAILED = {"seed": 7}  # another step id than the finished one's


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model_dir: Path, piqa_small) -> Path:
    import errno

    import tango_fairscale.train.step as step_module
    from tango_fairscale.train.checkpoints import TrainingStopped
    from tango_fairscale.train.settings import TrainSettings

    workspace = tmp_path_factory.mktemp("clean") / "workspace"
    plan = TrainSettings.plan

    def written_to_file(self, *args, **kwargs):  # rank 0 then wrote final_weights.pt, and
        made = plan(self, *args, **kwargs)  # the final checkpoint with its optimizer state
        made.final_weights_to_file = True
        made.runtime = dataclasses.replace(made.runtime, keep_optimizer_state=True)
        return made

    with pytest.MonkeyPatch.context() as patch:  # as the step did before it gave files back
        patch.setattr(step_module, "give_back_work_dir", lambda *args: None)
        patch.setattr(TrainSettings, "plan", written_to_file)
        train_tiny(workspace, tiny_model_dir, piqa_small, train_steps=STEPS)
    save = torch.save

    def full_at_step_10(obj, file, *args, **kwargs):
        if "step0000010" in str(file):
            raise OSError(errno.ENOSPC, "No space left on device")
        return save(obj, file, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "save", full_at_step_10)
        with pytest.raises(TrainingStopped):
            train_tiny(
                workspace, tiny_model_dir, piqa_small, train_steps=STEPS, step_options=FAILED
            )
    return workspace


@pytest.fixture
def workspace(built: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "workspace"
    shutil.copytree(built, copy, symlinks=True)
    return copy


def step_dirs(workspace: Path) -> tuple[Path, Path]:
    """(finished, failed): their result folders ``cache/<step id>``."""
    dirs = sorted(workspace.glob("cache/TrainStep-*"))
    finished = [d for d in dirs if (d / "cache-metadata.json").is_file()]
    failed = [d for d in dirs if not (d / "cache-metadata.json").is_file()]
    assert len(finished) == len(failed) == 1, dirs
    return finished[0], failed[0]


def files(directory: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``directory`` with its size and digest."""
    return {
        path.relative_to(directory).as_posix(): (
            path.stat().st_size,
            hashlib.sha256(path.read_bytes()).hexdigest(),
        )
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != "lock"
    }


def clean(capsys, *args: object) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(["clean", *map(str, args)])
    out, err = capsys.readouterr()
    assert err == ""
    return code, out.splitlines()


def rerun_finished(workspace: Path, model_dir: Path, piqa_small, monkeypatch):
    """The finished step again: its stored result, not a new training."""
    import tango_fairscale.train.step as step_module

    def not_again(*args, **kwargs) -> None:
        raise AssertionError("the step ran again")

    monkeypatch.setattr(step_module.TrainStep, "_run_with_work_dir", not_again)
    return train_tiny(workspace, model_dir, piqa_small, train_steps=STEPS)


def test_the_workspace_holds_a_finished_and_a_failed_step(built: Path) -> None:
    finished, failed = step_dirs(built)
    assert sorted(p.name for p in (finished / "work" / "checkpoints").glob("step*")) == [
        "step0000005",
        "step0000010",
    ]
    assert (finished / "work" / "final_weights.pt").is_file()
    assert [p.name for p in (failed / "work" / "checkpoints").glob("step*")] == ["step0000005"]


def test_dry_run_deletes_nothing_and_says_what_clean_frees(workspace: Path, capsys) -> None:
    finished, failed = step_dirs(workspace)
    before = files(workspace)
    code, lines = clean(capsys, "-w", workspace, "--dry-run")
    assert code == 0 and files(workspace) == before
    older = size_of(finished / "work" / "checkpoints" / "step0000005")
    weights = size_of(finished / "work" / "final_weights.pt")
    assert lines[0].startswith(f"step {finished.name} (in no run): would free ~"), lines
    assert f"checkpoint step0000005 {format_size(older)}" in lines[0]
    assert f"final_weights.pt {format_size(weights)}" in lines[0]
    assert "the optimizer state of step0000010 " in lines[0]
    held = format_size(size_of(failed / "work" / "checkpoints"))
    assert lines[1] == (
        f"step {failed.name} (in no run): failed or interrupted; its checkpoints ({held}) resume "
        "it, left as they are (--unfinished deletes them; its rerun then trains from the start)"
    )
    assert lines[2].startswith("would free ~") and lines[2].endswith(
        "in all (a dry run: nothing was deleted)"
    )
    assert len(lines) == 3

    # What the dry run announced is what clean frees: deletions exactly, the optimizer state
    # (estimated as the checkpoint less the stored model) roughly.
    [announced] = clean_workspace(workspace, dry_run=True)[:1]
    [done] = clean_workspace(workspace)[:1]
    assert announced.details[:2] == done.details[:2]  # the older checkpoint, final_weights.pt
    assert done.freed == pytest.approx(announced.freed, rel=0.25)


def test_clean_frees_bytes_and_leaves_the_cached_result_usable(
    workspace: Path, tiny_model_dir: Path, piqa_small, capsys, monkeypatch, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    finished, failed = step_dirs(workspace)
    failed_files = files(failed)
    before = size_of(workspace)
    [cleaned, skipped] = clean_workspace(workspace)
    assert (cleaned.state, skipped.state) == ("finished", "unfinished")
    assert cleaned.error is None and cleaned.freed == before - size_of(workspace) > 0
    assert skipped.freed == 0 and files(failed) == failed_files  # resumable: left alone
    work = finished / "work"
    assert sorted(p.name for p in work.iterdir()) == [
        "checkpoints",
        "run_info.json",
        "training_log.jsonl",
    ]
    checkpoints = work / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "run_id", "step0000010"]
    assert read_manifest(checkpoints / "step0000010").model_only
    stored = load_file(finished / "model.safetensors")
    capsys.readouterr()
    assert main(["export", str(finished), str(tmp_path / "hf")]) == 0
    assert_close_by_key(load_file(tmp_path / "hf" / "model.safetensors"), stored)

    code, lines = clean(capsys, "-w", workspace)  # again: nothing left to free
    assert code == 0 and lines[0] == f"step {finished.name} (in no run): nothing to free"
    assert lines[-1] == "freed 0 B in all"

    result = rerun_finished(workspace, tiny_model_dir, piqa_small, monkeypatch)
    assert_close_by_key(result.state_dict(), {f"model.{k}": v for k, v in stored.items()})


def test_all_checkpoints_deletes_the_final_one_and_the_result_stays(
    workspace: Path, tiny_model_dir: Path, piqa_small, capsys, monkeypatch
) -> None:
    from safetensors.torch import load_file

    finished, failed = step_dirs(workspace)
    failed_files = files(failed)
    weights = size_of(finished / "work" / "final_weights.pt")
    checkpoints = size_of(finished / "work" / "checkpoints")
    code, lines = clean(capsys, "-w", workspace, "--all-checkpoints")
    assert code == 0
    assert lines[0] == (
        f"step {finished.name} (in no run): freed {format_size(weights + checkpoints)} "
        f"(final_weights.pt {format_size(weights)}, every checkpoint {format_size(checkpoints)})"
    )
    assert lines[-1] == f"freed {format_size(weights + checkpoints)} in all"
    assert sorted(p.name for p in (finished / "work").iterdir()) == [
        "run_info.json",
        "training_log.jsonl",
    ]
    assert files(failed) == failed_files
    stored = load_file(finished / "model.safetensors")
    result = rerun_finished(workspace, tiny_model_dir, piqa_small, monkeypatch)
    assert_close_by_key(result.state_dict(), {f"model.{k}": v for k, v in stored.items()})


def test_a_failed_step_is_cleaned_only_when_asked_and_never_while_running(
    workspace: Path, capsys
) -> None:
    finished, failed = step_dirs(workspace)
    failed_files = files(failed)
    with (failed / "lock").open("a") as lock:  # another process runs the step again
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, lines = clean(capsys, "-w", workspace, "--unfinished")
        assert code == 0 and lines[1] == f"step {failed.name} (in no run): running; left as it is"
        assert files(failed) == failed_files
    held = size_of(failed / "work" / "checkpoints")
    code, lines = clean(capsys, "-w", workspace, "--unfinished")
    assert lines[1] == (
        f"step {failed.name} (in no run): freed {format_size(held)} (every checkpoint "
        f"{format_size(held)})"
    )
    assert sorted(p.name for p in (failed / "work").iterdir()) == [
        "run_info.json",
        "training_log.jsonl",
    ]


def test_refusals_in_one_line(workspace: Path, capsys) -> None:
    capsys.readouterr()
    assert main(["clean", "-w", str(workspace), "--run", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no run named 'nope' in local://" in err, err
    assert main(["clean", "-w", str(workspace / "nowhere")]) == 2
    assert "no Tango workspace at" in capsys.readouterr().err


def test_listing_imports_no_torch(workspace: Path) -> None:
    code = (
        "import sys\n"
        "from tango_fairscale.cli import main\n"
        f"assert main(['clean', '-w', {str(workspace)!r}, '--dry-run']) == 0\n"
        "assert 'torch' not in sys.modules, 'imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "would free ~" in result.stdout


# --- a workspace of tango run: runs by name, the same command again, results --------------------
