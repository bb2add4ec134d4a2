"""A task's lm-eval requests built once, without a model: every document's requests (contexts,
continuations or generation settings) as JSON (put back into lm-eval's own task objects by
:mod:`.restoring`, so that its evaluator scores them as if it had built them itself), and the
task objects the build loaded, handed to the scores step that follows in the same process."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from tango import Step
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import one_line
from ..records.fingerprint import local_fingerprint
from .format import RequestsFormat
from .lm_eval import TaskDict, TaskSpec, load_tasks

#: The layout of a stored requests result (``format`` key); another one is refused.
REQUESTS_FORMAT = 1


@Step.register("tango_fairscale::task_requests")
class TaskRequestsStep(Step[dict]):
    """lm-eval's requests of one task (or group), built once for every model scored on it.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::task_requests"``.

    :param task: a :class:`~tango_fairscale.tasks.lm_eval.TaskSpec` (a name is enough).

    Returns :func:`build_requests`'s JSON (stored by
    :class:`~tango_fairscale.tasks.format.RequestsFormat`: read back as data only), for
    ``tango_fairscale::task_scores``'s ``requests``. Its cache key is everything it reads: the
    task spec (every field — name, YAML or config, ``num_fewshot``, ``fewshot_seed``,
    ``limit``, ``system_instruction``, ... — and the fingerprint of its local files: data
    directory, YAMLs, ``!function`` modules, a ``dataset`` step's own key) and lm-eval's
    version (its task definitions and prompt code). A task's hub dataset is keyed by name, as
    ``task_scores`` keys it: a cached result whose documents no longer match the data is
    rebuilt by ``task_scores`` (:func:`~.restoring.use_requests`). Chat-templated tasks are refused.

    Example (Jsonnet)::

        requests_arc: {type: "tango_fairscale::task_requests",
                       task: {name: "arc_easy", num_fewshot: 2}},
        arc_easy: {type: "tango_fairscale::task_scores", model: {ref: "trained_model"},
                   task: {name: "arc_easy", num_fewshot: 2}, requests: {ref: "requests_arc"}}
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = RequestsFormat()

    def run(self, task: TaskSpec) -> dict:  # type: ignore[override]
        loaded = load_tasks(task)
        requests = build_requests(task, loaded)
        hand_off(requests, loaded)
        return requests


#: Tasks that a requests step of this process loaded, for the scores step of the same task that
#: follows it: lm-eval's task loading (HellaSwag and MMLU anatomy: ~1.7 s) is paid once.
_handed_off: dict[str, TaskDict] = {}


def hand_off(requests: Mapping[str, Any], loaded: TaskDict) -> None:
    """Leave ``loaded`` (the tasks :func:`build_requests` built ``requests`` with) for
    :func:`loaded_tasks`, less the built requests (the scores step puts the stored ones back:
    :func:`~.restoring.use_requests`)."""
    for task in loaded["tasks"].values():
        task._instances = None
    _handed_off[_hand_off_key(requests)] = loaded


def loaded_tasks(spec: TaskSpec, requests: Mapping[str, Any]) -> TaskDict:
    """The tasks a requests step of this process loaded to build ``requests`` (:func:`hand_off`),
    taken (each serves one step), else ``load_tasks(spec)``. Keyed by the configuration the
    requests record (:func:`spec_fields`), which :func:`~.restoring.check_requests` then
    compares with ``spec``: its local files are not fingerprinted again here."""
    loaded = _handed_off.pop(_hand_off_key(requests), None)
    return load_tasks(spec) if loaded is None else loaded


def _hand_off_key(requests: Mapping[str, Any]) -> str:
    return json.dumps([requests.get("label"), requests.get("spec")], sort_keys=True)


def unique_id_with(step: Step, hashed: Callable[[], Mapping[str, Any]]) -> str:
    """``step``'s Tango unique id computed as if its arguments were updated with ``hashed()``
    (what stands for an argument in the cache key, or what the key holds beside them). Computed
    once a step: Tango asks for it at every hash of the step, and ``hashed`` may read files."""
    if step.unique_id_cache is not None:
        return step.unique_id_cache
    kwargs = step.kwargs
    step.kwargs = {**kwargs, **hashed()}
    try:
        return Step.unique_id.fget(step)  # type: ignore[attr-defined]
    finally:
        step.kwargs = kwargs


def fewshot_refusal(spec: TaskSpec, error: BaseException) -> ConfigurationError | None:
    """The one-line refusal of lm-eval's error while it built ``spec``'s requests, when it is
    the few-shot split being too small for ``num_fewshot`` (else ``None``)."""
    message = one_line(error)
    if "Sample larger than population" in message or "fewshot samples" in message:
        return ConfigurationError(
            f"task {spec.label!r}: num_fewshot {spec.num_fewshot} needs more documents than "
            f"its few-shot split holds ({message}); lower num_fewshot"
        )
    return None


def build_requests(spec: TaskSpec, loaded: TaskDict | None = None) -> dict[str, Any]:
    """Every request lm-eval's ``evaluate`` would send a model for ``spec`` (on one process,
    seeded as :func:`~tango_fairscale.evaluation.harness.evaluate_task` seeds it), JSON-safe::

        {"format": 1, "label": "piqa", "spec": {"num_fewshot": 0, ...},
         "tasks": {"piqa": {"task_name": "piqa", "limit": 8,
             "fewshot_hash": null, "documents": [
             {"doc_id": 0, "doc_hash": "<lm-eval's hash of the document>", "requests": [
                 {"request_type": "loglikelihood", "arguments": ["Question: ...", " answer"],
                  "tuple": true, "idx": 0, "repeats": 1}, ...]}, ...]}}}

    ``arguments`` are lm-eval's ``Instance.arguments`` (``(context, continuation)``,
    ``(context, gen_kwargs)``, ``(text,)``) with tuples as lists; ``tuple`` says whether they
    were one; ``fewshot_hash`` is :func:`fewshot_hash`'s (with ``doc_hash``, what
    :func:`~.restoring.use_requests` checks a hub dataset's documents by; both ``null`` for
    local files, :func:`documents_keyed`). Nothing depends on a model or tokenizer, so a
    task's chat-templated prompts (``apply_chat_template``: the tokenizer's template builds
    them) are refused."""
    from lm_eval.evaluator_utils import get_sample_size

    if spec.apply_chat_template:
        raise ConfigurationError(
            f"task {spec.label!r}: its chat-templated prompts depend on the model's tokenizer; "
            "give task_scores no requests (it builds them itself) for apply_chat_template"
        )
    loaded = load_tasks(spec) if loaded is None else loaded
    tasks = {}
    for name, task in loaded["tasks"].items():
        task.set_fewshot_seed(seed=spec.fewshot_seed)  # as evaluate_task does
        limit = get_sample_size(task, spec.limit)
        try:
            task.build_all_requests(
                limit=limit, rank=0, world_size=1, system_instruction=spec.system_instruction
            )
        except (ValueError, AssertionError) as error:
            refusal = fewshot_refusal(spec, error)
            if refusal is not None:
                raise refusal from None
            raise
        tasks[name] = _stored_task(name, task, limit, hashed=not documents_keyed(spec))
    return {"format": REQUESTS_FORMAT, "label": spec.label, "spec": spec_fields(spec)} | {
        "tasks": tasks
    }


def spec_fields(spec: TaskSpec) -> dict[str, Any]:
    """What a requests result records of the spec it was built for: every field but
    ``dataset``, and the fingerprint of the local files it reads (a ``dataset`` step's own key
    among them, which stands for its documents)."""
    fields = {
        field.name: plain_value(getattr(spec, field.name))
        for field in dataclasses.fields(spec)
        if field.name != "dataset"
    }
    return fields | {"local_files": local_fingerprint(spec.local_files())}


def plain_value(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists, other objects as their ``repr``)."""
    if isinstance(value, (list, tuple)):
        return [plain_value(item) for item in value]
    if isinstance(value, Mapping):
        return {str(key): plain_value(item) for key, item in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def documents_keyed(spec: TaskSpec) -> bool:
    """Whether ``spec``'s documents are local files (``data_dir``, a ``dataset`` step), whose
    fingerprint is among the fields a requests result records (:func:`spec_fields`): then the
    result holds no document hashes (10,000 HellaSwag documents: ~0.8 s to hash), and
    :func:`~.restoring.check_requests` stands for them."""
    return spec.data_dir is not None or spec.dataset is not None


def _stored_task(name: str, task: Any, limit: int | None, hashed: bool) -> dict[str, Any]:
    documents: dict[int, dict[str, Any]] = {}
    task_names = set()
    for instance in task.instances:
        task_names.add(instance.task_name)
        if instance.doc_id not in documents:  # each document hashed once, not once a request
            documents[instance.doc_id] = {
                "doc_id": instance.doc_id,
                "doc_hash": doc_hash(instance.doc) if hashed else None,
                "requests": [],
            }
        document = documents[instance.doc_id]
        arguments = instance.arguments
        document["requests"].append(
            {
                "request_type": instance.request_type,
                "arguments": _json_value(arguments, name),
                "tuple": isinstance(arguments, tuple),
                "idx": instance.idx,
                "repeats": instance.repeats,
            }
        )
    (task_name,) = task_names or {name}
    return {
        "task_name": task_name,
        "limit": limit,
        "fewshot_hash": fewshot_hash(task) if hashed else None,
        "documents": list(documents.values()),
    }


def fewshot_hash(task: Any) -> str | None:
    """lm-eval's hash of the documents ``task`` draws its few-shot examples from (``None``
    without few-shot examples)."""
    sampler = getattr(task, "sampler", None)
    if not task.get_config("num_fewshot") or sampler is None:
        return None
    return doc_hash(list(sampler.df))


def doc_hash(doc: Any) -> str:
    """lm-eval's own hash of a document (its logged samples' ``doc_hash``)."""
    from lm_eval.utils import handle_non_serializable, hash_string

    text = json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)
    return str(hash_string(text))


def _json_value(value: Any, task: str) -> Any:
    """``value`` as JSON holds it (tuples as lists); refused when JSON cannot hold it."""
    if isinstance(value, (list, tuple)):
        return [_json_value(item, task) for item in value]
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return {key: _json_value(item, task) for key, item in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise ConfigurationError(
        f"task {task!r}: a request argument of type {type(value).__name__} cannot be stored as "
        "JSON; give task_scores no requests (it builds them itself)"
    )
