"""A task over its own data (``data_dir`` or ``dataset``): its documents read, the task's splits
fitted to the ones they hold, and lm-eval's loading over them checked document by document
(``strict: false`` leaving out those that fail); the splits a run reads of any task."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tango.common.dataset_dict import DatasetDictBase
from tango.common.exceptions import ConfigurationError

from ..checks import reason
from .answers import find_problems, process_documents
from .documents import LocalDocuments, Problem, refusal
from .piqa import holds_release

#: lm-eval's tasks of one loaded item (``{"tasks": {name: Task}, ...}``), from a task config.
Load = Callable[[Any], dict[str, Any]]


def data_files(data_dir: str, task: str) -> dict[str, str]:
    """``{split: path}`` of the ``<split>.jsonl`` files of ``data_dir``; none is refused, and so
    is PIQA's official release (its reader is the ``tango_fairscale::piqa`` step)."""
    directory = Path(data_dir).expanduser()
    if holds_release(directory):
        raise ConfigurationError(
            f"task {task!r}: data_dir {data_dir!r} holds PIQA's official release files, not "
            f"<split>.jsonl documents: give it to a tango_fairscale::piqa step instead "
            f"(configs/mc_suite.jsonnet: -D data_dir={data_dir})"
        )
    files = {path.stem: str(path.resolve()) for path in sorted(directory.glob("*.jsonl"))}
    if not files:
        raise ConfigurationError(
            f"task {task!r}: data_dir {data_dir!r} holds no <split>.jsonl files"
        )
    return files


def read_documents(
    data_dir: str | None, dataset: DatasetDictBase | None, task: str
) -> LocalDocuments:
    """A task's own documents (``data_dir`` or ``dataset``), read and checked."""
    files = None if data_dir is None else data_files(data_dir, task)
    try:
        if files is not None:
            return LocalDocuments.from_files(files)
        assert dataset is not None
        return LocalDocuments.from_dataset(dataset)
    except ConfigurationError as error:
        raise ConfigurationError(f"task {task!r}: {error}") from None


def load_local(
    load: Load,
    config: dict[str, Any],
    documents: LocalDocuments,
    splits: list[str],
    task: str,
    strict: bool,
) -> tuple[dict[str, Any], list[str]]:
    """lm-eval's task of ``config`` over its own ``documents`` of ``splits`` alone (``load``-ed),
    checked; with ``strict`` false, loaded again without the documents that fail the checks, and
    where those were (``loaded["skipped_documents"]`` counts them). lm-eval is given the splits a
    run reads alone: it materialises its few-shot candidates (PIQA's 16,113 training documents,
    1.0-1.4 s on an H200's host) at 0 shots too."""
    documents = documents.only(splits)
    config = dict(config)
    keep_splits(config, splits, task)
    skipped: list[str] = []
    for _ in range(3):  # a document that fails lm-eval's own loading may hide others
        try:
            loaded = load({**config, "custom_dataset": documents})
        except Exception as error:
            problems = _diagnose(load, config, documents, splits)
            if not problems:
                if isinstance(error, ConfigurationError):
                    raise
                raise ConfigurationError(
                    f"task {task!r}: lm-eval cannot load it ({reason(error)})"
                ) from None
        else:
            (loaded_task,) = loaded["tasks"].values()
            problems = find_problems(
                loaded_task, {split: documents.splits[split] for split in splits}
            )
            if not problems:
                if skipped:
                    loaded["skipped_documents"] = {loaded_task.task_name: len(skipped)}
                return loaded, skipped
        if strict or any(problem.row is None for problem in problems):
            raise ConfigurationError(refusal(task, problems[0], documents))
        skipped += [problem.where(documents) for problem in problems]
        documents = documents.without(problems)
    raise ConfigurationError(f"task {task!r}: its documents keep failing lm-eval's loading")


