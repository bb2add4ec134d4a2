"""A task's documents checked before scoring or training (``tango_fairscale.tasks.documents``):
a bad ``<split>.jsonl`` line or a document whose gold answer is not one of its choices is refused
in one line naming the file, line and field — on every fixture task format, whether lm-eval would
have crashed, warned or silently scored another choice — and ``strict: false`` leaves such
documents out, counted, the others scored as lm-eval scores them."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tango.common.dataset_dict import DatasetDict
from tango.common.exceptions import ConfigurationError

from tango_fairscale.tasks.documents import plain_rows, read_jsonl
from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

from .test_lm_eval import DATA_DIR, FIXTURES, TASKS, LengthLM

Edit = Callable[[dict], Any]


def one_line(error: BaseException, *fragments: str) -> None:
    message = str(error)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def data_dir(tmp_path: Path, task: str, edits: dict[str, dict[int, Edit]] | None = None) -> Path:
    """A copy of ``task``'s fixture files, ``edits[split][i]`` applied to document ``i``."""
    directory = tmp_path / task
    directory.mkdir(parents=True, exist_ok=True)
    for source in sorted((FIXTURES / DATA_DIR[task]).glob("*.jsonl")):
        lines = source.read_text(encoding="utf-8").splitlines()
        for index, edit in (edits or {}).get(source.stem, {}).items():
            document = json.loads(lines[index])
            edit(document)
            lines[index] = json.dumps(document, ensure_ascii=False)
        (directory / source.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def setting(field: str, value: Any) -> Edit:
    return lambda document: document.__setitem__(field, value)


def dropping(field: str) -> Edit:
    return lambda document: document.pop(field)


def load(directory: Path, task: str, **options: Any) -> dict:
    training = options.pop("training", False)
    return load_tasks(TaskSpec(name=task, data_dir=str(directory), **options), training=training)


# <split>.jsonl files ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"a": 1}\n{"a": 2,}\n', "x.jsonl:2: malformed JSON (Expecting property name"),
        (b'{"a": 1}\n[1, 2]\n', "x.jsonl:2: a JSON list where a document (a JSON object) belongs"),
        (b"", "x.jsonl holds no documents"),
        (b"\n  \n", "x.jsonl holds no documents"),
        (b'{"a": 1}\n{"a": "caf\xe9"}\n', "x.jsonl:2: not UTF-8 text"),
        (
            b'{"label": 0}\n{"label": 1}\n{"label": "1"}\n',
            "x.jsonl:3: field 'label' is a string ('1') but an integer on line 1",
        ),
        (
            b'{"c": {"label": ["A", "B"]}}\n{"c": {"label": ["A", 2]}}\n',
            "x.jsonl:2: field 'c.label[]' is an integer (2) but a string on line 1",
        ),
        (b'{"s": 0.5}\n{"s": 1}\n', "x.jsonl:2: field 's' is an integer (1) but a number with"),
    ],
)
def test_a_bad_file_is_refused_naming_its_line(
    tmp_path: Path, content: bytes, fragment: str
) -> None:
    (tmp_path / "x.jsonl").write_bytes(content)
    with pytest.raises(ConfigurationError) as error:
        read_jsonl(tmp_path / "x.jsonl")
    one_line(error.value, fragment)


def test_blank_lines_nulls_crlf_and_a_byte_order_mark_are_read_as_the_datasets_library_reads(
    tmp_path: Path,
) -> None:
    text = '\ufeff{"a": 1, "b": null}\r\n\n{"a": 2, "b": "x"}\r\n   \n{"a": 3}\n\n'
    (tmp_path / "x.jsonl").write_text(text, encoding="utf-8")
    assert read_jsonl(tmp_path / "x.jsonl") == [1, 3, 5]


def replace_line(path: Path, index: int, text: str) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[:index] + [text] + lines[index + 1 :]) + "\n")


@pytest.mark.parametrize(
    ("task", "change", "fragment"),
    [
        # was lm-eval's StopIteration
        ("piqa", lambda d: (d / "train.jsonl").write_text(""), "train.jsonl holds no documents"),
        # was the datasets library's DatasetGenerationError, naming no file
        (
            "piqa",
            lambda d: replace_line(d / "validation.jsonl", 3, '{"goal": "g", "sol1": '),
            "validation.jsonl:4: malformed JSON",
        ),
        # was scored ("x" silently), or pyarrow's ArrowInvalid naming no file in larger files
        (
            "mmlu_anatomy",
            lambda d: replace_line(d / "test.jsonl", 3, '{"question": "q", "answer": "x"}'),
            "test.jsonl:4: field 'answer' is a string ('x') but an integer on ",
        ),
    ],
)
def test_a_bad_split_file_is_refused_naming_file_and_line(
    tmp_path: Path, task: str, change: Callable[[Path], Any], fragment: str
) -> None:
    directory = data_dir(tmp_path, task)
    change(directory)
    with pytest.raises(ConfigurationError) as error:
        load(directory, task, num_fewshot=2)
    one_line(error.value, f"task {task!r}: {directory}/", fragment)


