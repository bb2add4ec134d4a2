"""Scoring on every rank of a process group (2 CPU processes, each scoring a contiguous slice of
the requests through the engine's wrapped model) gives every rank the single-process scores,
at log-likelihoods in the thousands (``helpers/steep.py``): within 1e-4 of one request scored
alone, whatever the world size puts beside it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import engine_config, save_tiny_gpt2
from helpers.rank_eval import evaluate_on_ranks
from helpers.ranks import two_rank_plan
from helpers.steep import STEEP
from helpers.tokenizer import BYTES, MERGES

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.train.loop import TrainRuntime


def long_random_task(directory: Path, tokenizer) -> TaskSpec:
    """A ``loglikelihood`` task of 11 documents: random text (decoded random merge tokens) after
    short random contexts, continuations of 5 to ~175 tokens."""
    rng = random.Random(0)

    def text(count: int) -> str:
        return tokenizer.decode([rng.randrange(BYTES, BYTES + MERGES) for _ in range(count)])

    rows = [
        {"context": text(rng.randrange(2, 15)), "target": text(length)}
        for length in (5, 175, 40, 120, 160, 15, 90, 170, 60, 150, 110)
    ]
    path = directory / "long.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return TaskSpec(
        config={
            "task": "long_random",
            "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(path)}},
            "test_split": "test",
            "output_type": "loglikelihood",
            "doc_to_text": "{{context}}",
            "doc_to_target": "{{target}}",
            "target_delimiter": "",
            "metric_list": [{"metric": "acc"}],  # (perplexity: exp(1000) overflows)
        }
    )


def scores(result: dict) -> np.ndarray:
    samples = sorted(result["samples"]["long_random"], key=lambda sample: sample["doc_id"])
    return np.array([sample["resps"][0][0][0] for sample in samples])


@pytest.mark.slow  # two spawned processes
@pytest.mark.parametrize("engine", ["ddp", "fairscale"])
@pytest.mark.parametrize("packed", [False, True])
def test_every_rank_gets_the_scores_of_requests_scored_alone(
    engine: str, packed: bool, tmp_path: Path, tokenizer_dir: Path
) -> None:
    model_dir = save_tiny_gpt2(tmp_path / "model", tokenizer_dir, **STEEP)
    alone_model = ModelWrapper(str(model_dir))
    spec = long_random_task(tmp_path, alone_model.tokenizer)
    alone = scores(TaskScoresStep().run(model=alone_model, task=spec, batch_size=1))
    assert 1_000 < np.abs(alone).max() <= 2_000
    fields = engine_config(f"tango_fairscale::{engine}")
    runtime = TrainRuntime(eval_batch_size=3)
    plan = two_rank_plan("ranks", tmp_path / "run", model_dir, fields, runtime)
    ranks = evaluate_on_ranks(plan, [spec], batch_size=3, packed=packed)
    for rank in ranks:
        [result] = rank["results"]
        np.testing.assert_allclose(scores(result), alone, rtol=0, atol=1e-4)
