"""What ``tango-fairscale eval`` shows and writes as lm-eval does: the results JSON of a run's
``metrics`` step with the fields lm-eval's ``EvaluationTracker`` adds, the header and tables
``lm_eval`` prints, and the file ``lm_eval --output_path`` writes them to (lm-eval 0.4.13)."""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from .evaluation import DEFAULT_BATCH_SIZE


def lm_eval_results(
    workspace: str, run_name: str, args: argparse.Namespace, started: float
) -> dict[str, Any]:
    """lm-eval's results JSON of the run's ``metrics`` step, with a ``config`` as lm-eval
    writes one and the fields its ``EvaluationTracker`` adds (``started``: the command's
    ``time.time()`` at its start)."""
    from dataclasses import asdict

    from tango import Workspace

    metrics = Workspace.from_url(workspace).step_result_for_run(run_name, "metrics")
    results = dict(metrics["lm_eval"])
    scored = results.pop("config", {})
    if not results.get("groups"):  # lm-eval writes the key only where there are groups
        results.pop("groups", None)
    results["config"] = {  # typed as lm-eval types them: a dict, a string, a float
        "model": "tango_fairscale",
        "model_args": {"pretrained": args.model},
        "batch_size": str(args.batch_size or DEFAULT_BATCH_SIZE),
        "batch_sizes": [],
        "device": scored.get("device"),
        "precision": scored.get("precision"),
        "limit": _limit(args),
        "num_fewshot": args.num_fewshot,
        "gen_kwargs": args.gen_kwargs or {},
        "workspace": workspace,
        "run": run_name,
    }
    results["date"] = started
    results["task_hashes"] = {}
    results.update(asdict(experiment_fields(args, started)))
    results.update(scored.get("tokenizer", {}))  # lm-eval's tokenizer fields, as the step saw them
    results.update(environment())
    return results


def experiment_fields(args: argparse.Namespace, started: float) -> Any:
    """lm-eval's ``GeneralConfigTracker`` of ``args.model``'s evaluation: the model's name (the
    results' folder) as ``lm_eval --model_args pretrained=...`` records it, the chat settings,
    the seconds since ``started``."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker

    chat = bool(args.apply_chat_template)
    tracker = GeneralConfigTracker()
    tracker.log_experiment_args(
        model_source="tango_fairscale",
        model_args={"pretrained": args.model},  # as lm_eval's command line: no split at ','s
        system_instruction=args.system_instruction,
        chat_template=chat_template(args.model) if chat else None,
        fewshot_as_multiturn=chat and args.fewshot_as_multiturn is not False,
    )
    tracker.total_evaluation_time_seconds = str(time.time() - started)
    return tracker


def environment() -> dict[str, Any]:
    """lm-eval's environment fields but ``pretty_env_info`` (``torch.utils.collect_env``: seconds
    of subprocesses): the lm-eval and transformers versions (from their metadata, nothing
    imported) and the git commit of the working directory's parent, as ``lm_eval`` finds it."""
    from importlib.metadata import version

    from lm_eval.loggers.utils import get_commit_from_path

    return {
        "transformers_version": version("transformers"),
        "lm_eval_version": version("lm_eval"),
        "upper_git_hash": get_commit_from_path(Path(os.getcwd(), "..")),
    }


def chat_template(model: str) -> str | None:
    """The chat template of ``model``'s tokenizer that prompts were written in (its default)."""
    from .model.loading import load_tokenizer

    template = getattr(load_tokenizer(model), "chat_template", None)
    if isinstance(template, dict):  # several named templates: lm-eval's HF backend takes this one
        template = template.get("default")
    return template if isinstance(template, str) else None


def header(args: argparse.Namespace) -> str:
    """The line lm_eval prints above its table."""
    return (
        f"tango_fairscale ({ {'pretrained': args.model} }), gen_kwargs: ({args.gen_kwargs or {}}), "
        f"limit: {_limit(args)}, num_fewshot: {args.num_fewshot}, "
        f"batch_size: {args.batch_size or DEFAULT_BATCH_SIZE}"
    )


def _limit(args: argparse.Namespace) -> float | None:
    """``--limit`` as lm-eval records it: a float, or ``None`` for every document."""
    return float(args.limit) if args.limit else None


def results_tables(results: dict[str, Any]) -> str:
    """lm-eval's tables of ``results``: tasks, then groups when there are any."""
    from lm_eval.utils import make_table

    tables = [make_table(results)]
    if results.get("groups"):
        tables.append(make_table(results, "groups"))
    return "\n".join(tables)