# gold answers ---------------------------------------------------------------------------------

ANSWER_OUT_OF_RANGE = "its answer (read from 'label') is 2, not the index of one of its 2 choices"

BAD_ANSWERS = [
    # lm-eval would score choice 2 as the answer, silently:
    ("copa", "validation", 3, setting("label", 5), "'label' is 5, not the index of one of its 2"),
    ("copa", "validation", 3, dropping("label"), "'label' is missing"),
    # lm-eval would warn and count the document as wrong:
    ("boolq", "validation", 3, setting("label", 2), ANSWER_OUT_OF_RANGE),
    ("piqa", "validation", 3, setting("label", 2), ANSWER_OUT_OF_RANGE),
    (
        "hellaswag",
        "validation",
        5,
        setting("label", "4"),
        "(read from 'label') is 4, not the index",
    ),
    ("mmlu_anatomy", "test", 2, setting("answer", 4), "(read from 'answer') is 4, not the index"),
    # lm-eval would crash with a traceback (Jinja's ValueError, a KeyError):
    ("arc_easy", "test", 3, dropping("answerKey"), "'answerKey' is missing"),
    ("arc_easy", "test", 0, dropping("answerKey"), "'answerKey' is missing"),
    ("openbookqa", "test", 3, setting("answerKey", "Z"), "its answer from 'answerKey' (ValueError"),
    ("winogrande", "validation", 3, setting("answer", "3"), "from 'answer' (KeyError: '3')"),
    ("winogrande", "validation", 0, setting("answer", "3"), "from 'answer' (KeyError: '3')"),
    ("hellaswag", "validation", 2, dropping("label"), "lm-eval's process_docs cannot read it"),
]


@pytest.mark.parametrize(("task", "split", "index", "edit", "fragment"), BAD_ANSWERS)
def test_a_document_without_a_valid_answer_is_refused_naming_file_line_and_field(
    tmp_path: Path, task: str, split: str, index: int, edit: Edit, fragment: str
) -> None:
    directory = data_dir(tmp_path, task, {split: {index: edit}})
    with pytest.raises(ConfigurationError) as error:
        load(directory, task)
    where = f"task {task!r}: {directory / f'{split}.jsonl'}:{index + 1}: "
    one_line(error.value, where, fragment, "strict: false")


def test_a_label_field_of_strings_is_refused_where_the_task_reads_integers(tmp_path: Path) -> None:
    # Every label "0" or "1": copa compares label with 0, so every answer would be choice 2.
    directory = data_dir(tmp_path, "copa")
    validation = (directory / "validation.jsonl").read_text().splitlines()
    documents = [
        {**json.loads(line), "label": str(json.loads(line)["label"])} for line in validation
    ]
    (directory / "validation.jsonl").write_text("".join(json.dumps(d) + "\n" for d in documents))
    with pytest.raises(ConfigurationError) as error:  # the training file's labels are integers
        load(directory, "copa")
    one_line(error.value, "validation.jsonl:1: field 'label' is a string ('1') but an integer on")
    (directory / "train.jsonl").unlink()
    with pytest.raises(ConfigurationError) as error:
        load(directory, "copa")
    one_line(error.value, "validation.jsonl:1: 'label' is '1', not the index of one of its 2")


def test_training_and_few_shot_documents_are_checked_where_they_are_read(tmp_path: Path) -> None:
    directory = data_dir(tmp_path, "boolq", {"train": {1: setting("label", 2)}})
    load(directory, "boolq")  # scoring zero-shot reads no training document
    for options in ({"training": True}, {"num_fewshot": 2}):
        with pytest.raises(ConfigurationError) as error:
            load(directory, "boolq", **options)
        one_line(error.value, f"{directory / 'train.jsonl'}:2: {ANSWER_OUT_OF_RANGE}")
    directory = data_dir(tmp_path / "arc", "arc_easy", {"train": {4: dropping("answerKey")}})
    with pytest.raises(ConfigurationError) as error:  # was Jinja's ValueError in training
        load(directory, "arc_easy", training=True)
    one_line(error.value, f"{directory / 'train.jsonl'}:5: 'answerKey' is missing")


