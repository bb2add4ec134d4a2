"""Stored requests put back into lm-eval's own task objects: checked against the task
configuration they are given for, then taken by each task in place of the requests it would
build (the same ``Instance`` s over the same documents)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tango.common.exceptions import ConfigurationError

from ..checks import one_line
from .lm_eval import TaskDict, TaskSpec
from .requests import REQUESTS_FORMAT, doc_hash, fewshot_hash, plain_value, spec_fields
from .task_methods import replace_method

logger = logging.getLogger(__name__)


def check_requests(spec: TaskSpec, requests: Mapping[str, Any], loaded: TaskDict) -> None:
    """Refuse in one line a requests result built for another task configuration than
    ``spec`` (:func:`spec_fields`: every field but ``dataset``, the local files' fingerprint;
    its label and tasks), naming the fields that differ."""
    if not isinstance(requests, Mapping) or requests.get("format") != REQUESTS_FORMAT:
        raise ConfigurationError(
            f"task {spec.label!r}: requests must be a tango_fairscale::task_requests result "
            f"(format {REQUESTS_FORMAT})"
        )
    built = {"label": requests.get("label"), "tasks": sorted(requests.get("tasks", {}))}
    built |= requests.get("spec") or {}
    wanted = {"label": spec.label, "tasks": sorted(loaded["tasks"])} | spec_fields(spec)
    defaults = {field.name: plain_value(field.default) for field in dataclasses.fields(spec)}
    differ = [
        key
        for key in wanted
        if built.get(key, defaults.get(key, None)) != wanted[key]  # a later field: its default
    ]
    if differ:
        shown = ", ".join(f"{key} {built.get(key)!r} (not {wanted[key]!r})" for key in differ)
        raise ConfigurationError(
            f"task {spec.label!r}: its requests were built for another task configuration: "
            f"{one_line(shown, 300)}; give task_scores the task_requests step of the same task"
        )


def use_requests(
    loaded: TaskDict, requests: Mapping[str, Any], *, documents_keyed: bool = False
) -> None:
    """Make each task of ``loaded`` take its stored requests when lm-eval's ``evaluate`` asks it
    to build them: the same ``Instance`` s (type, arguments, ``idx``, metadata) over the task's
    own documents. Where lm-eval asks for something else than they were built for (another
    limit, a process's share, chosen samples, a chat template) or a document's hash or the
    few-shot documents' hash differs from the stored one (the data changed under a cached
    result: a hub dataset, keyed by name), the task builds its requests itself, with a warning
    for changed documents. ``documents_keyed``: the documents are local files whose
    fingerprint :func:`check_requests` has matched (:func:`spec_fields`), so they are not
    hashed again (10,000 HellaSwag documents: ~0.8 s)."""
    for name, task in loaded["tasks"].items():
        taking = functools.partial(_taking, requests["tasks"][name], documents_keyed)
        replace_method(task, "build_all_requests", taking)


def _taking(
    stored: Mapping[str, Any],
    documents_keyed: bool,
    task: Any,
    build: Callable[..., None],
    *args: Any,
    **kwargs: Any,
) -> None:
    """``task``'s ``build_all_requests`` (lm-eval's, ``build``), taking ``stored`` where it
    applies."""
    instances = _restored(task, stored, kwargs, documents_keyed) if not args else None
    if instances is None:
        build(task, *args, **kwargs)
    else:
        task._instances = instances


def _restored(
    task: Any, stored: Mapping[str, Any], kwargs: Mapping[str, Any], documents_keyed: bool
) -> list | None:
    """The stored requests as lm-eval's ``Instance`` s over ``task``'s documents, or ``None``
    where they do not apply (see :func:`use_requests`)."""
    from lm_eval.api.instance import Instance

    if (
        kwargs.get("limit") != stored["limit"]
        or kwargs.get("rank", 0) != 0
        or kwargs.get("world_size", 1) != 1
        or kwargs.get("samples") is not None
        or kwargs.get("apply_chat_template")
    ):
        return None
    if not documents_keyed and fewshot_hash(task) != stored["fewshot_hash"]:
        logger.warning(
            "task %r: its few-shot documents are not those its stored requests were built from "
            "(the data changed since): building its requests again",
            stored["task_name"],
        )
        return None
    documents = dict(task.doc_iterator(rank=0, limit=stored["limit"], world_size=1))
    if sorted(documents) != sorted(document["doc_id"] for document in stored["documents"]):
        logger.warning(
            "task %r: %d documents, its stored requests were built for %d (the data changed "
            "since): building its requests again",
            stored["task_name"],
            len(documents),
            len(stored["documents"]),
        )
        return None
    instances = []
    for document in stored["documents"]:
        doc_id = document["doc_id"]
        if not documents_keyed and doc_hash(documents[doc_id]) != document["doc_hash"]:
            logger.warning(
                "task %r: document %s is not the one its stored requests were built from (the "
                "data changed since): building its requests again",
                stored["task_name"],
                doc_id,
            )
            return None
        doc = documents[doc_id]
        for request in document["requests"]:
            arguments = request["arguments"]
            instances.append(
                Instance(
                    request_type=request["request_type"],
                    doc=doc,
                    arguments=tuple(arguments) if request["tuple"] else arguments,
                    idx=request["idx"],
                    metadata=(stored["task_name"], doc_id, request["repeats"]),
                )
            )
    return instances
