"""The sharded engines with ``float8`` on two processes (CPU, gloo; float8 emulated): every
rank's wrapped model holds the float8 projections, trains, and the full model state gathered
from the shards has the plain model's keys (checkpoints and exports unchanged)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import engine_config
from helpers.float8_ranks import train_on_ranks
from helpers.ranks import two_rank_plan

pytest.importorskip("torchao.float8")


@pytest.mark.slow  # two spawned processes
@pytest.mark.parametrize("engine_name", ["fairscale", "fsdp2"])
def test_sharded_engines_train_float8_layers_on_two_ranks(
    tmp_path: Path, tiny_model_dir: Path, engine_name: str
) -> None:
    from transformers import AutoModelForCausalLM

    fields = engine_config(
        f"tango_fairscale::{engine_name}", precision="bf16-mixed", float8="tensorwise"
    )
    reports = train_on_ranks(two_rank_plan("float8", tmp_path / "run", tiny_model_dir, fields))
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for report in reports:
        assert report["layers"] == 2 * 4  # the tiny GPT-2's two blocks, four projections each
        assert all(math.isfinite(loss) for loss in report["losses"])
        assert report["losses"][1] != report["losses"][0]  # the first step changed the weights
    assert reports[0]["keys"] == sorted(f"model.{key}" for key in plain.state_dict())
