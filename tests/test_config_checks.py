"""What the configs refuse or decide when Jsonnet evaluates them, before Tango builds a step:
``-D precision`` is checked even when only the scoring step reads it (``train_steps=0``), and
every step packs where the model can (``pack_sequences: null``, the training step's in its
``runtime`` block)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tango.common import Params

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ["configs/gpt2_piqa.jsonnet", "configs/mc_suite.jsonnet"]
DEFAULTS = yaml.safe_load((REPO_ROOT / "tango.yml").read_text())["environment"]


def evaluate(config: str, **variables: str) -> dict:
    return Params.from_file(REPO_ROOT / config, ext_vars={**DEFAULTS, **variables}).as_dict()


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("train_steps", ["0", "5"])
def test_a_bogus_precision_is_refused(config: str, train_steps: str) -> None:
    with pytest.raises(RuntimeError, match='-D precision must be one of auto, 32-true, .*"bogus"'):
        evaluate(config, precision="bogus", train_steps=train_steps)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("engine", ["fairscale", "pipe"])
def test_every_step_packs_where_the_model_can(config: str, engine: str) -> None:
    steps = evaluate(config, train_steps="5", engine=engine)["steps"]
    blocks = [step.get("runtime", step) for step in steps.values()]
    packing = [block["pack_sequences"] for block in blocks if "pack_sequences" in block]
    assert len(packing) >= 2 and set(packing) == {None}
