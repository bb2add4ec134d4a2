"""Generation on every rank of ``ddp``, ``fairscale`` and ``fsdp2`` (2 CPU processes, each
decoding a share of the prompts through the engine's wrapped model) gives every rank the
single-process answers, text for text, greedy and sampled; every rank calls the model equally
often (the sharded engines' all-gathers need every rank)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, engine_config
from helpers.peaked import save_peaked_model
from helpers.rank_eval import evaluate_on_ranks
from helpers.ranks import two_rank_plan

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.train.loop import TrainRuntime

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(FIXTURES))
from lm_eval_fixtures import DATA_DIR, generation_kwargs, task_config  # noqa: E402


@pytest.fixture(scope="module")
def peaked_gpt2(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    return save_peaked_model(tmp_path_factory.mktemp("peaked-gpt2"), gpt2_tokenizer_dir, "gpt2")


def specs() -> list[TaskSpec]:
    """Greedy gsm8k and coqa (two-shot) and a sampled triviaqa with repeats: 7, 5 and 5 documents,
    so that the ranks' shares differ in size."""
    sampled = generation_kwargs("triviaqa", 10) | {"do_sample": True, "temperature": 0.9}
    return [
        TaskSpec(config=task_config("gsm8k", generation_kwargs=generation_kwargs("gsm8k", 12)),
                 num_fewshot=2, limit=7),
        TaskSpec(config=task_config("coqa", generation_kwargs=generation_kwargs("coqa", 12)),
                 num_fewshot=2, limit=5),
        TaskSpec(config={**task_config("triviaqa", generation_kwargs=sampled), "repeats": 2},
                 limit=5),
    ]  # fmt: skip


def texts(result: dict) -> dict:
    return {
        (task, s["doc_id"], s["filter"]): (s["resps"], s["filtered_resps"])
        for task, samples in result["samples"].items()
        for s in samples
    }


@pytest.mark.parametrize(
    "engine", [pytest.param("ddp", marks=pytest.mark.slow), "fairscale",
               pytest.param("fsdp2", marks=pytest.mark.slow)],
)  # fmt: skip
def test_every_rank_gets_the_single_process_answers(
    engine: str, tmp_path: Path, peaked_gpt2: Path
) -> None:
    assert DATA_DIR  # the fixtures are importable
    fields = engine_config(f"tango_fairscale::{engine}")
    runtime = TrainRuntime(eval_batch_size=3)
    plan = two_rank_plan("ranks", tmp_path, peaked_gpt2, fields, runtime)
    ranks = evaluate_on_ranks(plan, specs(), batch_size=3)
    alone = ModelWrapper(str(peaked_gpt2))
    expected = [TaskScoresStep().run(model=alone, task=spec, batch_size=4) for spec in specs()]
    assert ranks[0]["calls"] == ranks[1]["calls"] > 0
    for rank in ranks:
        for got, want in zip(rank["results"], expected, strict=True):
            assert texts(got) == texts(want)
            assert got["results"] == want["results"]
