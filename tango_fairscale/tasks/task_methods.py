"""A method of an lm-eval task replaced on the task itself, without a reference cycle."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any


def replace_method(task: Any, name: str, replacement: Callable[..., Any]) -> None:
    """Make ``task.<name>(*args, **kwargs)`` call ``replacement(task, method, *args, **kwargs)``,
    ``method`` being ``name`` as it was (its class's, or a function set on the task before), to
    be called with the task first.

    What is set on the task holds the task weakly: a task holding a function that held the task
    would be a reference cycle, kept (with its documents, requests and answers) until Python's
    next full collection, which a command makes rare (:mod:`~tango_fairscale.runtime.collector`).
    """
    method = getattr(task, name)
    if getattr(method, "__self__", None) is task:
        original = method.__func__
    else:  # a function set on the task: called without it
        original = _dropping_the_task(method)
    of_task = weakref.ref(task)

    def replaced(*args: Any, **kwargs: Any) -> Any:
        return replacement(of_task(), original, *args, **kwargs)

    setattr(task, name, replaced)


def _dropping_the_task(function: Callable[..., Any]) -> Callable[..., Any]:
    return lambda _task, *args, **kwargs: function(*args, **kwargs)