def new_date_id() -> str:
    """The date in the names of the files lm_eval writes (``EvaluationTracker``'s ``date_id``)."""
    return datetime.now().isoformat().replace(":", "-")


def write_results(results: dict[str, Any], output_path: str, date_id: str) -> Path:
    """Write ``results`` where lm-eval 0.4.13's ``EvaluationTracker.save_results_aggregated``
    writes them; returns the file."""
    from lm_eval.utils import handle_non_serializable

    target = results_file(output_path, str(results["model_name"]), date_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    dumped = json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False)
    target.write_text(dumped, encoding="utf-8")
    return target


def results_file(output_path: str, model_name: str, date_id: str) -> Path:
    """Where ``lm_eval --output_path OUTPUT_PATH`` writes its results (``EvaluationTracker``):
    ``<stem>_<date>.json`` beside a ``.json`` path, else
    ``OUTPUT_PATH/<model name sanitized>/results_<date>.json``."""
    from lm_eval.utils import sanitize_model_name

    path = Path(output_path)
    if path.suffix == ".json":
        return path.with_name(f"{path.stem}_{date_id}.json")
    return path / sanitize_model_name(model_name) / f"results_{date_id}.json"


def write_samples(
    workspace: str, run_name: str, tasks: list[str], output_path: str, model: str, date_id: str
) -> int:
    """Write the per-document samples of the run's ``scores_<task>`` steps as ``lm_eval
    --log_samples`` writes them, through lm-eval's own ``EvaluationTracker``: a
    ``samples_<task>_<date>.jsonl`` per scored task (each task of a group) beside the results
    file, each line with lm-eval's keys in its order. The steps keep no documents: each task is
    loaded again (as its step's ``task`` config says) for ``doc`` and lm-eval's ``doc_hash``,
    ``prompt_hash`` and ``target_hash``. Returns how many files it wrote."""
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.utils import sanitize_model_name
    from tango import Workspace

    steps = Workspace.from_url(workspace)
    configs = steps.registered_run(run_name).steps
    tracker = EvaluationTracker(output_path=output_path)
    tracker.general_config_tracker.model_name_sanitized = sanitize_model_name(model)
    tracker.date_id = date_id
    written = 0
    for task in tasks:
        step = f"scores_{task}"
        scores = steps.step_result_for_run(run_name, step)
        spec = _task_spec((configs[step].config or {})["task"], steps, run_name)
        documents = _documents(spec)
        for name, samples in sorted(scores.get("samples", {}).items()):
            task_object, by_id = documents[name]
            full = [_lm_eval_sample(s, task_object, by_id[s["doc_id"]]) for s in samples]
            tracker.save_results_samples(name, full)
            written += 1
    return written


def _task_spec(config: dict[str, Any], steps: Any, run_name: str) -> Any:
    """The :class:`~tango_fairscale.tasks.lm_eval.TaskSpec` of a step's ``task`` config; a
    ``dataset`` in it (``{type: "ref"}`` to a data step) is that step's result in the run."""
    from tango.common import Params

    from .tasks.lm_eval import TaskSpec

    fields = dict(config)
    extras = {}
    if isinstance(fields.get("dataset"), dict):
        extras["dataset"] = steps.step_result_for_run(run_name, fields.pop("dataset")["ref"])
    return TaskSpec.from_params(Params(fields), **extras)


def _documents(spec: Any) -> dict[str, tuple[Any, dict[int, Any]]]:
    """Each task of ``spec``: lm-eval's task object and its scored documents by ``doc_id``."""
    from lm_eval.evaluator_utils import get_sample_size

    from .tasks.lm_eval import load_tasks

    documents = {}
    for name, task in load_tasks(spec)["tasks"].items():
        limit = get_sample_size(task, spec.limit)
        documents[name] = (task, dict(task.doc_iterator(rank=0, limit=limit, world_size=1)))
    return documents


def _lm_eval_sample(sample: dict[str, Any], task: Any, doc: Any) -> dict[str, Any]:
    """A stored sample as lm-eval's evaluator logs it: its keys in its order, with ``doc`` and
    the hashes it adds (the first request's context as the prompt)."""
    from lm_eval.utils import hash_string

    from .evaluation.harness import SAMPLE_KEYS, metric_values
    from .tasks.requests import doc_hash

    logged = {key: sample[key] for key in SAMPLE_KEYS}
    return (
        {"doc_id": logged.pop("doc_id"), "doc": doc}
        | logged
        | {
            "doc_hash": doc_hash(doc),
            "prompt_hash": hash_string(sample["arguments"][0][0]),
            "target_hash": hash_string(str(task.doc_to_target(doc))),
        }
        | metric_values(sample)
    )
