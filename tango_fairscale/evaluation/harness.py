"""lm-eval's evaluator over task specs with the package's ``LM``: its results (per task, per group)
and its per-document samples, JSON-safe, and a flat summary of several tasks' results."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tango.common.exceptions import ConfigurationError

from ..tasks.lm_eval import TaskDict, TaskSpec, load_tasks
from ..tasks.requests import fewshot_refusal
from ..tasks.task_methods import replace_method
from . import choice_metrics

#: The keys of lm-eval's results JSON that a task's scores keep (besides ``samples``).
RESULT_KEYS = (
    "results",
    "groups",
    "group_subtasks",
    "n-shot",
    "n-samples",
    "versions",
    "higher_is_better",
    "configs",
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
    with its ``samples`` (:data:`SAMPLE_KEYS`, and each metric's value) and, when ``strict:
    false`` left documents out, ``skipped_documents`` (``{task: count}``); without ``samples``,
    no ``samples``. The common multiple-choice metrics are computed in bulk
    (:mod:`.choice_metrics`), every other through lm-eval's ``process_results``; the samples
    are recorded here as lm-eval logs them, less the hashes of each document, prompt and target
    it adds (where a task's metrics need lm-eval's own samples, it logs them). Call on every rank
    of a process group when ``lm`` scores on all of them."""
    from lm_eval.evaluator import evaluate
    from lm_eval.evaluator_utils import get_sample_size

    loaded = load_tasks(spec) if loaded is None else loaded
    lm_eval_logs = _bypasses_metrics(loaded)
    recorders = {}
    for name, task in loaded["tasks"].items():
        task.set_fewshot_seed(seed=spec.fewshot_seed)  # evaluate() uses the sampler as it is
        recorders[name] = _Recorder(task, get_sample_size(task, spec.limit))
    try:
        output = evaluate(
            lm=lm,
            task_dict=loaded,
            limit=spec.limit,
            bootstrap_iters=bootstrap_iters,
            log_samples=lm_eval_logs,
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
    finally:
        for recorder in recorders.values():
            recorder.remove()
    scores = {key: json_safe(output[key]) for key in RESULT_KEYS if key in output}
    for config in scores.get("configs", {}).values():  # a task's own documents: their files
        if isinstance(config.get("custom_dataset"), dict):
            config["custom_dataset"] = {"files": config["custom_dataset"].get("files", {})}
    if loaded.get("skipped_documents"):  # strict: false left them out
        scores["skipped_documents"] = dict(loaded["skipped_documents"])
    if samples and lm_eval_logs:
        scores["samples"] = _logged_samples(output)
    elif samples:
        scores["samples"] = {name: recorder.samples() for name, recorder in recorders.items()}
    return scores


def _logged_samples(output: Mapping[str, Any]) -> dict[str, Any]:
    """lm-eval's own logged samples (:data:`SAMPLE_KEYS`, JSON-safe, and each metric's value)."""
    return {
        task: [
            {key: json_safe(sample[key]) for key in SAMPLE_KEYS if key in sample}
            | metric_values(sample)
            for sample in task_samples
        ]
        for task, task_samples in output.get("samples", {}).items()
    }


class _Recorder:
    """Stands in for a task's ``process_results`` during one ``evaluate``, which calls it once per
    document and filter, in the order of its documents (``doc_iterator`` with ``limit``) for each
    filter in turn: each document's metrics, from :mod:`.choice_metrics` where it computes them
    (all documents at the first call), and every call recorded for :meth:`samples`."""

    def __init__(self, task: Any, limit: int | None) -> None:
        self.task = task
        self.limit = limit
        self.calls: list[tuple[Any, dict[str, Any]]] = []  # (document, its metrics)
        self.bulk: tuple[list[Any], list[dict[str, Any]]] | None = None  # (answers, metrics)
        self.targets: list[Any] | None = None  # each document's doc_to_target, when computed
        self.original = task.process_results  # lm-eval's own (or one set on the task)
        self.set_on_task = "process_results" in task.__dict__
        task.process_results = self

    def remove(self) -> None:
        """Give the task back the ``process_results`` it had."""
        if self.task.__dict__.get("process_results") is not self:
            return
        if self.set_on_task:
            self.task.process_results = self.original
        else:
            del self.task.process_results

    def __call__(self, doc: Any, results: list[Any]) -> dict[str, Any]:
        if not self.calls and not self.set_on_task and choice_metrics.computes(self.task):
            documents = [doc for _, doc in self.documents]
            answers = [
                [request.filtered_resps["none"] for request in requests]
                for requests in self.requests.values()
            ]
            self.targets = [self.task.doc_to_target(doc) for doc in documents]
            computed = choice_metrics.document_metrics(self.task, documents, answers, self.targets)
            self.bulk = (answers, computed)
        position = len(self.calls)
        bulk = self.bulk
        if bulk is not None and position < len(bulk[0]) and results == bulk[0][position]:
            metrics = bulk[1][position]
        else:  # lm-eval's own code
            metrics = self.original(doc, results)
        self.calls.append((doc, metrics))
        return metrics

    @functools.cached_property
    def documents(self) -> list[tuple[int, Any]]:
        """The task's ``(doc_id, document)`` in the order ``evaluate`` goes over them."""
        return list(self.task.doc_iterator(rank=0, limit=self.limit, world_size=1))

    @functools.cached_property
    def requests(self) -> dict[int, list[Any]]:
        """Each document's requests (lm-eval's ``Instance`` s) in request order, by document
        (read once the requests are answered)."""
        by_document: dict[int, list[Any]] = {}
        for instance in self.task.instances:
            by_document.setdefault(instance.doc_id, []).append(instance)
        for requests in by_document.values():
            requests.sort(key=lambda instance: instance.idx)
        return by_document

    def samples(self) -> list[dict[str, Any]]:
        """lm-eval's logged samples of the recorded calls (:data:`SAMPLE_KEYS`, JSON-safe, and
        each metric's value)."""
        if not self.calls:
            return []
        documents = self.documents
        doc_ids = [doc_id for doc_id, _ in documents]
        filters = list(self.task.instances[0].filtered_resps)
        in_order = len(self.calls) == len(doc_ids) * len(filters) and all(
            doc == documents[position % len(documents)][1]
            for position, (doc, _) in enumerate(self.calls)
        )
        if not in_order:  # the order this stand-in reads the calls in is not lm-eval's
            raise RuntimeError(
                f"lm-eval computed {len(self.calls)} metrics for {len(doc_ids)} documents and "
                f"{len(filters)} filters, not one a document and filter in order"
            )
        requests = self.requests
        targets = self.targets  # the bulk's: one filter, a call per document
        if targets is None or len(targets) != len(self.calls):
            targets = [self.task.doc_to_target(doc) for doc, _ in self.calls]
        samples = []
        for position, (_, metrics) in enumerate(self.calls):
            filter_key = filters[position // len(doc_ids)]
            doc_id = doc_ids[position % len(doc_ids)]
            mine = requests[doc_id]
            sample = {
                "doc_id": doc_id,
                "target": json_safe(targets[position]),
                "arguments": [json_safe(request.args) for request in mine],
                "resps": [json_safe(request.resps) for request in mine],
                "filtered_resps": [
                    json_safe(request.filtered_resps[filter_key]) for request in mine
                ],
                "filter": filter_key,
                "metrics": list(metrics),
            }
            samples.append(sample | {name: json_safe(value) for name, value in metrics.items()})
        return samples


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
            replace_method(task, "build_all_requests", functools.partial(_built_once, []))
            task._requests_built_once = True
    return loaded


def _built_once(
    built: list[Any], task: Any, build: Callable[..., None], *args: Any, **kwargs: Any
) -> None:
    """``task``'s ``build_all_requests`` (lm-eval's, ``build``), its last build kept in ``built``
    (``[(args, kwargs, instances)]``) and taken again for the same arguments."""
    if built and built[0][:2] == (args, kwargs):
        for instance in built[0][2]:  # lm-eval appends answers, its filters set theirs
            instance.resps = []
            instance.filtered_resps = {}
        task._instances = built[0][2]
        return
    build(task, *args, **kwargs)
    built[:] = [(args, kwargs, list(task.instances))]


def metric_values(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A logged sample's metric values (the keys its ``metrics`` names), JSON-safe."""
    return {name: json_safe(sample[name]) for name in sample.get("metrics", []) if name in sample}


def merge(scores: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several :func:`evaluate_task` results as one lm-eval results JSON (per task and group).
    A task's ``configs`` are its first (lm-eval writes its functions' addresses into them)."""
    merged: dict[str, Any] = {key: {} for key in RESULT_KEYS}
    for score in scores:
        for key in RESULT_KEYS:
            for name, value in score.get(key, {}).items():
                if name in merged[key] and key == "configs":
                    continue
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


def tokenizer_fields(model: Any) -> dict[str, Any]:
    """The tokenizer fields lm-eval's results JSON holds (``add_tokenizer_info``), of the model
    (a :class:`~tango_fairscale.model.causal_lm.ModelWrapper`) that scored: its special tokens
    as ``[token, "id"]``, the end-of-text id and the longest input."""
    tokenizer = model.tokenizer
    return {
        "tokenizer_pad_token": [tokenizer.pad_token, str(tokenizer.pad_token_id)],
        "tokenizer_eos_token": [tokenizer.eos_token, str(tokenizer.eos_token_id)],
        "tokenizer_bos_token": [tokenizer.bos_token, str(tokenizer.bos_token_id)],
        "eot_token_id": tokenizer.eos_token_id,
        "max_length": model.max_length,
    }


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
