"""Options for speed (packed batches, fused AdamW) and ``bf16-mixed`` under sharding on 2
processes follow DDP: parity runs (``tests/helpers/parity.py``), trained with the others of their
world size in one process group; packed DDP in the default tier."""

import pytest
import torch
from conftest import assert_same_run
from helpers.parity import DDP, RunSpec, define, run_param
from helpers.parity import STEPS as PARITY_STEPS

from tango_fairscale.model.causal_lm import ModelWrapper

FUSED_ADAMW = {"optimizer": {"type": "torch::AdamW", "lr": 1e-3, "fused": True}}


def speed_run(engine: str, option: str) -> str:
    """``packed``: packed micro-batches and validation; ``fused``: fused AdamW, checkpointed
    half-way (its state saved mid-run and the run going on)."""
    if option == "packed":
        spec = RunSpec(engine, 2, pack_sequences=True)
    else:
        spec = RunSpec(engine, 2, checkpoint_every=PARITY_STEPS // 2, engine_params=FUSED_ADAMW)
    return define(f"{engine}/{option}", spec)


@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP, id=name.replace("/", "-"), slow=name != "ddp/packed")
        for name in [
            speed_run("ddp", "packed"),
            speed_run("fairscale", "packed"),
            speed_run("fsdp2", "packed"),
            speed_run("fairscale", "fused"),
            speed_run("fsdp2", "fused"),
        ]
    ],
)
def test_speed_options_reproduce_ddp(run, trained_run) -> None:
    """Options for speed, not results, on 2 processes reproduce padded DDP with torch's default
    AdamW (losses, weights, accuracies): ``pack_sequences`` (packed micro-batches and packed
    validation) through every engine that takes them, and fused AdamW (docs/ENGINES.md
    recommends it on GPUs) stepping FairScale's flat parameters and FSDP2's sharded ones in one
    kernel, through a checkpoint written half-way."""
    assert_same_run(trained_run(DDP), trained_run(run))


BF16 = {"precision": "bf16-mixed"}


DDP_BF16 = define("ddp/bf16-mixed", RunSpec("ddp", 2, engine_params=BF16))


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    [
        run_param(name, name, DDP_BF16, id=engine)
        for engine in ("fairscale", "fsdp2")
        for name in [
            define(
                f"{engine}/bf16-mixed",
                RunSpec(
                    engine,
                    2,
                    engine_params={**BF16, "sharding": {"activation_checkpointing": True}},
                ),
            )
        ]
    ],
)
def test_bf16_mixed_sharded_training_follows_ddp_autocast(run, trained_run, tiny_model_dir) -> None:
    """``bf16-mixed`` under sharding (bf16 compute, fp32 master weights and gradient reduction;
    checkpointed units) on 2 processes tracks DDP under bf16 autocast to bf16's rounding (measured:
    losses within 3e-5 relative, the models 0.8 % of the distance trained apart), and the
    consolidated weights are the fp32 masters."""
    trained, ddp_bf16_reference = trained_run(run), trained_run(DDP_BF16)
    losses = [r["train_loss"] for r in trained.training_log if "train_loss" in r]
    reference = [r["train_loss"] for r in ddp_bf16_reference.training_log if "train_loss" in r]
    assert len(losses) == len(reference) == 10
    assert losses == pytest.approx(reference, rel=1e-3)
    # Adam's steps are about lr each whatever the gradient, so bf16's rounding moves single
    # weights by up to a few steps: compare the whole model's distance to DDP's with how far
    # DDP's training moved it.
    start = ModelWrapper(str(tiny_model_dir)).state_dict()
    expected = ddp_bf16_reference.state_dict()
    state = trained.state_dict()
    assert all(value.dtype == torch.float32 for value in state.values())
    apart = sum(float((state[k] - expected[k]).square().sum()) for k in expected) ** 0.5
    moved = sum(float((expected[k] - start[k]).square().sum()) for k in expected) ** 0.5
    assert apart < 0.05 * moved, (apart, moved)