def test_a_tango_dataset_document_is_named_by_split_and_index() -> None:
    rows = [{"goal": f"g{i}", "sol1": "a", "sol2": "b", "label": i % 2} for i in range(4)]
    bad = DatasetDict(splits={"train": rows, "validation": rows[:2] + [{**rows[2], "label": 7}]})
    with pytest.raises(ConfigurationError) as error:
        load_tasks(TaskSpec(name="piqa", dataset=bad))
    one_line(error.value, "task 'piqa': split 'validation' document 2: its answer (read from")
    mixed = DatasetDict(splits={"validation": rows[:2] + [{**rows[2], "label": "x"}]})
    with pytest.raises(ConfigurationError) as error:  # was pyarrow's ArrowInvalid traceback
        load_tasks(TaskSpec(name="piqa", dataset=mixed))
    one_line(error.value, "task 'piqa': split 'validation' of the task's dataset is not a table")


@pytest.mark.parametrize("task", TASKS)
def test_every_fixture_task_passes_the_checks(task: str) -> None:
    spec = TaskSpec(name=task, data_dir=str(FIXTURES / DATA_DIR[task]), num_fewshot=2)
    assert "skipped_documents" not in load_tasks(spec, training=True)


# strict: false --------------------------------------------------------------------------------


def requests(loaded: dict, task: str) -> list:
    lm_eval_task = loaded["tasks"][task]
    lm_eval_task.build_all_requests(limit=None, rank=0, world_size=1)
    return [instance.arguments for instance in lm_eval_task.instances]


@pytest.mark.parametrize(
    ("task", "split", "bad"),
    [
        ("copa", "validation", {3: setting("label", 5), 7: dropping("label")}),
        ("arc_easy", "test", {0: dropping("answerKey"), 5: setting("answerKey", "Q")}),
        ("hellaswag", "validation", {2: dropping("label"), 9: setting("label", "7")}),
    ],
)
def test_strict_false_leaves_bad_documents_out_and_counts_them(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    task: str,
    split: str,
    bad: dict[int, Edit],
) -> None:
    directory = data_dir(tmp_path / "bad", task, {split: bad})
    with caplog.at_level(logging.WARNING, logger="tango_fairscale.tasks.lm_eval"):
        loaded = load(directory, task, strict=False, num_fewshot=2)
    assert loaded["skipped_documents"] == {task: 2}
    lines = ", ".join(f"{directory / f'{split}.jsonl'}:{index + 1}" for index in sorted(bad))
    assert f"task {task!r}: skipped 2 document(s) that cannot be scored" in caplog.text
    assert lines in caplog.text
    clean = data_dir(tmp_path / "clean", task)
    kept = [
        line
        for index, line in enumerate((clean / f"{split}.jsonl").read_text().splitlines())
        if index not in bad
    ]
    (clean / f"{split}.jsonl").write_text("\n".join(kept) + "\n")
    assert requests(loaded, task) == requests(load(clean, task, num_fewshot=2), task)


def test_strict_false_is_counted_in_the_scores(tmp_path: Path) -> None:
    from tango_fairscale.evaluation.harness import evaluate_task

    directory = data_dir(tmp_path, "piqa", {"validation": {1: setting("label", 3)}})
    spec = TaskSpec(name="piqa", data_dir=str(directory), strict=False)
    scores = evaluate_task(LengthLM(), spec, bootstrap_iters=0)
    assert scores["skipped_documents"] == {"piqa": 1}
    assert scores["n-samples"]["piqa"]["effective"] == 25


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"strict": "no"}, "strict must be true or false, got 'no'"),
        ({"strict": False}, "strict: false leaves out bad documents of a task's own data only"),
    ],
)
def test_strict_must_be_a_boolean_and_applies_to_local_data(options: dict, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as error:
        TaskSpec(name="piqa", **options)
    one_line(error.value, fragment)


def test_plain_rows_are_what_iterating_the_dataset_yields() -> None:
    import datasets

    rows = [
        {"goal": "a", "sol": ["x", "y"], "meta": {"n": 1, "tags": ["p"]}, "label": 0},
        {"goal": "b", "sol": ["z"], "meta": {"n": None, "tags": []}, "label": None},
    ]
    dataset = datasets.Dataset.from_list(rows)
    assert plain_rows(dataset) == list(dataset) == rows
    selected = dataset.select([1])  # an indices mapping over the table
    assert plain_rows(selected) == list(selected) == rows[1:]
    formatted = dataset.with_format("numpy")  # not plain: iterated as it is
    assert [row["goal"] for row in plain_rows(formatted)] == [row["goal"] for row in formatted]
    assert plain_rows(iter(rows)) == rows
