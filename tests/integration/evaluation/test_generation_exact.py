"""The package's generated text equals lm-evaluation-harness's own HF backend, request by request.

For seven generation task formats from lm-eval's task folder (gsm8k, gsm8k_cot, triviaqa,
nq_open, drop, coqa, bbh_cot_fewshot_word_sorting) on local fixtures in each dataset's real
schema (``tests/fixtures/tasks``: contexts longer than the window, stop sequences inside answers
and few-shot targets, unicode), zero- and two-shot, ``tango_fairscale::task_scores`` and
``lm_eval.simple_evaluate(model="hf")`` greedy in float32 on the same seeded tiny models (a GPT-2
and a Llama with tied embeddings, their distributions peaked: ``helpers/peaked.py``) get the same
requests, identical generated text, the same filtered responses, per-document metrics and
aggregated metrics. The tasks are lm-eval's own YAMLs included by a local copy that lowers
``max_gen_toks`` to 24 (the models' window is 128 tokens, so long prompts are left-truncated to
104). lm-eval runs at batch size 1; the package decodes batches of up to 16 left-padded prompts.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import REPO_ROOT, lm_eval_as_released
from helpers.peaked import save_peaked_model
from helpers.requests import scores_with_stored_requests

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(FIXTURES))
from lm_eval_fixtures import (  # noqa: E402
    DATA_DIR,
    GENERATION_TASKS,
    generation_kwargs,
    task_config,
    task_manager,
    write_generation_yaml,
)

MAX_GEN_TOKS = 24


@pytest.fixture(scope="module")
def peaked_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path):
    """``peaked_dir(family)``: the saved peaked tiny model of ``family`` (built once)."""
    saved: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in saved:
            directory = tmp_path_factory.mktemp(f"peaked-{family}")
            saved[family] = save_peaked_model(directory, gpt2_tokenizer_dir, family)
        return saved[family]

    return get


def reference(model_dir: Path, tasks: list[str], num_fewshot: int, limit: int | None) -> dict:
    """lm-eval's own evaluation: its HF backend in fp32 on the CPU, batch size 1, greedy."""
    import lm_eval

    torch.set_num_threads(1)
    configs = [
        task_config(task, generation_kwargs=generation_kwargs(task, MAX_GEN_TOKS)) for task in tasks
    ]
    with lm_eval_as_released():
        return lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model_dir},dtype=float32",
            tasks=configs,
            task_manager=task_manager(),
            num_fewshot=num_fewshot,
            limit=limit,
            device="cpu",
            batch_size=1,
            log_samples=True,
        )


def ours(model: ModelWrapper, task: str, yaml_dir: Path, num_fewshot: int, limit: int | None):
    spec = TaskSpec(
        yaml=str(write_generation_yaml(task, yaml_dir, MAX_GEN_TOKS)),
        data_dir=str(FIXTURES / DATA_DIR[task]),
        num_fewshot=num_fewshot,
        limit=limit,
    )
    return scores_with_stored_requests(model, spec, batch_size=16)  # as the configs score


def assert_same(task: str, expected: dict, got: dict) -> None:
    """The same requests, generated texts, filtered responses and per-document metrics (per
    filter), and the same aggregated results (every ``metric,filter`` key, stderr included)."""
    key = lambda sample: (sample["doc_id"], sample["filter"])  # noqa: E731
    mine = {key(sample): sample for sample in got["samples"][task]}
    theirs = expected["samples"][task]
    assert sorted(mine) == sorted(key(sample) for sample in theirs), task
    for sample in theirs:
        have = mine[key(sample)]
        where = (task, *key(sample))
        assert have["arguments"] == [list(arguments) for arguments in sample["arguments"]], where
        assert have["resps"] == sample["resps"], where
        assert have["filtered_resps"] == sample["filtered_resps"], where
        for metric in sample["metrics"]:
            assert have[metric] == sample[metric], (*where, metric)
    wanted = {k: v for k, v in expected["results"][task].items() if "," in k}
    results = {k: v for k, v in got["results"][task].items() if "," in k}
    assert results.keys() == wanted.keys(), task
    for name, value in wanted.items():
        assert results[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (task, name)


def generated_texts(result: dict, task: str) -> list[str]:
    return [sample["resps"][0][0] for sample in result["samples"][task]]


def check_suite(model_dir: Path, tmp_path: Path, tasks: list[str], shots: int, limit: Any) -> None:
    expected = reference(model_dir, tasks, shots, limit)
    model = ModelWrapper(str(model_dir))
    for task in tasks:
        assert_same(task, expected, ours(model, task, tmp_path, shots, limit))


def test_gsm8k_and_triviaqa_equal_lm_eval_on_gpt2(peaked_dir: Any, tmp_path: Path) -> None:
    """The default tier's comparison: two formats, six documents each, zero-shot."""
    check_suite(peaked_dir("gpt2"), tmp_path, ["gsm8k", "triviaqa"], 0, 6)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("shots", [0, 2])
def test_every_generation_format_equals_lm_eval(
    peaked_dir: Any, tmp_path: Path, family: str, shots: int
) -> None:
    check_suite(peaked_dir(family), tmp_path, GENERATION_TASKS, shots, None)


#: A ChatML-like template that starts with the BOS text (as Llama 3's does), system role allowed.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_chat_template(source: Path, directory: Path) -> Path:
    """A copy of the model at ``source`` whose tokenizer has :data:`CHAT_TEMPLATE`."""
    import shutil

    from transformers import AutoTokenizer

    shutil.copytree(source, directory)
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.slow
def test_chat_template_and_system_instruction_equal_lm_eval(
    peaked_dir: Any, tmp_path: Path
) -> None:
    """lm-eval's ``apply_chat_template`` (few-shot examples as turns) and ``system_instruction``:
    the same chat-formatted requests, generated texts (gsm8k) and log-likelihoods (arc_easy)."""
    import lm_eval

    model_dir = with_chat_template(peaked_dir("gpt2"), tmp_path / "chat")
    system = "You answer in one line. Réponds brièvement."
    configs = [
        task_config("gsm8k", generation_kwargs=generation_kwargs("gsm8k", MAX_GEN_TOKS)),
        task_config("arc_easy"),
    ]
    with lm_eval_as_released():
        expected = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={model_dir},dtype=float32,logits_cache=False",
            tasks=configs,
            task_manager=task_manager(),
            num_fewshot=2,
            limit=4,
            device="cpu",
            batch_size=1,
            log_samples=True,
            apply_chat_template=True,
            system_instruction=system,
            fewshot_as_multiturn=True,
        )
    model = ModelWrapper(str(model_dir))
    for config in configs:
        name = config["task"]
        spec = TaskSpec(config=config, num_fewshot=2, limit=4, apply_chat_template=True,
                        system_instruction=system)  # fmt: skip
        got = TaskScoresStep().run(model=model, task=spec, batch_size=16)
        theirs = {(s["doc_id"], s["filter"]): s for s in expected["samples"][name]}
        for sample in got["samples"][name]:
            want = theirs[(sample["doc_id"], sample["filter"])]
            assert sample["arguments"] == [list(a) for a in want["arguments"]]
            assert sample["arguments"][0][0].startswith("<|endoftext|><|im_start|>system\n")
            if name == "gsm8k":
                assert sample["resps"] == want["resps"]
            else:
                for (have,), (wanted,) in zip(sample["resps"], want["resps"], strict=True):
                    assert have[0] == pytest.approx(wanted[0], abs=1e-4)
                    assert have[1] == wanted[1]
            assert {m: sample[m] for m in want["metrics"]} == {m: want[m] for m in want["metrics"]}
