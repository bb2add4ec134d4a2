"""A document's gold answer read as lm-eval's ``process_results`` reads it (``tasks/answers.py``):
an index or a choice's text, one or several; anything else is a one-line ``BadAnswer``. (The
documents of whole fixture tasks checked through lm-eval: ``test_documents.py``.)"""

from __future__ import annotations

import re
import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.lifetimes import reference_counting_only

from tango_fairscale.tasks.answers import BadAnswer, answer_indices
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"

CHOICES = ["red", "green", "blue"]


def task(gold: Any, multiple_input: bool = False) -> Any:
    """A stand-in for lm-eval's task: its choices and its target (or text) for any document."""
    return SimpleNamespace(
        multiple_input=multiple_input,
        doc_to_choice=lambda doc: CHOICES,
        doc_to_target=lambda doc: gold,
        doc_to_text=lambda doc: gold,
    )


@pytest.mark.parametrize(
    "gold, indices",
    [(1, [1]), ("blue", [2]), ([0, "blue"], [0, 2]), (0, [0])],
)
def test_an_index_or_a_choice_text_is_a_gold_answer(gold: Any, indices: list[int]) -> None:
    assert answer_indices(task(gold), {}) == indices
    assert answer_indices(task(gold, multiple_input=True), {}) == indices  # from doc_to_text


@pytest.mark.parametrize(
    "gold, message",
    [
        (3, "is 3, not the index of one of its 3 choices (0 to 2)"),
        (-1, "is -1, not the index of one of its 3 choices"),
        ("purple", "not one of its 3 choices"),
        ([], "is an empty list"),
        (None, "not one of its 3 choices"),
    ],
)
def test_any_other_answer_is_refused_in_one_line(gold: Any, message: str) -> None:
    with pytest.raises(BadAnswer, match=re.escape(message)) as error:
        answer_indices(task(gold), {})
    assert "\n" not in str(error.value)


def test_the_choices_given_are_used_instead_of_the_tasks() -> None:
    assert answer_indices(task("b"), {}, choices=["a", "b"]) == [1]


@pytest.mark.parametrize("name", ["arc_easy", "openbookqa", "piqa"])
def test_a_checked_task_is_freed_by_reference_counting(name: str) -> None:
    """Loading a task checks its gold answers, probing lm-eval's templates with values they fail
    on (jinja's rewritten tracebacks are reference cycles, whose frames would hold the task and
    its documents until Python's next full collection), and sets its document reader on it: the
    task still goes as soon as nothing else holds it."""
    with reference_counting_only():
        loaded = load_tasks(TaskSpec(name=name, data_dir=str(FIXTURES / name)))
        tasks = [weakref.ref(task) for task in loaded["tasks"].values()]
        del loaded
        assert [task() for task in tasks] == [None]
