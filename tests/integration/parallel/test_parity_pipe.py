"""The pipe engine (2 CPU stages, 4 micro-batches) reproduces DDP for GPT-2 and every other
family it splits, and resumes to DDP's run.

The parity runs (``tests/helpers/parity.py``) of one process train one after another in this
process, beside the 2-process group of the DDP references; GPT-2 without checkpointing and the
llama family are in the default tier."""

from pathlib import Path

import pytest
import torch
from conftest import assert_same_run, assert_same_training, train_in
from helpers.families import FAMILY_CONFIGS
from helpers.parity import DDP, DDP_20, RunSpec, define, run_param, trains

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.records.training_log import read_training_log

PIPE = "tango_fairscale::pipe"

PIPE_BLOCK = {"balance": [1, 1], "chunks": 4, "devices": ["cpu", "cpu"]}
PIPE_PARAMS = {"pipe": PIPE_BLOCK}  # the engine's own keys, in its ``pipe`` block


def pipe_run(name: str, model: str = "tiny", **pipe) -> str:
    spec = RunSpec("pipe", 1, model=model, engine_params={"pipe": {**PIPE_BLOCK, **pipe}})
    return define(f"pipe/{name}", spec)


@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP, id=checkpoint, slow=checkpoint != "never")
        for checkpoint in ("never", "always", "except_last")
        for name in [pipe_run(f"checkpoint-{checkpoint}", checkpoint=checkpoint)]
    ],
)
def test_pipe_matches_ddp(run, trained_run, tiny_model_dir) -> None:
    """Training and in-loop validation through the pipe equal 2-process DDP: per-step losses,
    final weights (consolidated under the HF key names, loaded strictly) and PIQA accuracies."""
    reference, trained = trained_run(DDP), trained_run(run)
    assert_same_run(reference, trained)
    # The embedding and the LM head are still one parameter after consolidation.
    model = loaded(tiny_model_dir, trained).model
    assert model.lm_head.weight is model.transformer.wte.weight
    untrained = ModelWrapper(str(tiny_model_dir))
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            untrained.state_dict(), reference.state_dict(), atol=1e-5, rtol=0
        )


def loaded(model_dir: Path, trained) -> ModelWrapper:
    """The model with a run's final weights, loaded strictly (as the training step returns it)."""
    model = ModelWrapper(str(model_dir))
    model.load_state_dict(trained.state_dict())
    return model


@pytest.mark.slow
@trains(DDP_20)
def test_resume_matches_ddp(trained_run, tmp_path, tiny_model_dir, piqa_small) -> None:
    """Stop at step 10, resume to 20: the head's copy of the tied embedding is reloaded too."""
    train_in(tmp_path, tiny_model_dir, piqa_small, PIPE, 1, 10, **PIPE_PARAMS)
    train_in(tmp_path, tiny_model_dir, piqa_small, PIPE, 1, 20, **PIPE_PARAMS)
    state = torch.load(tmp_path / "final_weights.pt", weights_only=True)
    log = read_training_log(tmp_path / "training_log.jsonl")
    assert_same_training(trained_run(DDP_20), log, state)


OTHER_FAMILIES = sorted(set(FAMILY_CONFIGS) - {"gpt2", "llama"})


def family_runs(name: str) -> tuple[str, str]:
    """The family's DDP reference (one process) and its pipe run."""
    ddp = define(f"family/{name}/ddp", RunSpec("ddp", 1, model=name))
    return ddp, pipe_run(f"family/{name}", model=name, checkpoint="except_last")


@pytest.mark.parametrize(
    "name",
    [
        run_param(name, *family_runs(name), id=name, slow=name != "llama")
        for name in ["llama", *OTHER_FAMILIES]
    ],
)
def test_family_matches_ddp(name, trained_run, family_model_dir) -> None:
    """Training (clipping, validation) through 2 CPU stages and 4 micro-batches, checkpointing
    all but the last, equals DDP's losses, weights and accuracies; a tied head stays tied."""
    model_dir = family_model_dir(name)
    ddp, pipe = family_runs(name)
    reference, trained = trained_run(ddp), trained_run(pipe)
    assert_same_run(reference, trained)
    untrained = ModelWrapper(str(model_dir))
    assert is_tied(loaded(model_dir, trained).model) == is_tied(untrained.model)
    trained_state = trained.state_dict()
    moved = max((trained_state[k] - v).abs().max() for k, v in untrained.state_dict().items())
    assert moved > 1e-3  # the comparison is not between two untrained models


def is_tied(model) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight
