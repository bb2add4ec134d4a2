"""The package's scores equal lm-evaluation-harness's own HF backend, request by request.

For nine task formats (piqa, arc_easy, hellaswag, winogrande, openbookqa, sciq, boolq, copa,
mmlu_anatomy) on the local fixtures in each task's real schema (``tests/fixtures/tasks``), zero-
and two-shot, ``tango_fairscale::task_scores`` (given its requests by ``task_requests``, stored
and read back, as the configs run it; building them itself where it says so) and
``lm_eval.simple_evaluate(model="hf")`` on the same seeded tiny models get the same requests,
log-likelihoods within 1e-4, the same greedy flags, per-document metric values and aggregated
metrics (stderr included). HFLM runs with
``logits_cache=False``: with its one-token cache on, it scores the shorter of two requests that
share ``context + continuation[:-1]`` on the wrong positions (fixture winogrande 4 and 5 —
shown below). A ``loglikelihood`` task whose continuations are the model's own greedy tokens and
a ``loglikelihood_rolling`` task cover the other two output types. At log-likelihoods in the
thousands (random tokens through a steep tiny GPT-2), every batching's scores are within 1e-4 of
the exact sum of lm-eval's own per-token log-probabilities — lm-eval's answer, their float32 sum,
is itself up to ~2e-4 off that sum there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import REPO_ROOT, lm_eval_as_released
from helpers.requests import scores_with_stored_requests
from helpers.steep import STEEP, exact_log_likelihood, random_queries, token_log_probs

from tango_fairscale.evaluation.call import EvalOptions
from tango_fairscale.evaluation.scoring import score_queries
from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.tasks.lm_eval import TaskSpec

FIXTURES = REPO_ROOT / "tests" / "fixtures" / "tasks"
sys.path.insert(0, str(FIXTURES))
from lm_eval_fixtures import DATA_DIR, TASKS, task_config, task_manager  # noqa: E402

LLAMA = {
    "model_type": "llama",
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}


def save_model(directory: Path, tokenizer_dir: Path, config: dict[str, Any]) -> Path:
    """A seeded tiny model saved with a tokenizer that names its BOS/EOS (lm-eval needs them)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.eos_token = tokenizer.bos_token = "<|endoftext|>"
    config = dict(config)
    hf_config = AutoConfig.for_model(config.pop("model_type"), vocab_size=len(tokenizer), **config)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(hf_config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": 128}
    return save_model(tmp_path_factory.mktemp("gpt2"), gpt2_tokenizer_dir, gpt2)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    return save_model(tmp_path_factory.mktemp("llama"), gpt2_tokenizer_dir, LLAMA)


def reference(model_dir: Path, configs: list[dict], num_fewshot: int, **options: Any) -> dict:
    """lm-eval's own evaluation: its HF backend in fp32 on the CPU."""
    import lm_eval

    torch.set_num_threads(1)
    model_args = f"pretrained={model_dir},dtype=float32,logits_cache=False"
    for key, value in options.items():
        model_args = model_args.replace("logits_cache=False", f"{key}={value}")
    with lm_eval_as_released():
        return lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=configs,
            task_manager=task_manager(),
            num_fewshot=num_fewshot,
            device="cpu",
            batch_size=1,  # no padding; on the CPU also the fastest (half the time of 32)
            log_samples=True,
        )


def ours(model: ModelWrapper, spec: TaskSpec) -> dict:
    """As the configs score: the requests built by a ``task_requests`` step, stored and read
    back, then scored by ``task_scores``."""
    return scores_with_stored_requests(model, spec, batch_size=16, max_batch_tokens=2048)


def ours_in_step(model: ModelWrapper, spec: TaskSpec) -> dict:
    """``task_scores`` building the requests itself (no ``requests``)."""
    return TaskScoresStep().run(model=model, task=spec, batch_size=16, max_batch_tokens=2048)


