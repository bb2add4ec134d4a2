"""lm-eval's evaluator over task specs with the package's ``LM``: its results (per task, per group)
and its per-document samples, JSON-safe, and a flat summary of several tasks' results."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tango.common.exceptions import ConfigurationError

from ..tasks.lm_eval import TaskDict, TaskSpec, load_tasks
from ..tasks.requests import fewshot_refusal

#: The keys of lm-eval's results JSON that a task's scores keep (besides ``samples``).
RESULT_KEYS = (
    "results",
    "groups",
    "group_subtasks",
    "n-shot",
    "n-samples",
    "versions",
    "higher_is_better",
)

#: Per-document fields kept from lm-eval's logged samples (the document itself is left out).
SAMPLE_KEYS = ("doc_id", "target", "arguments", "resps", "filtered_resps", "filter", "metrics")


def evaluate_task(
    lm: Any,
    spec: TaskSpec,
    loaded: TaskDict | None = None,
    bootstrap_iters: int = 100000,
    samples: bool = True,
) -> dict[str, Any]:
    """``lm_eval.evaluator.evaluate`` of ``spec``'s tasks (``loaded``: already loaded by
    :func:`~tango_fairscale.tasks.lm_eval.load_tasks`) with ``lm``, seeded as
    ``simple_evaluate`` seeds the few-shot choice; lm-eval's results JSON (:data:`RESULT_KEYS`)
    with its ``samples`` (:data:`SAMPLE_KEYS`) and, when ``strict: false`` left documents out,
    ``skipped_documents`` (``{task: count}``); without ``samples``, no ``samples`` (lm-eval
    then logs none either, unless a task's metrics need them: the results are the same). Call
    on every rank of a process group when ``lm`` scores on all of them."""
    from lm_eval.evaluator import evaluate

    loaded = load_tasks(spec) if loaded is None else loaded
    for task in loaded["tasks"].values():  # evaluate() uses the sampler as it finds it
        task.set_fewshot_seed(seed=spec.fewshot_seed)
    try:
        output = evaluate(
            lm=lm,
            task_dict=loaded,
            limit=spec.limit,
            bootstrap_iters=bootstrap_iters,
            log_samples=samples or _bypasses_metrics(loaded),
            verbosity="WARNING",
            system_instruction=spec.system_instruction,
            apply_chat_template=spec.apply_chat_template,
            fewshot_as_multiturn=spec.fewshot_as_multiturn and spec.apply_chat_template,
        )
    except (ValueError, AssertionError) as error:  # raised while building the requests
        refusal = fewshot_refusal(spec, error)
        if refusal is not None:
            raise refusal from None
        raise
    scores = {key: json_safe(output[key]) for key in RESULT_KEYS if key in output}
    if loaded.get("skipped_documents"):  # strict: false left them out
        scores["skipped_documents"] = dict(loaded["skipped_documents"])
    if not samples:
        return scores
    scores["samples"] = {
        task: [
            {key: json_safe(sample[key]) for key in SAMPLE_KEYS if key in sample}
            | _metric_values(sample)
            for sample in samples
        ]  # fmt: skip
        for task, samples in output.get("samples", {}).items()
    }
    return scores


def _bypasses_metrics(loaded: TaskDict) -> bool:
    """Whether a task of ``loaded`` has lm-eval's ``bypass`` metric (which needs logged samples)."""
    return any(
        "bypass" in getattr(task, "_metric_fn_list", {}) for task in loaded["tasks"].values()
    )


def requests_built_once(loaded: TaskDict) -> TaskDict:
    """``loaded``, its tasks building their lm-eval requests (``Instance`` s: contexts,
    continuations, few-shot examples) on their first evaluation only: a later evaluation that
    asks a task for the same requests (the same arguments to ``build_all_requests``) gets the
    same ``Instance`` s, their answers cleared (the documents are read once by
    :func:`~tango_fairscale.tasks.lm_eval.load_tasks`). For tasks evaluated again and again
    (validation during training): the requests equal those lm-eval would build again, as
    :func:`evaluate_task` seeds the few-shot choice the same way every time."""
    for task in loaded["tasks"].values():
        if not getattr(task, "_requests_built_once", False):
            task.build_all_requests = _built_once(task, task.build_all_requests)
            task._requests_built_once = True
    return loaded


def _built_once(task: Any, build: Callable[..., None]) -> Callable[..., None]:
    built: list[Any] = []  # [(args, kwargs, instances)] of the last build

    def build_all_requests(*args: Any, **kwargs: Any) -> None:
        if built and built[0][:2] == (args, kwargs):
            for instance in built[0][2]:  # lm-eval appends answers, its filters set theirs
                instance.resps = []
                instance.filtered_resps = {}
            task._instances = built[0][2]
            return
        build(*args, **kwargs)
        built[:] = [(args, kwargs, list(task.instances))]

    return build_all_requests


def _metric_values(sample: Mapping[str, Any]) -> dict[str, Any]:
    return {name: json_safe(sample[name]) for name in sample.get("metrics", []) if name in sample}


def merge(scores: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several :func:`evaluate_task` results as one lm-eval results JSON (per task and group)."""
    merged: dict[str, Any] = {key: {} for key in RESULT_KEYS}
    for score in scores:
        for key in RESULT_KEYS:
            for name, value in score.get(key, {}).items():
                if name in merged[key] and merged[key][name] != value:
                    raise ConfigurationError(
                        f"task {name!r} is scored twice, with other results; list it once"
                    )
                merged[key][name] = value
    return merged


def summary(results: Mapping[str, Any]) -> dict[str, Any]:
    """A flat mapping of lm-eval ``results`` (its ``results`` and ``n-samples`` entries):
    ``"<task>/<metric>"`` (``"<metric>,<filter>"`` for filters other than ``none``) and
    ``"<task>/num_examples"``; for a single task, also the same keys without ``"<task>/"``."""
    flat: dict[str, Any] = {}
    tasks = results.get("results", {})
    for task, metrics in tasks.items():
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name:  # alias, name, sample_len
                continue
            flat[f"{task}/{metric if filter_name == 'none' else key}"] = value
        samples = results.get("n-samples", {}).get(task)
        if samples is not None:
            flat[f"{task}/num_examples"] = samples["effective"]
        elif "sample_len" in metrics:
            flat[f"{task}/num_examples"] = metrics["sample_len"]
    if len(tasks) == 1:
        (task,) = tasks
        flat.update({key.split("/", 1)[1]: value for key, value in list(flat.items())})
    return flat


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars, tuples and non-finite floats made JSON's (NaN → ``None``)."""
    # The plain types first: a suite's samples hold millions of them (Mapping's ABC check is slow).
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None  # numpy.float64 is a float
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): json_safe(item) for key, item in value.items()}
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return json_safe(value.item())
    return str(value)
