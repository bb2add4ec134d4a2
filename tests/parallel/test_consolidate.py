"""Offline consolidation (``parallel/consolidate.py``): a checkpoint directory alone gives the full
model's state, checked against the model its ``hf/config.json`` describes, tied weights named
again, and a model built around that state; what it cannot read is refused as a
``CheckpointError`` in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import engine_config
from helpers.checkpoints import reseal, truncate
from tango.common import Lazy, Params
from tango.integrations.torch import Model, TrainConfig, TrainingEngine

from tango_fairscale.parallel.consolidate import (
    _matched_to_model,
    full_state_dict,
    hf_model,
    plain_model,
)
from tango_fairscale.parallel.rank_files import RankFiles
from tango_fairscale.records.checkpoints import (
    CheckpointError,
    Identity,
    Manifest,
    read_manifest,
    write_manifest,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

HEAD, EMBEDDING = "model.lm_head.weight", "model.transformer.wte.weight"


@pytest.fixture
def checkpoint(tmp_path: Path, tiny_model_dir: Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The tiny model's state and a rank-files checkpoint of it."""
    config = TrainConfig("test", tmp_path, world_size=1, devices=[-1])
    model = Lazy(
        Model, Params({"type": "tango_fairscale::causal_lm", "model": str(tiny_model_dir)})
    )
    engine = Lazy(TrainingEngine, Params(engine_config("tango_fairscale::ddp"))).construct(
        train_config=config, model=model
    )
    directory = tmp_path / "step0000005"
    RankFiles().save(engine, directory, {"step": 5}, Identity("run", 5, 1))
    state = {k: v.clone() for k, v in engine.wrapped_model.state_dict().items()}
    return state, directory


def refusal(directory: Path) -> str:
    with pytest.raises(CheckpointError) as error:
        full_state_dict(directory)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_the_full_state_is_the_models(checkpoint) -> None:
    state, directory = checkpoint
    full = full_state_dict(directory)
    assert full.keys() == state.keys()
    assert all(torch.equal(full[key], value) for key, value in state.items())


def test_a_model_is_rebuilt_around_the_state(checkpoint) -> None:
    state, directory = checkpoint
    full = full_state_dict(directory)
    model = hf_model(directory, full)
    assert model.transformer.wte.weight.data_ptr() == full[EMBEDDING].data_ptr()  # no copy
    assert model.lm_head.weight is model.transformer.wte.weight  # tied again
    assert all(not p.is_meta for p in model.parameters())
    wrapper = plain_model(directory, full)
    rebuilt = wrapper.state_dict()
    assert all(torch.equal(rebuilt[key], value) for key, value in state.items())


def test_a_tied_weight_held_once_is_named_again(checkpoint) -> None:
    """FairScale without flattening keeps the shared tensor under one of its names only."""
    state, directory = checkpoint
    once = {key: value for key, value in state.items() if key != HEAD}
    matched = _matched_to_model(once, directory)
    assert matched.keys() == state.keys() and matched[HEAD] is matched[EMBEDDING]


def edit_config(directory: Path, **changes: object) -> None:
    config_file = directory / "hf" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **changes}))
    reseal(directory)  # the digests match: only the model check stands


def test_a_state_of_another_model_is_refused(checkpoint) -> None:
    _, directory = checkpoint
    layers = json.loads((directory / "hf" / "config.json").read_text())["n_layer"]
    edit_config(directory, n_layer=layers + 1)
    message = refusal(directory)
    assert message.startswith(f"{directory} does not match its model config (hf/config.json)")
    assert f"it lacks model.transformer.h.{layers}." in message and ", ..." in message


def test_a_state_of_other_shapes_is_refused(checkpoint) -> None:
    _, directory = checkpoint
    edit_config(directory, vocab_size=7)
    assert "has other shapes for model.lm_head.weight" in refusal(directory)


def test_an_unknown_format_or_no_config_is_refused(checkpoint) -> None:
    _, directory = checkpoint
    manifest = read_manifest(directory)
    write_manifest(directory, Manifest("zip", manifest.identity, manifest.files))
    assert refusal(directory) == (
        f"{directory} is in the 'zip' format, which this tango_fairscale does not know "
        "(it reads rank-files, torch-dcp)"
    )
    write_manifest(directory, manifest)
    (directory / "hf" / "config.json").unlink()
    reseal(directory)
    assert refusal(directory) == (
        f"{directory} carries no model config (hf/config.json): it is not a checkpoint of "
        "tango_fairscale's"
    )


def test_unreadable_files_behind_a_forged_manifest_are_refused(checkpoint) -> None:
    _, directory = checkpoint
    truncate(directory / "rank0.pt")
    reseal(directory)
    assert refusal(directory).startswith(f"cannot read {directory / 'rank0.pt'} (RuntimeError: ")