def assert_same(task: str, expected: dict, got: dict) -> None:
    """Same requests, log-likelihoods within 1e-4, same greedy flags, per-document metrics and
    aggregated results (every ``metric,filter`` key lm-eval reports, stderr included). Metrics
    made of log-likelihoods (``perplexity``) agree as those do: our float64 sums are not lm-eval's
    float32 ones to the last bit, so within 1e-4 per document and 1e-4 relative once
    aggregated (``exp(-mean)``); the others exactly."""
    by_doc = {sample["doc_id"]: sample for sample in got["samples"][task]}
    assert sorted(by_doc) == sorted(s["doc_id"] for s in expected["samples"][task])
    worst = 0.0
    for sample in expected["samples"][task]:
        mine = by_doc[sample["doc_id"]]
        assert mine["arguments"] == [list(arguments) for arguments in sample["arguments"]]
        for (want,), (have,) in zip(sample["resps"], mine["resps"], strict=True):
            worst = max(worst, abs(want[0] - have[0]))
            assert have[1] == want[1], (task, sample["doc_id"])
        for metric in sample["metrics"]:
            value, want = mine[metric], sample[metric]
            assert value == want or value == pytest.approx(want, rel=0, abs=1e-4), (
                task,
                sample["doc_id"],
                metric,
            )
    assert worst < 1e-4, (task, worst)
    wanted = {k: v for k, v in expected["results"][task].items() if "," in k}
    have = {k: v for k, v in got["results"][task].items() if "," in k}
    assert have.keys() == wanted.keys()
    for key, value in wanted.items():
        assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-12), (task, key)


def fixture_spec(task: str, num_fewshot: int) -> TaskSpec:
    return TaskSpec(name=task, data_dir=str(FIXTURES / DATA_DIR[task]), num_fewshot=num_fewshot)


@pytest.mark.parametrize("num_fewshot", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_every_task_format_equals_lm_eval_on_gpt2(gpt2_dir: Path, num_fewshot: int) -> None:
    expected = reference(gpt2_dir, [task_config(task) for task in TASKS], num_fewshot)
    model = ModelWrapper(str(gpt2_dir))
    for task in TASKS:
        assert_same(task, expected, ours(model, fixture_spec(task, num_fewshot)))


@pytest.mark.slow
@pytest.mark.parametrize("num_fewshot", [0, 2])
def test_every_task_format_equals_lm_eval_on_a_tied_llama(
    llama_dir: Path, num_fewshot: int
) -> None:
    expected = reference(llama_dir, [task_config(task) for task in TASKS], num_fewshot)
    model = ModelWrapper(str(llama_dir))
    assert model.model.get_output_embeddings().weight is model.model.get_input_embeddings().weight
    for task in TASKS:
        assert_same(task, expected, ours(model, fixture_spec(task, num_fewshot)))


@pytest.mark.slow
def test_hflm_one_token_cache_scores_winogrande_collisions_elsewhere(gpt2_dir: Path) -> None:
    """Why the reference runs with ``logits_cache=False``: with the cache, HFLM's answer for a
    request that shares ``context + continuation[:-1]`` with a longer one is not its own."""
    cached = reference(gpt2_dir, [task_config("winogrande")], 0, logits_cache=True)
    exact = reference(gpt2_dir, [task_config("winogrande")], 0)
    ours_result = ours_in_step(ModelWrapper(str(gpt2_dir)), fixture_spec("winogrande", 0))
    scores = {
        s["doc_id"]: [r[0][0] for r in s["resps"]] for s in ours_result["samples"]["winogrande"]
    }
    differs = []
    for with_cache, without in zip(
        cached["samples"]["winogrande"], exact["samples"]["winogrande"], strict=True
    ):
        for (a,), (b,) in zip(with_cache["resps"], without["resps"], strict=True):
            if abs(a[0] - b[0]) > 1e-3:
                differs.append(with_cache["doc_id"])
    assert set(differs) & {4, 5}, differs  # the fixture's colliding pair
    for sample in exact["samples"]["winogrande"]:
        np.testing.assert_allclose(
            scores[sample["doc_id"]], [r[0][0] for r in sample["resps"]], atol=1e-4
        )


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def test_loglikelihood_and_rolling_tasks_equal_lm_eval(gpt2_dir: Path, tmp_path: Path) -> None:
    """``loglikelihood`` (continuations that are, or are one token off, the model's greedy
    ones: ``acc`` counts greedy continuations) and ``loglikelihood_rolling`` (perplexities of
    texts longer than the 128-position window)."""
    model = ModelWrapper(str(gpt2_dir))
    tokenizer = model.tokenizer
    contexts = ["The river", "Une phrase en français", "数字は", "A long time ago", "Q: 2+2?\nA:"]
    rows = []
    for index, context in enumerate(contexts):
        ids = tokenizer(context)["input_ids"]
        with torch.no_grad():
            generated = model.model.generate(
                torch.tensor([ids]), max_new_tokens=3, do_sample=False, pad_token_id=0
            )[0, len(ids) :].tolist()
        if index % 2:  # not greedy: its last token changed
            generated[-1] = (generated[-1] + 1) % len(tokenizer)
        rows.append({"context": context, "target": tokenizer.decode(generated)})
    greedy = {
        "task": "greedy_probe",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(write_jsonl(tmp_path / "g.jsonl", rows))}},
        "test_split": "test",
        "output_type": "loglikelihood",
        "doc_to_text": "{{context}}",
        "doc_to_target": "{{target}}",
        "target_delimiter": "",
        "metric_list": [{"metric": "perplexity"}, {"metric": "acc"}],
    }
    texts = [{"text": " ".join(f"word{i} é 字" for i in range(n))} for n in (3, 40, 90)]
    rolling = {
        "task": "rolling_probe",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(write_jsonl(tmp_path / "r.jsonl", texts))}},
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "metric_list": [
            {"metric": "word_perplexity"},
            {"metric": "byte_perplexity"},
            {"metric": "bits_per_byte"},
        ],
    }
    expected = reference(gpt2_dir, [greedy, rolling], 0)
    got = ours(model, TaskSpec(config=greedy))
    assert_same("greedy_probe", expected, got)
    flags = [s["resps"][0][0][1] for s in got["samples"]["greedy_probe"]]
    assert flags == [True, False, True, False, True]
    assert_same("greedy_probe", expected, ours_in_step(model, TaskSpec(config=greedy)))
    got = ours(model, TaskSpec(config=rolling))
    want = [s["resps"][0][0] for s in expected["samples"]["rolling_probe"]]
    have = [s["resps"][0][0] for s in got["samples"]["rolling_probe"]]
    # Whole texts reach |ll| ~5,800 here, where a float32 step is 4.9e-4: within 1e-4 plus two
    # float32 steps of |ll| (lm-eval sums in float32, we in float64), as on PIQA.
    np.testing.assert_allclose(have, want, rtol=2.4e-7, atol=1e-4)
    for key, value in expected["results"]["rolling_probe"].items():
        if "," in key and "stderr" not in key:
            assert got["results"]["rolling_probe"][key] == pytest.approx(value, rel=1e-5)