def _diagnose(
    load: Load, config: dict[str, Any], documents: LocalDocuments, splits: list[str]
) -> list[Problem]:
    """The documents that made lm-eval fail to build the task: those its ``process_docs``
    fails on, else — when it builds without it — the first scored document (lm-eval reads that
    one while building a task) and any other that fails the checks."""
    problems = []
    for split, rows in documents.splits.items():
        problems += process_documents(config.get("process_docs"), split, rows)[1]
    scored = config.get("test_split") or config.get("validation_split")
    if problems or scored is None or len(documents.splits[scored]) < 2:
        return problems
    rest = documents.without([Problem(scored, 0, "")])
    try:
        loaded = load({**config, "custom_dataset": rest})
    except Exception:
        return []
    (task,) = loaded["tasks"].values()
    return find_problems(task, {split: documents.splits[split] for split in splits})


def splits_read(config: Any, num_fewshot: int | None, training: bool) -> list[str]:
    """The splits whose documents a run reads, of a task's config (a dict or lm-eval's
    ``TaskConfig``): the scored one (test, else validation), the few-shot one when
    ``num_fewshot`` > 0 (lm-eval's: the few-shot split, else training, else validation, else
    test; none when the config lists its examples) and, when ``training``, the training split."""

    def get(source: Any, key: str) -> Any:
        return source.get(key) if isinstance(source, Mapping) else getattr(source, key, None)

    test, validation, train = (
        get(config, f"{key}_split") for key in ("test", "validation", "training")
    )
    fewshot = get(config, "fewshot_config")
    named = get(fewshot, "split") if fewshot is not None else None
    named = named or get(config, "fewshot_split")
    splits = [test or validation]
    if num_fewshot and (named or fewshot is None or get(fewshot, "samples") is None):
        splits.append(named or train or validation or test)
    if training:
        splits.append(train)
    return [split for split in dict.fromkeys(splits) if split is not None]


def keep_splits(config: dict[str, Any], present: list[str], task: str) -> None:
    """Forget the splits of ``config`` that local data does not hold (a task scores its test
    split, else its validation split; few-shot examples come from its few-shot split, else its
    training split, else its validation split, else its test split): one of the two it can score
    must be there. When few-shot examples then come from the scored split, no document is shown
    in its own context (:func:`_fewshot_from_the_scored_split`)."""
    evaluated = [config.get(key) for key in ("test_split", "validation_split") if config.get(key)]
    if not evaluated:
        raise ConfigurationError(
            f"task {task!r} names no split to score: give its config a test_split or "
            "validation_split"
        )
    if not any(split in present for split in evaluated):
        raise ConfigurationError(
            f"task {task!r} scores split {' or '.join(map(repr, evaluated))}, which its data "
            f"does not hold (its splits: {', '.join(map(repr, present)) or 'none'}): give it "
            f"that split (in a data_dir, the file {evaluated[0]}.jsonl)"
        )
    for key in ("training_split", "validation_split", "test_split", "fewshot_split"):
        if config.get(key) is not None and config[key] not in present:
            config[key] = None
    fewshot = config.get("fewshot_config")
    if isinstance(fewshot, dict) and fewshot.get("split") not in (None, *present):
        config["fewshot_config"] = {**fewshot, "split": None}
    _fewshot_from_the_scored_split(config)


def _fewshot_from_the_scored_split(config: dict[str, Any]) -> None:
    """Make lm-eval leave each document out of its own context when its few-shot examples come
    from the split it scores. lm-eval does so only when the few-shot split it is given equals
    ``test_split``; local data that lacks the other splits would otherwise show documents, with
    their answers, in their own contexts. So name the scored split as both, lm-eval's own form
    for drawing few-shot examples from the scored split."""
    given = config.get("fewshot_config")
    fewshot: dict[str, Any] = given if isinstance(given, dict) else {}
    named = fewshot.get("split") or config.get("fewshot_split")  # lm-eval's few-shot split
    if named is None and fewshot.get("samples") is not None:
        return  # examples listed in the config, not drawn from a split
    scored = config.get("test_split") or config.get("validation_split")
    fallback = [config.get(key) for key in ("training_split", "validation_split", "test_split")]
    source = named or next((split for split in fallback if split), None)
    if scored is None or source != scored or named == config.get("test_split"):
        return
    config.update(test_split=scored, fewshot_split=scored)
    if config.get("validation_split") == scored:
        config["validation_split"] = None
    if fewshot.get("split"):
        config["fewshot_config"] = {**fewshot, "split": scored}
