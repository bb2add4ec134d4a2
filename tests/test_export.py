"""``tango-fairscale export``: checkpoints written by the package's own loop (FairScale rank files
at world size 1 and 2, an FSDP2 distributed checkpoint at world size 2, DDP's full state) become
Hugging Face directories that ``from_pretrained`` loads with every key matched, equal to the run's
own consolidated final weights; what is not a complete checkpoint is refused in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_close_by_key, save_tiny_gpt2, train_in
from helpers.checkpoints import damage_in_place, replace_file, reseal, truncate
from helpers.hostile_pickles import calling_pickle

from tango_fairscale.cli import main
from tango_fairscale.train.loop import FINAL_WEIGHTS

STEPS = 5  # train_in checkpoints every 5 steps: the last checkpoint is the final model
STEP_DIR = "checkpoints/step0000005"


@pytest.fixture(scope="module")
def odd_model_dir(tmp_path_factory, tokenizer_dir: Path) -> Path:
    """A tiny GPT-2 of odd widths: at world size 2 FairScale pads its flat shards."""
    return save_tiny_gpt2(tmp_path_factory.mktemp("odd-gpt2"), tokenizer_dir, n_embd=33, n_head=3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, odd_model_dir: Path, piqa_small) -> Callable[..., Path]:
    """``trained(engine, device_count, **engine_params)``: the work dir of a 5-step run of our
    loop (each made once per module)."""
    runs: dict[str, Path] = {}

    def run(engine: str, device_count: int, **engine_params: Any) -> Path:
        key = f"{engine}-{device_count}-{sorted(engine_params.items())}"
        if key not in runs:
            work_dir = tmp_path_factory.mktemp(f"{engine}-{device_count}")
            name = f"tango_fairscale::{engine}"
            train_in(
                work_dir, odd_model_dir, piqa_small, name, device_count, STEPS, **engine_params
            )
            runs[key] = work_dir
        return runs[key]

    return run


@pytest.fixture(scope="module")
def resumed_run(tmp_path_factory, odd_model_dir: Path, piqa_small) -> tuple[Path, Path]:
    """A FairScale run stopped after its step-5 checkpoint and resumed to step 10: its work dir,
    and a copy of its step-5 checkpoint taken before it resumed."""
    work_dir = tmp_path_factory.mktemp("resumed")
    for steps in (5, 10):
        train_in(work_dir, odd_model_dir, piqa_small, "tango_fairscale::fairscale", 1, steps)
        if steps == 5:
            step5 = tmp_path_factory.mktemp("step5") / "step0000005"
            shutil.copytree(work_dir / STEP_DIR, step5)
    return work_dir, step5


def export(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    capsys.readouterr()  # what the fixtures' training printed
    code = main(["export", *map(str, args)])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


# The three ways to name a checkpoint: the step's work dir, its checkpoints/ (latest), the step.
UNFLATTENED = {"sharding": {"flatten_parameters": False}}


@pytest.mark.parametrize(
    ("engine", "device_count", "params", "given"),
    [
        ("fairscale", 1, {}, "."),
        ("fairscale", 1, UNFLATTENED, STEP_DIR),
        pytest.param("fairscale", 2, {}, "checkpoints", marks=pytest.mark.slow),
        pytest.param("fsdp2", 2, {}, STEP_DIR, marks=pytest.mark.slow),
        ("ddp", 1, {}, "checkpoints"),
    ],
    ids=["fairscale-1", "fairscale-1-unflattened", "fairscale-2", "fsdp2-2", "ddp-1"],
)
def test_export_equals_the_runs_final_weights(
    engine: str, device_count: int, params: dict, given: str, trained, tmp_path: Path, capsys
) -> None:
    from transformers import AutoModelForCausalLM

    work_dir = trained(engine, device_count, **params)
    if engine == "fairscale" and device_count > 1:  # the shards are padded: cut off on export
        metadata = torch.load(work_dir / STEP_DIR / "rank1.pt", weights_only=True)["model_metadata"]
        paddings = [
            p["padding"] for unit in metadata["param_metadata"] for p in unit["params"].values()
        ]
        assert any(paddings), paddings
    code, err = export(capsys, work_dir / given, tmp_path / "hf")
    assert code == 0, err
    assert f"wrote the model of {work_dir / STEP_DIR} to {tmp_path / 'hf'}" in err

    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", output_loading_info=True)
    assert info == {
        "missing_keys": set(),
        "unexpected_keys": set(),
        "mismatched_keys": set(),
        "error_msgs": [],
    }
    final = torch.load(work_dir / FINAL_WEIGHTS, weights_only=True)  # the loop's own, gathered
    exported = {f"model.{key}": value for key, value in model.state_dict().items()}
    assert exported.keys() == final.keys()
    assert_close_by_key(exported, final)
    assert (tmp_path / "hf" / "tokenizer.json").is_file()


@pytest.mark.parametrize(
    ("engine", "device_count"),
    [
        ("fairscale", 1),
        ("ddp", 1),
        pytest.param("fairscale", 2, marks=pytest.mark.slow),
        pytest.param("fsdp2", 2, marks=pytest.mark.slow),
    ],
    ids=["fairscale-1", "ddp-1", "fairscale-2", "fsdp2-2"],
)
def test_a_model_only_checkpoint_exports_the_same_weights(
    engine: str, device_count: int, trained, tmp_path: Path, capsys
) -> None:
    """The checkpoint rewritten without its optimizer state, as a finished run leaves it: the
    2-process ones are FairScale's two rank files of padded shards and FSDP2's two ``.distcp``
    files (saved again by one process)."""
    from transformers import AutoModelForCausalLM

    from tango_fairscale.parallel.model_only import model_only_checkpoint
    from tango_fairscale.records.checkpoints import read_manifest

    work_dir = trained(engine, device_count)
    run = tmp_path / "run"
    shutil.copytree(work_dir / "checkpoints", run / "checkpoints")
    before = read_manifest(run / STEP_DIR)
    model_only_checkpoint(run / STEP_DIR)
    after = read_manifest(run / STEP_DIR)
    assert after.model_only and after.identity == before.identity
    assert sum(r.size for r in after.files.values()) < sum(r.size for r in before.files.values())
    code, err = export(capsys, run, tmp_path / "hf")
    assert code == 0, err
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    final = torch.load(work_dir / FINAL_WEIGHTS, weights_only=True)
    exported = {f"model.{key}": value for key, value in model.state_dict().items()}
    assert exported.keys() == final.keys()
    assert_close_by_key(exported, final)


# --- refusals: one line each, naming the file and saying what to change ------------------------


def copy_of_checkpoint(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(source, target)
    return target / STEP_DIR


#: Gives the resumed run (:func:`resumed_run`) to the damages that take files from it.
Other = Callable[[], tuple[Path, Path]]


def the_hf_files(step: Path, other: Other) -> Path:
    return step / "hf"


def a_partial_copy(step: Path, other: Other) -> Path:
    partial = step.parent / ".partial-step0000010"
    shutil.copytree(step, partial)
    return partial


def without(name: str) -> Callable[[Path, Other], Path]:
    def remove(step: Path, other: Other) -> Path:
        if (step / name).is_dir():
            shutil.rmtree(step / name)
        (step / name).unlink(missing_ok=True)
        return step

    return remove


def damaged(name: str) -> Callable[[Path, Other], Path]:
    def damage(step: Path, other: Other) -> Path:
        damage_in_place(step / name)
        return step

    return damage


def truncated(name: str) -> Callable[[Path, Other], Path]:
    def cut(step: Path, other: Other) -> Path:
        truncate(step / name)
        return step

    return cut


def hostile_metadata(step: Path, other: Other) -> Path:
    """A ``.metadata`` whose pickle walks from an allowed module to ``os.system``, the manifest
    forged to match."""
    marker = step / "payload-ran"
    exploit = calling_pickle("torch.distributed.checkpoint.metadata", "os.system", marker)
    (step / ".metadata").write_bytes(exploit)
    reseal(step)
    return step


def another_runs_rank_file(step: Path, other: Other) -> Path:
    """rank0.pt of another run's checkpoint of the same step."""
    replace_file(step / "rank0.pt", other()[1] / "rank0.pt")
    return step


