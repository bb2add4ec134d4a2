"""What the training step leaves on disk once its run finished (``train/step.py``): its final
checkpoint alone, without optimizer state unless ``keep_optimizer_state``, verified and exporting
the stored model's weights; no ``final_weights.pt``. A finished run whose result was not stored
is not trained again. One process per run (2-process checkpoints: ``tests/test_export.py``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import assert_close_by_key, train_tiny

from tango_fairscale.cli import main
from tango_fairscale.parallel.consolidate import FORMATS
from tango_fairscale.records.checkpoints import read_manifest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

ENGINES = ["tango_fairscale::ddp", "tango_fairscale::fairscale", "tango_fairscale::fsdp2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir: Path, piqa_small):
    """``finished(engine, **step_options)``: the workspace of a finished 20-step run (checkpoints
    every 5, the default 2 kept while training), made once per module."""
    runs: dict[str, Path] = {}

    def run(engine: str, **step_options: object) -> Path:
        key = f"{engine}-{sorted(step_options.items())}"
        if key not in runs:
            workspace = tmp_path_factory.mktemp(engine.split("::")[1])
            train_tiny(workspace, tiny_model_dir, piqa_small, engine, step_options=step_options)
            runs[key] = workspace
        return runs[key]

    return run


def work_dir(workspace: Path) -> Path:
    [work] = workspace.glob("cache/TrainStep-*/work")
    return work


def exported(capsys, source: Path, out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    capsys.readouterr()
    assert main(["export", str(source), str(out)]) == 0, capsys.readouterr().err
    return load_file(out / "model.safetensors")


@pytest.mark.parametrize("engine", ENGINES, ids=lambda engine: engine.split("::")[1])
def test_a_finished_run_keeps_its_final_checkpoint_without_optimizer_state(
    engine: str, finished, tmp_path: Path, capsys
) -> None:
    from safetensors.torch import load_file

    workspace = finished(engine)
    work = work_dir(workspace)
    checkpoints = work / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == [
        "latest",
        "run_id",
        "step0000020",
    ]
    assert sorted(path.name for path in work.iterdir()) == [
        "checkpoints",
        "run_info.json",
        "training_log.jsonl",
    ]
    final = checkpoints / "step0000020"
    manifest = read_manifest(final)
    assert manifest.model_only and manifest.identity.step == 20
    FORMATS[manifest.format]().verify(final, manifest)
    if manifest.format == "rank-files":
        assert "optimizer" not in torch.load(final / "rank0.pt", weights_only=True)
    else:
        from tango_fairscale.parallel.safe_load import read_dcp_metadata

        metadata = read_dcp_metadata((final / ".metadata").read_bytes())
        assert metadata.state_dict_metadata and not [
            key for key in metadata.state_dict_metadata if not key.startswith("model.")
        ]
    stored = load_file(work.parent / "model.safetensors")
    assert_close_by_key(exported(capsys, work.parent, tmp_path / "by-folder"), stored)
    assert_close_by_key(exported(capsys, final, tmp_path / "by-step"), stored)


def test_keep_optimizer_state_keeps_it_and_is_not_part_of_the_cache_key(
    finished, tiny_model_dir: Path, piqa_small
) -> None:
    workspace = finished("tango_fairscale::ddp", keep_optimizer_state=True)
    checkpoints = work_dir(workspace) / "checkpoints"
    assert sorted(path.name for path in checkpoints.glob("step*")) == ["step0000020"]
    assert not read_manifest(checkpoints / "step0000020").model_only
    state = torch.load(checkpoints / "step0000020" / "rank0.pt", weights_only=True)
    assert state["optimizer"]["state"]  # AdamW's moments, to continue training from
    assert not (work_dir(workspace) / "final_weights.pt").exists()
    default = finished("tango_fairscale::ddp")
    assert work_dir(workspace).parent.name == work_dir(default).parent.name  # the same step id


def test_a_finished_run_whose_result_was_not_stored_is_not_trained_again(
    finished, tmp_path: Path, tiny_model_dir: Path, piqa_small, monkeypatch
) -> None:
    """The step's process stopped after the run finished (its files given back) and before
    Tango stored the result: the rerun consolidates the final checkpoint instead of training."""
    from safetensors.torch import load_file

    import tango_fairscale.train.step as step_module

    source = work_dir(finished("tango_fairscale::fsdp2"))
    target = tmp_path / "cache" / source.parent.name / "work"
    shutil.copytree(source, target)
    log = (target / "training_log.jsonl").read_text()

    def no_training(plan) -> None:
        raise AssertionError("trained again")

    monkeypatch.setattr(step_module, "run_training", no_training)
    train_tiny(tmp_path, tiny_model_dir, piqa_small, "tango_fairscale::fsdp2")
    assert (target / "training_log.jsonl").read_text() == log
    stored = load_file(target.parent / "model.safetensors")
    assert_close_by_key(stored, load_file(source.parent / "model.safetensors"))
    records = [json.loads(line) for line in (target.parent / "training_log.jsonl").open()]
    assert records[-1]["step"] == 20


def test_a_finished_run_that_kept_its_optimizer_state_is_not_trained_again(
    finished, tmp_path: Path, tiny_model_dir: Path, piqa_small
) -> None:
    """As above with ``keep_optimizer_state``: the rerun resumes from the final checkpoint, has
    no step left to train and consolidates it again (``final_weights.pt`` was deleted)."""
    from safetensors.torch import load_file

    options = {"keep_optimizer_state": True}
    source = work_dir(finished("tango_fairscale::ddp", **options))
    target = tmp_path / "cache" / source.parent.name / "work"
    shutil.copytree(source, target)
    log = (target / "training_log.jsonl").read_text()
    train_tiny(tmp_path, tiny_model_dir, piqa_small, step_options=options)
    assert (target / "training_log.jsonl").read_text() == log  # no step trained or validated
    stored = load_file(target.parent / "model.safetensors")
    assert_close_by_key(stored, load_file(source.parent / "model.safetensors"))
    assert not read_manifest(target / "checkpoints" / "step0000020").model_only
    assert not (target / "final_weights.pt").exists()


@pytest.mark.parametrize(
    "engine_fields, arguments, message",
    [
        ({"shardng": {}}, {"train_steps": 10}, "did you mean 'sharding'"),
        ({}, {"train_steps": 0}, "train_steps must be a positive integer"),
        ({}, {"train_steps": 10, "validate_every": -1}, "validate_every must be"),
        ({}, {"train_steps": 10, "max_gen_toks": 0}, "max_gen_toks must be"),
    ],
)
def test_settings_and_engine_are_refused_when_the_step_is_built(
    tiny_model_dir: Path, engine_fields: dict, arguments: dict, message: str
) -> None:
    """Tango builds every step of a config before it runs any: a refusal here comes before the
    first ``Starting step``."""
    from conftest import engine_config
    from tango.common import Lazy, Params
    from tango.common.exceptions import ConfigurationError
    from tango.integrations.torch import Model, TrainingEngine

    from tango_fairscale.tasks.lm_eval import TaskSpec
    from tango_fairscale.train.step import TrainStep

    model = Lazy(
        Model, Params({"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)})
    )
    fields = engine_config("tango_fairscale::fairscale", **engine_fields)
    engine = Lazy(TrainingEngine, Params(fields))
    with pytest.raises(ConfigurationError, match=message):
        TrainStep(model=model, engine=engine, task=TaskSpec(name="piqa"), **arguments)
    TrainStep(
        model=model,
        engine=Lazy(TrainingEngine, Params(engine_config(fields["type"]))),
        task=TaskSpec(name="piqa"),
        train_steps=10,
    )
