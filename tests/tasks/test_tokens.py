"""A task's requests tokenized once per tokenizer (``tango_fairscale::task_tokens``).

* stored and read back, its queries are the ones the scorer encodes itself, at any window (a
  window shorter than some pairs too), and ``task_scores`` given them answers as without them;
* its cache key is the requests' and the tokenizer's files: a second model directory with the
  same tokenizer files and other weights shares it, another tokenizer's files change it; a step
  reads those files once for its key, and the tokens steps of a command load the tokenizer once;
* tokens of another tokenizer or other requests are refused in one line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import save_tiny_gpt2
from helpers.requests import stored_requests
from tango.common.exceptions import ConfigurationError

from tango_fairscale.data.queries import encode_pairs
from tango_fairscale.evaluation import lm as lm_module
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.model.loading import load_tokenizer
from tango_fairscale.tasks.format import TokensFormat
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.tasks.tokens import (
    TaskTokensStep,
    checked_pairs,
    known_queries,
    loglikelihood_pairs,
)

FIXTURE_TASKS = Path(__file__).parents[1] / "fixtures" / "tasks"


@pytest.fixture(scope="module")
def requests() -> dict[str, Any]:
    """ARC-Easy's requests (two-shot: long contexts shared by four choices), stored."""
    return stored_requests(
        TaskSpec(name="arc_easy", data_dir=str(FIXTURE_TASKS / "arc_easy"), num_fewshot=2)
    )


def stored_tokens(requests: dict[str, Any], tokenizer: Path) -> dict[str, Any]:
    """``task_tokens``' result, written and read back by its format."""
    tokens = TaskTokensStep().run(requests=requests, tokenizer=str(tokenizer))
    with tempfile.TemporaryDirectory() as directory:
        TokensFormat().write(tokens, directory)
        return TokensFormat().read(directory)


def test_stored_tokens_are_the_scorers_own_queries_at_any_window(requests, tokenizer_dir) -> None:
    tokens = stored_tokens(requests, tokenizer_dir)
    pairs = checked_pairs(tokens, requests, str(tokenizer_dir))
    assert pairs == loglikelihood_pairs(requests) and len(pairs) > 8
    tokenizer = load_tokenizer(str(tokenizer_dir))
    longest = max(len(query) for query in encode_pairs(tokenizer, pairs, 10**6))
    for max_length in (10**6, longest // 2, 3):  # some contexts, then continuations, cut off
        expected = encode_pairs(tokenizer, pairs, max_length)
        known = known_queries(tokens, pairs, max_length)
        assert [known[pair] for pair in pairs] == expected
        assert [known[pair].unscored for pair in pairs] == [q.unscored for q in expected]
    assert any(query.unscored for query in expected)


def test_scores_given_tokens_are_the_scores_without(requests, tiny_model_dir, monkeypatch) -> None:
    spec = TaskSpec(name="arc_easy", data_dir=str(FIXTURE_TASKS / "arc_easy"), num_fewshot=2)
    tokens = stored_tokens(requests, tiny_model_dir)
    model = ModelWrapper(str(tiny_model_dir))
    alone = TaskScoresStep().run(model=model, task=spec, requests=requests)
    encoded: list[int] = []  # how many pairs the scorer encodes itself, call by call

    def counted(tokenizer: Any, pairs: Any, max_length: int) -> Any:
        encoded.append(len(pairs))
        return encode_pairs(tokenizer, pairs, max_length)

    monkeypatch.setattr(lm_module, "encode_pairs", counted)
    given = TaskScoresStep().run(model=model, task=spec, requests=requests, tokens=tokens)
    assert encoded and not any(encoded)  # every pair came from the tokens
    assert given["results"] == alone["results"]
    assert [s["resps"] for s in given["samples"]["arc_easy"]] == [
        s["resps"] for s in alone["samples"]["arc_easy"]
    ]


def test_the_cache_key_is_the_tokenizers_files_not_the_weights(
    tmp_path, requests, tokenizer_dir
) -> None:
    first = save_tiny_gpt2(tmp_path / "first", tokenizer_dir, seed=1)
    second = save_tiny_gpt2(tmp_path / "second", tokenizer_dir, seed=2)
    assert (first / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()

    def key(tokenizer: Path) -> str:
        return TaskTokensStep(requests=requests, tokenizer=str(tokenizer)).unique_id

    assert key(first) == key(second)
    other = Path(shutil.copytree(first, tmp_path / "other"))
    config = json.loads((other / "tokenizer_config.json").read_text())
    (other / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    assert key(other) != key(first)


def test_the_tokenizer_files_are_read_once_for_a_steps_key(
    requests, tokenizer_dir, monkeypatch
) -> None:
    """Tango asks for a step's unique id at every hash of the step (dozens a command)."""
    from tango_fairscale.tasks import tokens as tokens_module

    reads = []
    fingerprint = tokens_module.tokenizer_fingerprint
    monkeypatch.setattr(
        tokens_module,
        "tokenizer_fingerprint",
        lambda source: reads.append(source) or fingerprint(source),
    )
    step = TaskTokensStep(requests=requests, tokenizer=str(tokenizer_dir))
    keys = {step.unique_id for _ in range(3)} | {str(hash(step)) for _ in range(3)}
    assert len(keys) <= 2 and reads == [str(tokenizer_dir)]


def test_tokens_of_another_tokenizer_or_other_requests_are_refused(
    tmp_path, requests, tokenizer_dir, gpt2_tokenizer_dir
) -> None:
    tokens = stored_tokens(requests, tokenizer_dir)
    with pytest.raises(ConfigurationError, match="another tokenizer than the model's"):
        checked_pairs(tokens, requests, str(gpt2_tokenizer_dir))
    fewer = json.loads(json.dumps(requests))
    fewer["tasks"]["arc_easy"]["documents"].pop()
    with pytest.raises(ConfigurationError, match="other requests than task_scores' own"):
        checked_pairs(tokens, fewer, str(tokenizer_dir))
    with pytest.raises(ConfigurationError, match="task_tokens result"):
        checked_pairs({**tokens, "format": 0}, requests, str(tokenizer_dir))


def test_the_tokens_steps_of_a_command_load_their_tokenizer_once(
    tmp_path, requests, tokenizer_dir, monkeypatch
) -> None:
    """Another task's tokens step reuses the tokenizer; changed tokenizer files are loaded anew."""
    from tango_fairscale.tasks import tokens as tokens_module

    loads = []
    monkeypatch.setattr(
        tokens_module,
        "load_tokenizer",
        lambda source: loads.append(source) or load_tokenizer(source),
    )
    tokens_module.shared_tokenizer.cache_clear()
    directory = Path(shutil.copytree(tokenizer_dir, tmp_path / "tokenizer"))
    first = TaskTokensStep().run(requests=requests, tokenizer=str(directory))
    again = TaskTokensStep().run(requests=requests, tokenizer=str(directory))
    assert len(loads) == 1 and first["ids"].equal(again["ids"])
    (directory / "README.md").write_text("another file: other tokenizer files\n")
    TaskTokensStep().run(requests=requests, tokenizer=str(directory))
    assert len(loads) == 2
    tokens_module.shared_tokenizer.cache_clear()