def another_steps_rank_file(step: Path, other: Other) -> Path:
    """rank0.pt of the same run's next checkpoint."""
    work_dir, step5 = other()
    step = step.parents[1] / "same-run" / "checkpoints" / step5.name
    shutil.copytree(step5, step)
    replace_file(step / "rank0.pt", work_dir / "checkpoints" / "step0000010" / "rank0.pt")
    return step


def another_runs_rank_file_resealed(step: Path, other: Other) -> Path:
    """As :func:`another_runs_rank_file`, the manifest forged to match: the file's own identity
    still tells."""
    reseal(another_runs_rank_file(step, other))
    return step


OF_ANOTHER = "(rank0.pt: of another checkpoint (step"
CASES: dict[str, tuple[str, Callable[[Path, Other], Path], str]] = {
    # name: (engine of the run, what to make of a copy of its checkpoint, the message)
    "not a checkpoint": ("fairscale", the_hf_files, "holds no checkpoint"),
    "a partial checkpoint": ("fairscale", a_partial_copy, "is a partial checkpoint"),
    "a missing rank file": ("fairscale", without("rank0.pt"), "is damaged (rank0.pt: missing)"),
    "a truncated rank file": ("fairscale", truncated("rank0.pt"), "(rank0.pt: 1000 bytes, "),
    "same-size damage in a rank file": (
        "fairscale",
        damaged("rank0.pt"),
        "is damaged (rank0.pt: checksum mismatch)",
    ),
    "a rank file of another run, same step": ("fairscale", another_runs_rank_file, OF_ANOTHER),
    "a rank file of the same run, another step": (
        "fairscale",
        another_steps_rank_file,
        f"{OF_ANOTHER} 10 of run",
    ),
    "another run's rank file under a forged manifest": (
        "fairscale",
        another_runs_rank_file_resealed,
        f"{OF_ANOTHER} 5 of run",
    ),
    "a missing distributed checkpoint file": (
        "fsdp2",
        without("__0_0.distcp"),
        "is damaged (__0_0.distcp: missing)",
    ),
    "same-size damage in a .distcp": (
        "fsdp2",
        damaged("__0_0.distcp"),
        "is damaged (__0_0.distcp: checksum mismatch)",
    ),
    "a truncated .distcp": ("fsdp2", truncated("__0_0.distcp"), "(__0_0.distcp: 1000 bytes, "),
    "same-size damage in trainer.pt": (
        "fsdp2",
        damaged("trainer.pt"),
        "is damaged (trainer.pt: checksum mismatch)",
    ),
    "no distributed checkpoint metadata": (
        "fsdp2",
        without(".metadata"),
        "is damaged (.metadata: missing)",
    ),
    "a metadata global outside the allow-list": (
        "fsdp2",
        hostile_metadata,
        "os.system is not part of a distributed checkpoint's metadata",
    ),
    "no model config": ("fairscale", without("hf"), "is damaged (hf/tokenizer.json: missing)"),
    "written before manifests": (
        "fairscale",
        without("manifest.json"),
        "has no manifest.json: it was written before tango_fairscale checksummed its checkpoints",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_refuses_in_one_line(case: str, trained, request, tmp_path: Path, capsys) -> None:
    engine, damage, message = CASES[case]
    other = lambda: request.getfixturevalue("resumed_run")  # noqa: E731
    target = damage(copy_of_checkpoint(trained(engine, 1), tmp_path), other)
    code, err = export(capsys, target, tmp_path / "hf")
    assert code == 2
    assert err.startswith("tango-fairscale: error: ") and err.count("\n") == 1, err
    assert message in err, err
    assert not (tmp_path / "hf").exists()
    assert not list(tmp_path.rglob("payload-ran"))


def test_a_damaged_checkpoint_names_an_earlier_one(resumed_run, tmp_path: Path, capsys) -> None:
    """The newest checkpoint is damaged: export names the one before."""
    run = tmp_path / "run"
    shutil.copytree(resumed_run[0], run)
    damage_in_place(run / "checkpoints" / "step0000010" / "rank0.pt")
    code, err = export(capsys, run, tmp_path / "hf")
    assert code == 2 and err.count("\n") == 1, err
    assert "step0000010 is damaged (rank0.pt: checksum mismatch)" in err, err
    assert f"export an earlier checkpoint ({run / STEP_DIR})" in err, err
    code, err = export(capsys, run / STEP_DIR, tmp_path / "hf")
    assert code == 0, err


def test_export_refuses_a_nonempty_output_directory(trained, tmp_path: Path, capsys) -> None:
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    code, err = export(capsys, trained("fairscale", 1), tmp_path / "hf")
    assert code == 2 and "already exists and is not empty" in err


def test_the_command_imports_torch_only_when_exporting() -> None:
    code = (
        "import sys, tango_fairscale.cli as cli\n"
        "assert 'torch' not in sys.modules, 'imported torch'\n"
        "try:\n    cli.main(['export', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'export --help imported torch'\n"
        "assert cli.main(['export', 'no-such-checkpoint', 'out']) == 2\n"
        "assert 'torch' not in sys.modules, 'a refusal imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "CHECKPOINT_DIR OUT_DIR" in result.stdout
    assert "no-such-checkpoint is not a directory" in result.stderr  # in a tenth of a second


# --- by run name, and a step's result folder (the workspace of test_results.build_workspace) -----


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model_dir: Path, piqa_dir: Path) -> Path:
    from test_results import build_workspace

    return build_workspace(tmp_path_factory.getbasetemp(), tiny_model_dir, piqa_dir)


def test_export_by_run_name_and_result_folder(workspace: Path, tmp_path: Path, capsys) -> None:
    """``--run trained`` (its newest checkpoint, step 4), ``--step 4`` and the result folder
    ``runs/trained/trained_model`` all give the run's trained model."""
    from safetensors.torch import load_file

    from tango_fairscale.records.checkpoints import read_manifest

    result = workspace / "runs" / "trained" / "trained_model"
    expected = load_file(result / "model.safetensors")
    # The run finished: its final checkpoint is kept alone, without its optimizer state.
    assert read_manifest(result / "work" / "checkpoints" / "step0000004").model_only
    ways = {
        "run": ["--run", "trained", "-w", workspace],
        "step": ["--run", "trained", "--step", 4, "-w", workspace],
        "folder": [result],
    }
    for way, arguments in ways.items():
        code, err = export(capsys, *arguments, tmp_path / way)
        assert code == 0, err
        assert "checkpoints/step0000004" in err
        assert_close_by_key(load_file(tmp_path / way / "model.safetensors"), expected)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--run", "suite"], "run 'suite' has no training step (steps: "),
        (["--run", "trained", "--step", "2"], "no checkpoint at step 2; it has steps: 4"),
        (["--run", "nope"], "no run named 'nope' in local://"),
    ],
)
def test_export_by_run_name_refuses_in_one_line(
    workspace: Path, tmp_path: Path, capsys, arguments: list, message: str
) -> None:
    code, err = export(capsys, *arguments, "-w", workspace, tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()