@pytest.fixture(scope="module")
def steep_gpt2_dir(tmp_path_factory: pytest.TempPathFactory, gpt2_tokenizer_dir: Path) -> Path:
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 2, **STEEP}
    return save_model(tmp_path_factory.mktemp("steep-gpt2"), gpt2_tokenizer_dir, gpt2)


@pytest.mark.slow  # ~5 s: six scorings over GPT-2's 50,257-token vocabulary
def test_large_log_likelihoods_are_lm_evals_per_token_values_summed_exactly(
    steep_gpt2_dir: Path,
) -> None:
    """At |ll| up to 2,000, whatever the batching, every score is within 1e-4 of the exact sum of
    lm-eval's HF backend's own per-token log-probabilities. lm-eval's answer is their float32
    sum (checked to the bit), which is itself up to ~2.5e-4 off there (two float32 steps): it
    is within 1e-4 of ours only up to that rounding of its own."""
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    hflm = HFLM(
        pretrained=str(steep_gpt2_dir),
        device="cpu",
        dtype="float32",
        batch_size=1,
        logits_cache=False,
    )
    reference = AutoModelForCausalLM.from_pretrained(str(steep_gpt2_dir), dtype=torch.float32)
    queries = random_queries(0, reference.config.vocab_size, longest=130)
    splits = [len(query) - query.continuation_length for query in queries]
    requests = [
        (("", ""), list(query.tokens[:split]), list(query.tokens[split:]))
        for query, split in zip(queries, splits, strict=True)
    ]
    theirs = np.array([ll for ll, _ in hflm._loglikelihood_tokens(requests, disable_tqdm=True)])
    per_token = [token_log_probs(reference.eval(), query) for query in queries]
    assert theirs.tolist() == [float(values.sum()) for values in per_token]  # lm-eval's values
    exact = np.array([exact_log_likelihood(reference, query) for query in queries])
    assert 1_000 < np.abs(exact).max() <= 2_000
    own_rounding = np.abs(theirs - exact)
    assert own_rounding.max() > 1e-4  # why the bound is against the exact sum
    model = ModelWrapper(str(steep_gpt2_dir)).eval()

    def forward(batch: dict[str, torch.Tensor]) -> Any:
        with torch.inference_mode():
            return model(**batch)

    for packed in (False, True):
        for size in (1, 3, 16):
            sizes = EvalOptions(size, max_batch_tokens=None, packed=packed, progress=False)
            scores = score_queries(
                forward, queries, sizes, pad_token_id=model.pad_token_id, device=torch.device("cpu")
            )
            ours = np.array([ll for ll, _ in scores])
            np.testing.assert_allclose(ours, exact, rtol=0, atol=1e-4, err_msg=f"{size} {packed}")
            assert (np.abs(ours - theirs) <= 1e-4 + own_rounding).all()
