"""lm-evaluation-harness 0.4.13 without a Jinja compilation per prompt, with its request-building
progress bars labelled, and without Hugging Face ``evaluate``'s metric scripts.

lm-eval renders each prompt field of a task (``doc_to_text``, ``doc_to_choice``,
``doc_to_target``) with ``lm_eval.utils.apply_template``, which compiles its template string anew
on every call (an open upstream issue). Building PIQA's 16,113 fine-tuning pairs took 11.8 s of a
``tango run``, nearly all compiling the same two templates (0.9 s with each compiled once), and
each in-loop validation spent a third of its time there.
:func:`compile_templates_once` makes lm-eval compile each template string once, in lm-eval's own
environment (its filters, ``StrictUndefined``): the rendered text is unchanged.

lm-eval draws a bar without a description while it builds a task's requests (``0%| | 0/64``),
on every rank, past Tango's writer. :func:`label_request_bars` names the task on it
(``piqa: building requests``), draws it through Tango's ``Tqdm`` (file-friendly logging, the run's
log) and on the first rank only.

lm-eval takes a metric it has not registered, or one a task marks ``hf_evaluate``, from Hugging
Face ``evaluate``, whose ``load`` runs that metric's Python script (``./<name>/<name>.py`` in the
working directory, the hub's, or its cached copy): :func:`refuse_metric_scripts` refuses such a
metric in one line when the task is built, before any request is.

lm-eval's hint that custom kwargs can be passed to ``--metadata`` (a command line the package does
not have), logged for every task it loads, is left out.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from typing import Any


class _WithoutMetadataHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Custom kwargs can be passed to `--metadata`" not in record.getMessage()


logging.getLogger("lm_eval.api.task").addFilter(_WithoutMetadataHint())


def fix_lm_eval() -> None:
    """Apply every fix of this module (each once a process)."""
    compile_templates_once()
    label_request_bars()
    read_fewshot_docs_in_bulk()
    refuse_metric_scripts()


#: Distinct template strings kept compiled (a task has a few; a process loads a few tasks).
TEMPLATES_KEPT = 1024


def compile_templates_once() -> None:
    """Replace ``lm_eval.utils.apply_template`` by one that compiles each template once (its
    ``compiled`` attribute: the ``functools.lru_cache``; ``original``: lm-eval's own)."""
    from lm_eval import utils

    original = utils.apply_template
    if getattr(original, "compiles_once", False):
        return
    compiled = functools.lru_cache(maxsize=TEMPLATES_KEPT)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        if not isinstance(template, str):  # what lm-eval does with it, error included
            return original(template, doc)
        return compiled(template).render(**doc)

    apply_template.compiles_once = True  # type: ignore[attr-defined]
    apply_template.compiled = compiled  # type: ignore[attr-defined]
    apply_template.original = original  # type: ignore[attr-defined]
    utils.apply_template = apply_template  # type: ignore[assignment]


def read_fewshot_docs_in_bulk() -> None:
    """Make ``ConfigurableTask.fewshot_docs`` (which lm-eval's task constructor lists whatever
    ``num_fewshot``, to build its sampler) return its split as a list read in bulk
    (:func:`~tango_fairscale.tasks.documents.plain_rows`: the same dicts; HellaSwag's 10,000
    validation documents: 0.6 s row by row on 2 cores; ``original``: lm-eval's own)."""
    from lm_eval.api.task import ConfigurableTask

    original = ConfigurableTask.fewshot_docs
    if getattr(original, "in_bulk", False):
        return

    def fewshot_docs(self: Any) -> Any:
        from ..tasks.documents import plain_rows

        docs = original(self)
        return None if docs is None else plain_rows(docs)

    fewshot_docs.in_bulk = True  # type: ignore[attr-defined]
    fewshot_docs.original = original  # type: ignore[attr-defined]
    ConfigurableTask.fewshot_docs = fewshot_docs  # type: ignore[method-assign]


def refuse_metric_scripts() -> None:
    """Make lm-eval's ``get_metric`` refuse a metric it would load through ``evaluate``."""
    from lm_eval.api import registry
    from lm_eval.api import task as task_module

    if getattr(task_module.get_metric, "refuses_scripts", False):
        return

    def get_metric(name: str, hf_evaluate_metric: bool = False) -> Any:
        from tango.common.exceptions import ConfigurationError

        if not registry.metric_registry:  # lm-eval registers its metrics on first use
            import lm_eval.api.metrics  # noqa: F401
        if hf_evaluate_metric or name not in registry.metric_registry:
            why = "marked hf_evaluate" if hf_evaluate_metric else "not one of lm-eval's metrics"
            raise ConfigurationError(
                f"metric {name!r} is {why}: Hugging Face evaluate would run its Python script, "
                "and the package runs no metric code from outside lm-eval; choose another metric "
                "or task"
            )
        return registry.metric_registry[name]

    get_metric.refuses_scripts = True  # type: ignore[attr-defined]
    task_module.get_metric = get_metric  # type: ignore[attr-defined]
    registry.get_metric = get_metric  # type: ignore[assignment]


#: The task whose requests lm-eval is building (set around ``Task.build_all_requests``).
_BUILDING: contextvars.ContextVar[str] = contextvars.ContextVar("building", default="lm-eval")


def label_request_bars() -> None:
    """Give ``lm_eval.api.task``'s bars the task's name and Tango's writer, on rank 0 only."""
    from lm_eval.api import task as task_module

    build = task_module.Task.build_all_requests
    if getattr(build, "labels_bars", False):
        return

    def build_all_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _BUILDING.set(str(getattr(self.config, "task", None) or type(self).__name__))
        try:
            return build(self, *args, **kwargs)
        finally:
            _BUILDING.reset(token)

    build_all_requests.labels_bars = True  # type: ignore[attr-defined]
    task_module.Task.build_all_requests = build_all_requests  # type: ignore[method-assign]
    task_module.tqdm = _request_bar  # type: ignore[attr-defined]


def _request_bar(*args: Any, **kwargs: Any) -> Any:
    from tango.common import Tqdm

    kwargs.setdefault("desc", f"{_BUILDING.get()}: building requests")
    kwargs["disable"] = kwargs.get("disable", False) or not _first_rank()
    return Tqdm.tqdm(*args, **kwargs)


def _first_rank() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
