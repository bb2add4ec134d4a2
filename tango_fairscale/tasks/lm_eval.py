"""lm-evaluation-harness as the task library: task specs (a name, a YAML, a config; local data)
loaded into lm-eval's own Task objects, checked up front."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tango.common import FromParams, Params
from tango.common.dataset_dict import DatasetDictBase
from tango.common.det_hash import CustomDetHash
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import boolean, document_limit, one_line, text
from ..compat.lm_eval import fix_lm_eval
from ..records.fingerprint import local_fingerprint
from .answers import find_problems
from .builtin import builtin, full_task_manager, included, lm_eval_version
from .documents import LocalDocuments, documents_read_once, refusal
from .generation import check_generation_task, refuse_code_execution
from .local_data import data_files, keep_splits, load_local, read_documents, splits_read
from .local_files import dataset_files, yaml_files

logger = logging.getLogger(__name__)

#: The output types the package answers: log-likelihoods, and text generated until a stop.
OUTPUT_TYPES = ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")

#: lm-eval's default few-shot seed (``simple_evaluate``'s ``fewshot_random_seed``).
DEFAULT_FEWSHOT_SEED = 1234

#: TaskSpec fields in its hash only when set: the keys of specs that leave them unset stay as
#: they were before the fields existed.
KEYED_WHEN_SET = (
    "strict",
    "apply_chat_template",
    "system_instruction",
    "fewshot_as_multiturn",
    "include_path",
    "gen_kwargs",
)

TaskDict = dict[str, Any]  # lm-eval's {"tasks": {name: Task}, "groups": ..., "group_map": ...}


@dataclass
class TaskSpec(FromParams, CustomDetHash):
    """One task (or group) of lm-evaluation-harness, as a config names it.

    Give one of:

    :param name: an lm-eval task, group or tag: ``"piqa"``, ``"mmlu_anatomy"``, ``"mmlu"``. A
        plain string in a config stands for ``{name: ...}``.
    :param yaml: a task YAML of your own (it may ``include:`` one of lm-eval's by path).
    :param config: a task config as such a YAML holds it (``task``, ``dataset_path``, ...).

    and optionally:

    :param data_dir: a directory of ``<split>.jsonl`` files in the task's own schema, read
        instead of its hub dataset (the task's prompts, choices and metrics are kept).
    :param dataset: a Tango ``DatasetDict`` (e.g. ``{ref: "piqa"}``) read instead, likewise.
    :param num_fewshot: few-shot examples per context (``null``: the task's own default, else 0).
    :param fewshot_seed: seeds the choice of few-shot examples (lm-eval's default 1234).
    :param limit: score only the first ``limit`` documents, or that fraction of them (``0.1``:
        a tenth, rounded up, as lm-eval's ``--limit``; ``null``: all).
    :param strict: refuse a document that cannot be scored (its answer is not one of its
        choices, say; see :mod:`~tango_fairscale.tasks.answers`) in one line naming its file
        and line (``true``, the default), or leave such documents out of a task's own
        ``data_dir`` or ``dataset``, logging how many (``false``).
    :param apply_chat_template: prompts in the tokenizer's chat template (lm-eval's
        ``--apply_chat_template``), few-shot examples as turns unless ``fewshot_as_multiturn``.
    :param system_instruction: a system prompt (lm-eval's ``--system_instruction``).
    :param include_path: a folder of task YAMLs of your own, where a ``name`` is looked up before
        lm-eval's tasks (lm-eval's ``--include_path``; its tasks, not its groups or tags).
    :param gen_kwargs: generation settings laid over each ``generate_until`` task's own
        ``generation_kwargs`` (lm-eval's ``--gen_kwargs``: ``{max_gen_toks: 64, until: ["\\n"]}``).

    Example (Jsonnet)::

        tasks: ["piqa", {name: "arc_easy", num_fewshot: 2}, {name: "hellaswag", limit: 500},
                {name: "winogrande", data_dir: "/data/winogrande"}]

    Its Tango hash (in the cache key of the steps that take it) is its fields and the
    fingerprint of the local files it reads (:meth:`local_files`, by content): a data directory
    or YAML changed in place is scored again.
    """

    name: str | None = None
    yaml: str | None = None
    config: dict[str, Any] | None = None
    data_dir: str | None = None
    dataset: DatasetDictBase | None = None
    num_fewshot: int | None = None
    fewshot_seed: int = DEFAULT_FEWSHOT_SEED
    limit: int | float | None = None
    strict: bool = True
    apply_chat_template: bool = False
    system_instruction: str | None = None
    fewshot_as_multiturn: bool = True
    include_path: str | None = None
    gen_kwargs: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        given = [field for field in ("name", "yaml", "config") if getattr(self, field) is not None]
        if len(given) != 1:
            raise ConfigurationError(
                f"a task needs exactly one of 'name', 'yaml' or 'config', got {given or 'none'}"
            )
        if self.data_dir is not None and self.dataset is not None:
            raise ConfigurationError("give a task 'data_dir' or 'dataset', not both")
        if self.num_fewshot is not None and (
            isinstance(self.num_fewshot, bool)
            or not isinstance(self.num_fewshot, int)
            or self.num_fewshot < 0
        ):
            raise ConfigurationError(
                f"num_fewshot must be 0, a positive integer or null, got {self.num_fewshot!r}"
            )
        document_limit("limit", self.limit)
        boolean("strict", self.strict)
        if not self.strict and self.data_dir is None and self.dataset is None:
            raise ConfigurationError(
                "strict: false leaves out bad documents of a task's own data only: give the "
                "task data_dir or dataset, or drop strict"
            )
        boolean("apply_chat_template", self.apply_chat_template)
        boolean("fewshot_as_multiturn", self.fewshot_as_multiturn)
        text("system_instruction", self.system_instruction, optional=True)
        text("include_path", self.include_path, optional=True)
        if self.gen_kwargs is not None and not isinstance(self.gen_kwargs, dict):
            raise ConfigurationError(f"gen_kwargs must be an object, got {self.gen_kwargs!r}")
        if self.config is not None and not isinstance(self.config, dict):
            raise ConfigurationError(f"a task 'config' must be an object, got {self.config!r}")
        self._check_sources()

    def _check_sources(self) -> None:
        """Refuse at once — Tango builds every step's spec before it runs any step — a name
        lm-eval does not know, a ``yaml`` or ``data_dir`` that is not there."""
        local = self.data_dir is not None or self.dataset is not None
        self._included = None
        if self.name is not None and self.include_path is not None:
            self._included = included(self.include_path, self.name)
        if self.name is not None and self._included is None:
            builtin(self.name, local)
        if self.yaml is not None and not Path(self.yaml).expanduser().is_file():
            raise ConfigurationError(f"task YAML {self.yaml!r} does not exist")
        if self.data_dir is not None:
            data_files(self.data_dir, self.label)

    @classmethod
    def from_params(  # type: ignore[override]
        cls, params_: Any, *args: Any, **kwargs: Any
    ) -> TaskSpec:
        if isinstance(params_, str):  # a bare task name
            return cls(name=params_)
        if isinstance(params_, Params) and set(params_.keys()) == {"type"}:  # Tango's form of it
            return cls(name=params_.pop("type"))
        if isinstance(params_, Params) and isinstance(params_.get("config"), Mapping):
            # Passed as it is: Tango would try to build its values as components.
            config = params_.pop("config").as_dict(quiet=True)
            return super().from_params(params_, *args, config=config, **kwargs)
        if isinstance(params_, Params) and isinstance(
            dataset := params_.get("dataset"), DatasetDictBase
        ):
            # A step's result as it is: Tango would deep-copy it to try each type of the field's
            # union, and its pop() write it out in a debug message (PIQA's examples: 0.5 s).
            del params_["dataset"]
            return super().from_params(params_, *args, dataset=dataset, **kwargs)
        return super().from_params(params_, *args, **kwargs)

    def det_hash_object(self) -> Any:
        fields = tuple(
            (f.name, getattr(self, f.name))
            for f in dataclasses.fields(self)
            if f.name not in KEYED_WHEN_SET or getattr(self, f.name) != f.default
        )
        return (fields, local_fingerprint(self.local_files()), lm_eval_version())  # its task code

    def local_files(self) -> list[Path]:
        """The files (and directories) the task reads from disk
        (:mod:`~tango_fairscale.tasks.local_files`): ``data_dir``'s ``<split>.jsonl``, else the
        data its ``yaml`` or ``config`` names; the ``yaml``, the YAMLs it includes and its
        ``!function`` modules (not lm-eval's own)."""
        files: list[Path] = []
        if self.data_dir is not None:
            files += sorted(Path(self.data_dir).expanduser().glob("*.jsonl"))
        config = self.config
        if self.yaml_file is not None:
            definitions, config = yaml_files(Path(self.yaml_file))
            files += definitions
        if self.data_dir is None and self.dataset is None and config is not None:
            files += dataset_files(config)
        return files

    @property
    def yaml_file(self) -> str | None:
        """The task YAML the spec loads: its ``yaml``, or the one its ``name`` names in its
        ``include_path`` (found when the spec is made)."""
        return self._included or self.yaml

    @property
    def label(self) -> str:
        """The task's name, for messages and result keys."""
        if self.name is not None:
            return self.name
        if self.yaml is not None:
            return Path(self.yaml).stem
        assert self.config is not None
        return str(self.config.get("task") or self.config.get("group") or "task")


# --- loading ------------------------------------------------------------------------------------


def load_tasks(spec: TaskSpec, *, training: bool = False) -> TaskDict:
    """lm-eval's tasks for ``spec`` (a group's leaves too), with its few-shot settings applied as
    ``lm_eval.simple_evaluate`` applies them, and the documents a run reads checked
    (:mod:`~tango_fairscale.tasks.answers`): those of the split each task scores, of its
    few-shot split when ``num_fewshot`` > 0 and, when ``training``, of its training split.

    Raises one-line ``ConfigurationError`` s for an unknown name (with the closest), a task that
    runs generated code or asks for generation settings the package does not decode with
    (:mod:`~.generation`), a dataset that cannot be reached offline, a task YAML that does not
    parse, and a document that cannot be scored (naming its file and line). With ``strict:
    false`` such documents are left out, logged and counted: ``loaded["skipped_documents"]`` is
    ``{task: count}`` (absent when none is)."""
    fix_lm_eval()
    manager, item, documents = _source(spec)
    if documents is not None:
        splits = splits_read(item, _num_fewshot(spec, item.get("num_fewshot")), training)
        load = functools.partial(_load, manager, spec=spec)
        loaded, skipped = load_local(load, item, documents, splits, spec.label, spec.strict)
        if skipped:
            _report_skipped(spec, skipped)
        return documents_read_once(loaded)
    loaded = _load(manager, item, spec)
    for name, task in loaded["tasks"].items():
        splits = splits_read(task.config, task.get_config("num_fewshot"), training)
        dataset = getattr(task, "dataset", None) or {}
        problems = find_problems(task, {s: dataset[s] for s in splits if s in dataset})
        if problems:
            raise ConfigurationError(refusal(name, problems[0], None))
    return documents_read_once(loaded)


def _load(manager: Any, item: Any, spec: TaskSpec) -> TaskDict:
    """``manager.load([item])`` with ``spec``'s few-shot settings, lm-eval's errors in one line."""
    try:
        loaded = manager.load([item])
    except KeyError as error:
        message = one_line(error)
        if "not a registered" in message:
            raise ConfigurationError(f"unknown lm-eval task {spec.label!r}: {message}") from None
        raise ConfigurationError(f"task {spec.label!r}: missing {message}") from None
    except (ConnectionError, RuntimeError, FileNotFoundError) as error:
        raise ConfigurationError(_unreachable(spec, error)) from None
    except (TypeError, ValueError) as error:  # a key TaskConfig does not take, a bad value
        raise ConfigurationError(f"task {spec.label!r}: {one_line(error, 300)}") from None
    for name, task in loaded["tasks"].items():
        _check_output_type(name, task.get_config("output_type") or "generate_until")
        if spec.gen_kwargs and task.get_config("output_type") == "generate_until":
            task.set_config(key="generation_kwargs", value=dict(spec.gen_kwargs), update=True)
        check_generation_task(name, task)
        task.set_config(key="num_fewshot", value=_num_fewshot(spec, task.get_config("num_fewshot")))
        task.set_fewshot_seed(seed=spec.fewshot_seed)
    return loaded


def _num_fewshot(spec: TaskSpec, configured: int | None) -> int:
    """``spec``'s ``num_fewshot`` for a task configured with ``configured`` (lm-eval keeps a
    YAML's explicit 0; without either, 0)."""
    if spec.num_fewshot is not None and configured != 0:
        return spec.num_fewshot
    return configured or 0


def _report_skipped(spec: TaskSpec, where: list[str]) -> None:
    shown = ", ".join(where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")
    logger.warning(
        "task %r: skipped %d document(s) that cannot be scored (strict: false): %s",
        spec.label,
        len(where),
        shown,
    )


def _source(spec: TaskSpec) -> tuple[Any, Any, LocalDocuments | None]:
    """The ``TaskManager`` to load ``spec`` with, what to pass to its ``load`` and the task's own
    documents (read and checked here), if it has any."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    local = spec.data_dir is not None or spec.dataset is not None
    if spec.config is not None:
        config = dict(spec.config)
    elif spec.yaml_file is not None:
        path = Path(spec.yaml_file).expanduser()
        refuse_code_execution(spec.label, path)
        try:
            config = load_yaml(path.resolve(), resolve_func=True)
        except Exception as error:  # yaml's errors, a missing include, a bad !function
            raise ConfigurationError(
                f"task YAML {spec.yaml_file!r} does not parse: {one_line(error, 300)}"
            ) from None
    else:
        assert spec.name is not None
        kind, yaml_path = builtin(spec.name, local)
        if kind != "TASK" or yaml_path is None:  # groups, tags and Python tasks
            return full_task_manager(), spec.name, None
        refuse_code_execution(spec.name, yaml_path)
        config = load_yaml(Path(yaml_path), resolve_func=True)
    _check_output_type(spec.label, config.get("output_type", "generate_until"))
    check_generation_task(spec.label, None, config)
    if not local:
        return TaskManager(include_defaults=False), config, None
    documents = read_documents(spec.data_dir, spec.dataset, spec.label)
    keep_splits(config, list(documents.splits), spec.label)
    if spec.data_dir is not None:
        config.update(dataset_path="json", dataset_name=None)
    config["dataset_kwargs"] = None  # the documents are lm-eval's custom_dataset
    return TaskManager(include_defaults=False), config, documents


def _check_output_type(task: str, output_type: str) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ConfigurationError(
            f"task {task!r} has output_type {output_type!r}; the package answers "
            f"{', '.join(OUTPUT_TYPES)}: choose another task"
        )


def _unreachable(spec: TaskSpec, error: BaseException) -> str:
    return (
        f"task {spec.label!r}: its dataset cannot be loaded ({type(error).__name__}: "
        f"{one_line(error, 200)}); offline, give its files as data_dir=<directory of "
        "<split>.jsonl files in the task's schema> (or dataset=<a Tango DatasetDict step>)"
    )
