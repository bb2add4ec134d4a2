"""``evaluation/harness.py``: lm-eval's output made JSON's types, and a task's own
``process_results`` used and given back by an evaluation."""

from __future__ import annotations

import json
import math

import numpy as np

from tango_fairscale.evaluation.harness import json_safe


def test_json_safe_makes_lm_evals_values_jsons() -> None:
    value = {
        "acc": np.float64(0.5),
        "n": np.int64(3),
        "greedy": np.bool_(True),
        "flag": False,
        "resps": [[(-1.5, True)], [(float("nan"), False)]],
        "stderr": float("inf"),
        1: "one",
        "missing": None,
        "other": object,
    }
    safe = json_safe(value)
    assert safe["resps"] == [[[-1.5, True]], [[None, False]]]
    assert safe["stderr"] is None and safe["missing"] is None and safe["1"] == "one"
    assert (type(safe["acc"]), type(safe["n"]), type(safe["greedy"])) == (float, int, bool)
    assert safe["flag"] is False and safe["other"] == str(object)
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert not any(isinstance(v, float) and math.isnan(v) for v in safe.values())


def test_an_evaluation_gives_each_task_back_its_own_process_results() -> None:
    from conftest import REPO_ROOT
    from tasks.test_lm_eval import LengthLM

    from tango_fairscale.evaluation.harness import evaluate_task
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    spec = TaskSpec(name="copa", data_dir=str(REPO_ROOT / "tests/fixtures/tasks/copa"), limit=4)
    loaded = load_tasks(spec)
    (task,) = loaded["tasks"].values()
    calls = []
    own = task.process_results

    def counted(doc, results):  # set on the task itself, as a user might
        calls.append(doc)
        return own(doc, results)

    task.process_results = counted
    scores = evaluate_task(LengthLM(), spec, loaded)
    assert task.process_results is counted and len(calls) == 4  # used, then given back
    assert [sample["doc_id"] for sample in scores["samples"]["copa"]] == [0, 1, 2, 3]
    del task.process_results
    evaluate_task(LengthLM(), spec, loaded)
    assert "process_results" not in task.__dict__  # the class's again


def test_the_tokenizer_fields_are_lm_evals_of_its_hf_backend(hflm) -> None:
    """The fields lm-eval's ``add_tokenizer_info`` writes for its HF backend over the same model
    directory (GPT-2's tokenizer: no pad token of its own)."""
    from lm_eval.loggers.utils import add_tokenizer_info

    from tango_fairscale.evaluation.harness import tokenizer_fields
    from tango_fairscale.model.causal_lm import ModelWrapper

    expected: dict = {}
    add_tokenizer_info(expected, hflm)
    model = ModelWrapper(model=hflm.tokenizer.name_or_path)
    assert expected["max_length"] and tokenizer_fields(model) == expected
