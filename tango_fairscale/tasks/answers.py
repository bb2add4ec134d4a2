"""A task's documents checked against lm-eval before they are scored or trained on: each gold
answer read with lm-eval's own functions and checked against its choices.

Gold answers (:func:`find_problems`, multiple-choice tasks), read with lm-eval's ``doc_to_choice``
and ``doc_to_target`` (``doc_to_text`` for tasks with one context per choice), as its
``process_results`` reads them: the choices are texts; the answer is read without an error and is
one of them or the index of one; the fields it is read from (and the choices are not) are
present; and a field the task reads as a choice index — set to 0..N-1, it makes choice 0..N-1 the
answer — holds one of those values: copa's answer is its second choice for any ``label`` but 0, so
a ``label`` of 5 or ``"1"`` would be scored as 1. A document ``process_docs`` fails on is found
too (:func:`process_documents`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..checks import reason
from .documents import Problem, plain_rows, short


class BadAnswer(ValueError):
    """A document's gold answer is neither one of its choices nor the index of one (the message
    says what it is: "is 7, not the index of ...")."""


def answer_indices(
    task: Any, doc: Mapping[str, Any], choices: list[str] | None = None
) -> list[int]:
    """The indices of ``doc``'s gold choices as lm-eval's ``process_results`` finds them (an
    index, or a choice's text; a list of them for several). Raises :class:`BadAnswer` for one
    that is neither, and lm-eval's own error when it cannot read them."""
    choices = task.doc_to_choice(doc) if choices is None else choices
    gold = task.doc_to_text(doc) if task.multiple_input else task.doc_to_target(doc)
    indices = []
    for answer in gold if isinstance(gold, list) else [gold]:
        if isinstance(answer, str) and answer in choices:
            indices.append(choices.index(answer))
        elif isinstance(answer, int) and 0 <= answer < len(choices):
            indices.append(int(answer))
        elif isinstance(answer, int):
            raise BadAnswer(
                f"is {answer}, not the index of one of its {len(choices)} choices "
                f"(0 to {len(choices) - 1})"
            )
        else:
            raise BadAnswer(f"is {short(answer)}, not one of its {len(choices)} choices")
    if not indices:
        raise BadAnswer("is an empty list")
    return indices


def find_problems(task: Any, splits: Mapping[str, Any]) -> list[Problem]:
    """The documents of ``splits`` (``{split: its rows, before process_docs}``) whose gold
    answer lm-eval's ``task`` cannot score (see the module docstring); none unless the task is
    ``multiple_choice``."""
    if task.get_config("output_type") != "multiple_choice":
        return []
    check = _GoldCheck(task)
    problems: list[Problem] = []
    for split, rows in splits.items():
        docs, failures = process_documents(task.config.process_docs, split, rows)
        problems += failures
        same_rows = docs is not None and len(docs) == len(rows)
        for position, doc in enumerate(plain_rows(docs) if docs is not None else []):
            what = check.problem(doc)
            if what is not None:
                row = position if same_rows else None
                problems.append(Problem(split, row, what, position))
    return problems


def process_documents(process: Any, split: str, rows: Any) -> tuple[Any, list[Problem]]:
    """``rows`` through a task's ``process_docs`` (``None``: as they are); when it fails, no
    documents and the rows it fails on (found by halving: ``process_docs`` maps row by row)."""
    if process is None:
        return rows, []
    try:
        return process(rows), []
    except Exception as error:
        failures = _failing_rows(process, rows, 0, len(rows), error)
        if not failures:
            return None, [Problem(split, None, f"its process_docs fails ({reason(error)})")]
        return None, [
            Problem(split, row, f"lm-eval's process_docs cannot read it ({reason(failure)})")
            for row, failure in failures
        ]


def _failing_rows(
    process: Any, rows: Any, start: int, stop: int, error: BaseException
) -> list[tuple[int, BaseException]]:
    """The rows in ``[start, stop)`` that ``process`` fails on; it failed on all of them."""
    if stop - start == 1:
        return [(start, error)]
    failing = []
    middle = (start + stop) // 2
    for low, high in ((start, middle), (middle, stop)):
        part = rows.select(range(low, high)) if hasattr(rows, "select") else rows[low:high]
        try:
            process(part)
        except Exception as part_error:
            failing += _failing_rows(process, rows, low, high, part_error)
    return failing


class _Tracked(dict):
    """A document that records which of its fields a function reads."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        super().__init__(doc)
        self.read: set[str] = set()

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self.read.add(key)
        return super().__contains__(key)


class _GoldCheck:
    """The gold answers of a multiple-choice lm-eval task's documents, checked one by one."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.fields: list[str] | None = None  # what the answer is read from, not the choices
        self.index_readings: dict[tuple[str, int], tuple[bool, bool]] = {}

    def problem(self, doc: Mapping[str, Any]) -> str | None:
        """What is wrong with ``doc``'s gold answer, or ``None``."""
        if self.fields is None:
            self.fields = self._answer_fields(doc)
        missing = [field for field in self.fields if doc.get(field) is None]
        if missing:
            return f"{_names(missing)} {'is' if len(missing) == 1 else 'are'} missing"
        source = f" from {_names(self.fields)}" if self.fields else ""
        try:
            choices = self.task.doc_to_choice(doc)
        except Exception as error:
            return f"lm-eval cannot read its choices ({reason(error)})"
        texts = isinstance(choices, list) and all(isinstance(choice, str) for choice in choices)
        if not texts or not choices:
            return f"its choices are not a list of texts: {short(choices)}"
        try:
            indices = answer_indices(self.task, doc, choices)
        except BadAnswer as bad:
            return f"its answer (read{source}) {bad}" if source else f"its answer {bad}"
        except Exception as error:
            return f"lm-eval cannot read its answer{source} ({reason(error)})"
        for field in self.fields:
            what = self._index_problem(doc, field, choices, indices)
            if what is not None:
                return what
        return None

    def _answer_fields(self, doc: Mapping[str, Any]) -> list[str]:
        task = self.task
        if getattr(task, "prompt", None) is not None:  # a promptsource prompt: not known
            return []
        answer = task.config.doc_to_text if task.multiple_input else task.config.doc_to_target
        features = set(getattr(task, "features", ()) or ())
        read = _fields_read(answer, doc, features) - _fields_read(
            task.config.doc_to_choice, doc, features
        )
        return sorted(read)

    def _index_problem(
        self, doc: Mapping[str, Any], field: str, choices: list[str], indices: list[int]
    ) -> str | None:
        """When the task reads ``field`` as a choice index (as an integer, or as digits), what
        is wrong with ``doc``'s value of it."""
        count = len(choices)
        key = (field, count)
        if key not in self.index_readings:
            if len(set(choices)) < count:  # repeated choices: this document cannot tell
                return None
            self.index_readings[key] = (
                self._reads_as_index(doc, field, list(range(count))),
                self._reads_as_index(doc, field, [str(index) for index in range(count)]),
            )
        as_integer, as_digits = self.index_readings[key]
        value = doc[field]
        valid = (as_integer and isinstance(value, int) and 0 <= value < count) or (
            as_digits and isinstance(value, str) and value in {str(i) for i in range(count)}
        )
        if valid or not (as_integer or as_digits):
            return None
        return (
            f"{field!r} is {short(value)}, not the index of one of its {count} choices (0 to "
            f"{count - 1}); lm-eval would score choice {indices[0] + 1} as its answer"
        )

    def _reads_as_index(self, doc: Mapping[str, Any], field: str, values: Sequence[Any]) -> bool:
        for index, value in enumerate(values):
            try:
                if answer_indices(self.task, {**doc, field: value}) != [index]:
                    return False
            except Exception as error:
                _forget_frames(error)
                return False
        return True


def _fields_read(source: Any, doc: Mapping[str, Any], features: set[str]) -> set[str]:
    """The fields of ``doc`` that a task's ``doc_to_*`` setting reads: a field's name, a Jinja
    template's variables, or what a function looks up."""
    if isinstance(source, str):
        if source in features:
            return {source}
        import jinja2.meta
        from lm_eval import utils

        try:
            return set(jinja2.meta.find_undeclared_variables(utils.env.parse(source))) & set(doc)
        except Exception:  # not a template lm-eval renders either
            return set()
    if callable(source):
        tracked = _Tracked(doc)
        try:
            source(tracked)
        except Exception as error:
            _forget_frames(error)
        return tracked.read & set(doc)
    return set()


def _forget_frames(error: BaseException) -> None:
    """Let go of what an expected failure (a probe of the task's functions) holds: the locals of
    every frame that has finished since it was raised, and its traceback, for it and the errors
    it arose from. lm-eval's templates fail through jinja's rewritten tracebacks, reference
    cycles whose frames would keep the task — its documents and requests — alive until Python's
    next full collection, long after its step (a command collects rarely:
    :mod:`~tango_fairscale.runtime.collector`); without their locals they hold nothing and are
    freed at once."""
    seen: set[int] = set()
    failure: BaseException | None = error
    while failure is not None and id(failure) not in seen:
        seen.add(id(failure))
        tb = failure.__traceback__
        while tb is not None:
            frame: Any = tb.tb_frame
            while frame is not None:  # the frame and its callers, up to one still running
                try:
                    frame.clear()
                except RuntimeError:
                    break
                frame = frame.f_back
            tb = tb.tb_next
        failure.__traceback__ = None
        failure = failure.__cause__ or failure.__context__


def _names(fields: Sequence[str]) -> str:
    return " and ".join(repr(field) for field in fields) or "its answer"
