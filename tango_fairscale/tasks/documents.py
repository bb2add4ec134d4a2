"""A task's own documents read before they are scored or trained on: local ``<split>.jsonl``
files read with the file and line of what is wrong, where a refused document comes from, and a
loaded task's scored documents read once, in bulk (:func:`documents_read_once`).

Files (:meth:`LocalDocuments.from_files`): every line a JSON object in UTF-8 (blank lines are
skipped, as the datasets library skips them), at least one document a file, and each field of one
JSON type on every line of a task's files (nulls aside) — else the datasets library fails without
naming the file, or reads ``"0"`` among integers as ``0``. lm-eval then gets the documents as the
datasets library reads the files (``load_dataset("json", data_files=...)``, lm-eval's own call).
Their gold answers are checked in :mod:`~tango_fairscale.tasks.answers`; a document either check
refuses is a :class:`Problem`, named by :func:`refusal` with its file and line.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tango.common.dataset_dict import DatasetDictBase
from tango.common.exceptions import ConfigurationError

from ..checks import one_line, reason
from .task_methods import replace_method

#: How a refused document's message ends: what to change.
FIX_HINT = "fix the document, or give the task strict: false to skip such documents"

_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number with a fraction",
    str: "a string",
    list: "a list",
    dict: "an object",
}


def read_jsonl(path: Path, kinds: dict[str, tuple[str, str, int]] | None = None) -> list[int]:
    """The line number of each document of a ``<split>.jsonl`` file, after the file checks of
    the module docstring: a one-line ``ConfigurationError`` names the file and line. ``kinds``
    (``{field: (kind, file, line)}`` of each field's first value) carries the types of one
    task's other files: the datasets library gives all splits the first one's types."""
    kinds = {} if kinds is None else kinds
    lines: list[int] = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        text = _decode(raw[3:] if number == 1 and raw.startswith(b"\xef\xbb\xbf") else raw)
        if text is None:
            raise ConfigurationError(f"{path}:{number}: not UTF-8 text; save the file as UTF-8")
        if not text.strip():
            continue
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigurationError(
                f"{path}:{number}: malformed JSON ({error.msg} at column {error.colno}); give "
                "one JSON object per line"
            ) from None
        if not isinstance(document, dict):
            raise ConfigurationError(
                f"{path}:{number}: a JSON {type(document).__name__} where a document (a JSON "
                "object) belongs; give one JSON object per line"
            )
        for field, kind, value in _typed_fields(document):
            first_kind, first_file, first_line = kinds.setdefault(field, (kind, str(path), number))
            if kind != first_kind:
                where = (
                    f"line {first_line}"
                    if first_file == str(path)
                    else f"{first_file}:{first_line}"
                )
                raise ConfigurationError(
                    f"{path}:{number}: field {field!r} is {kind} ({short(value)}) but "
                    f"{first_kind} on {where}; give it one type on every line"
                )
        lines.append(number)
    if not lines:
        raise ConfigurationError(
            f"{path} holds no documents; give it one JSON object per line, or remove it"
        )
    return lines


def _decode(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _typed_fields(value: Any, prefix: str = "") -> Iterator[tuple[str, str, Any]]:
    """``(field, kind, value)`` for each non-null value of a JSON object or list, nested ones
    too (``choices.text[]`` for the items of ``choices``'s ``text``)."""
    items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    for key, item in items:
        field = f"{prefix}[]" if key is None else f"{prefix}.{key}" if prefix else str(key)
        if item is None:
            continue
        yield field, _KINDS[type(item)], item
        if isinstance(item, (dict, list)):
            yield from _typed_fields(item, field)


def _innermost(error: BaseException) -> BaseException:
    """The exception at the bottom of ``error``'s chain (what a library wrapped)."""
    for _ in range(20):
        inner = error.__cause__ or error.__context__
        if inner is None:
            break
        error = inner
    return error


def short(value: Any, limit: int = 60) -> str:
    """``value``'s ``repr`` on one line, cut to ``limit`` characters."""
    text = one_line(repr(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_rows(rows: Any) -> list[Any]:
    """``rows`` (a split's documents) as a list of what iterating them yields. A
    ``datasets.Dataset`` with no format set and no column to decode (images, audio) is read in
    bulk through Arrow, 10-20x faster than its row-by-row iteration (8,000 HellaSwag documents:
    0.03 against 0.49 s on 2 cores), the same dicts."""
    import datasets

    if (
        isinstance(rows, datasets.Dataset)
        and rows.format["type"] is None
        and not any(rows.features._column_requires_decoding.values())
    ):
        return rows.to_list()
    return list(rows)


class _DocumentsOf:
    """What lm-eval's ``Task.doc_iterator`` reads of a task: its config, and its scored documents
    as a list read once."""

    def __init__(self, task: Any) -> None:
        self.config = task.config
        self.eval_docs = plain_rows(task.eval_docs)


def documents_read_once(loaded: dict[str, Any]) -> dict[str, Any]:
    """``loaded``, each task's ``doc_iterator`` (what lm-eval's request building, its metrics and
    the stored requests' check iterate) going over its scored documents as read the first time
    (:func:`plain_rows`: in bulk), each yielded as a shallow copy as a dataset
    yields a new dict each time; lm-eval's own ``doc_iterator`` picks them (rank, limit,
    samples). Reading a ``datasets.Dataset`` row by row took 0.5 s a pass for HellaSwag's 8,000
    documents on 2 cores, and a scored task was read four times."""
    for task in loaded["tasks"].values():
        replace_method(task, "doc_iterator", functools.partial(_read_once, []))
    return loaded


def _read_once(
    read: list[_DocumentsOf], task: Any, iterate: Callable[..., Any], **kwargs: Any
) -> Iterator[tuple[int, Any]]:
    """``task``'s ``doc_iterator`` (lm-eval's, ``iterate``) over its documents as ``read`` holds
    them, read on the first call."""
    if not read:
        read.append(_DocumentsOf(task))
    for doc_id, doc in iterate(read[0], **kwargs):
        yield doc_id, dict(doc) if isinstance(doc, dict) else doc


@dataclass
class LocalDocuments:
    """A task's own documents, handed to lm-eval as its ``custom_dataset``: each split a
    ``datasets.Dataset``; document ``i`` of a split comes from line ``positions[split][i]`` of
    ``files[split]``, or, for a Tango ``DatasetDict``, is its document ``positions[split][i]``."""

    splits: dict[str, Any]
    positions: dict[str, list[int]]
    files: dict[str, str]

    @classmethod
    def from_files(cls, files: Mapping[str, str]) -> LocalDocuments:
        """``{split: path of a <split>.jsonl file}``, checked (:func:`read_jsonl`) and read."""
        import datasets

        kinds: dict[str, tuple[str, str, int]] = {}
        positions = {split: read_jsonl(Path(path), kinds) for split, path in files.items()}
        try:
            loaded = datasets.load_dataset("json", data_files=dict(files))
        except Exception as error:  # the datasets library's or pyarrow's, wrapped
            raise ConfigurationError(
                f"the datasets library cannot read {', '.join(files.values())} "
                f"({reason(_innermost(error))}); fix the files"
            ) from None
        return cls(dict(loaded), positions, dict(files))

    @classmethod
    def from_dataset(cls, dataset: DatasetDictBase) -> LocalDocuments:
        """The splits of a Tango ``DatasetDict`` that hold documents."""
        import datasets

        splits = {}
        for split in dataset.keys():
            if not len(dataset[split]):
                continue
            try:
                splits[split] = datasets.Dataset.from_list(list(dataset[split]))
            except Exception as error:  # pyarrow's, for a field of two types, say
                raise ConfigurationError(
                    f"split {split!r} of the task's dataset is not a table "
                    f"({reason(_innermost(error))}); give each field one type"
                ) from None
        return cls(splits, {split: list(range(len(rows))) for split, rows in splits.items()}, {})

    def __call__(self, **_: Any) -> Any:
        import datasets

        return datasets.DatasetDict(self.splits)

    def where(self, split: str, row: int) -> str:
        """Where document ``row`` of ``split`` comes from: ``file:line``, or its index."""
        position = self.positions[split][row]
        if split in self.files:
            return f"{self.files[split]}:{position}"
        return f"split {split!r} document {position}"

    def only(self, splits: Iterable[str]) -> LocalDocuments:
        """These documents of ``splits`` alone (those it holds)."""
        kept = [split for split in splits if split in self.splits]
        return LocalDocuments(
            {split: self.splits[split] for split in kept},
            {split: self.positions[split] for split in kept},
            {split: self.files[split] for split in kept if split in self.files},
        )

    def without(self, problems: Iterable[Problem]) -> LocalDocuments:
        """These documents without the rows of ``problems``."""
        dropped: dict[str, set[int]] = {}
        for problem in problems:
            assert problem.row is not None
            dropped.setdefault(problem.split, set()).add(problem.row)
        splits, positions = dict(self.splits), dict(self.positions)
        for split, rows in dropped.items():
            kept = [row for row in range(len(splits[split])) if row not in rows]
            splits[split] = splits[split].select(kept)
            positions[split] = [positions[split][row] for row in kept]
        return LocalDocuments(splits, positions, self.files)


@dataclass(frozen=True)
class Problem:
    """A document lm-eval cannot score as it is: its split, its row in the split (``None`` when
    unknown: after a ``process_docs`` that changed the number of documents, ``position`` is
    among the processed ones) and what is wrong."""

    split: str
    row: int | None
    what: str
    position: int | None = None

    def where(self, documents: LocalDocuments | None) -> str:
        if self.row is not None:
            if documents is not None:
                return documents.where(self.split, self.row)
            return f"split {self.split!r} document {self.row}"
        if self.position is not None:
            return f"split {self.split!r} document {self.position} (after process_docs)"
        return f"split {self.split!r}"


def refusal(task: str, problem: Problem, documents: LocalDocuments | None) -> str:
    """The one-line message refusing ``problem``'s document."""
    return f"task {task!r}: {problem.where(documents)}: {problem.what}; {FIX_HINT}"
