"""A task scored as the configs score it: its requests built by a ``task_requests`` step, stored
and read back as the workspace stores them, then given to ``task_scores``."""

from __future__ import annotations

import tempfile
from typing import Any

from tango_fairscale.evaluation.steps import TaskScoresStep
from tango_fairscale.tasks.format import RequestsFormat
from tango_fairscale.tasks.lm_eval import TaskSpec
from tango_fairscale.tasks.requests import TaskRequestsStep


def stored_requests(spec: TaskSpec) -> dict[str, Any]:
    """``task_requests``'s result for ``spec``, written and read back by its format."""
    requests = TaskRequestsStep().run(task=spec)
    with tempfile.TemporaryDirectory() as directory:
        RequestsFormat().write(requests, directory)
        return RequestsFormat().read(directory)


def scores_with_stored_requests(model: Any, spec: TaskSpec, **options: Any) -> dict[str, Any]:
    """``task_scores`` of ``spec`` given its stored requests (``options``: the step's others)."""
    requests = stored_requests(spec)
    return TaskScoresStep().run(model=model, task=spec, requests=requests, **options)
