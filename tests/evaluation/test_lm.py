"""The package's lm-eval ``LM`` (``tango_fairscale.evaluation.lm``): a continuation longer than
the model's window, which lm-eval's HF backend refuses, is scored on its last tokens with a
warning that counts such continuations, once per call, and the count is in the step's results."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from tango.common.dataset_dict import DatasetDict

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec


def test_continuations_longer_than_the_window_are_counted_and_warned_of_once(
    tokenizer_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from helpers.tokenizer import vocabulary_fields

    config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "n_positions": 16}
    model = ModelWrapper(
        config={**config, **vocabulary_fields(tokenizer_dir)}, seed=0, tokenizer=str(tokenizer_dir)
    )
    long_solution = " ".join(["umbrella"] * 40)  # far more than 16 tokens
    documents = [
        {"goal": "stay dry", "sol1": "use an umbrella", "sol2": long_solution, "label": 0},
        {"goal": "cut paper", "sol1": long_solution, "sol2": long_solution + " now", "label": 1},
        {"goal": "open a jar", "sol1": "twist the lid", "sol2": "hit it", "label": 0},
    ]
    task = TaskSpec(name="piqa", dataset=DatasetDict(splits={"validation": documents}))
    with caplog.at_level(logging.WARNING, logger="tango_fairscale.evaluation.lm"):
        scores = TaskScoresStep().run(model=model, task=task, batch_size=4)
    warnings = [r.getMessage() for r in caplog.records if "continuations" in r.getMessage()]
    assert warnings == [
        "3 of 6 continuations are longer than the model's 16-token window: each is scored on "
        "its last 16 tokens only (lm-eval's HF backend refuses them)"
    ]
    assert scores["truncated_continuations"] == 3


@pytest.mark.parametrize("packed", [False, True])
def test_choices_equal_after_truncation_tie_exactly_and_the_first_wins(
    tiny_model_dir: Path, piqa_small: DatasetDict, packed: bool
) -> None:
    """Two choices whose scored tokens are the same (they differ only in what left truncation
    cut: PIQA's 30th validation document under a 128-token window) are one request: equal to
    the bit whatever their batch-mates (packed beside others they were 1e-9 apart), so lm-eval's
    argmax takes the first, as on a tie in its own padded batches."""
    from tango_fairscale.data.queries import encode_pair

    model = ModelWrapper(str(tiny_model_dir))
    documents = list(piqa_small["validation"])
    ties = [
        index
        for index, doc in enumerate(documents)
        if len(
            {
                encode_pair(model.tokenizer, f"Question: {doc['goal']}\nAnswer:", f" {sol}", 128)
                for sol in (doc["sol1"], doc["sol2"])
            }
        )
        == 1
    ]
    assert ties == [29]
    task = TaskSpec(name="piqa", dataset=DatasetDict(splits={"validation": documents}))
    result = TaskScoresStep().run(model=model, task=task, batch_size=8, pack_sequences=packed)
    [tie] = [sample for sample in result["samples"]["piqa"] if sample["doc_id"] == 29]
    first, second = (response[0][0] for response in tie["resps"])
    assert first == second
    assert tie["acc"] == float(documents[29]["label"] == 0)  # the first choice wins the tie
