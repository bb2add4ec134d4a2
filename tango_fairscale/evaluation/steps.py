"""The cached evaluation steps: a model evaluated on one task (lm-eval's requests, the package's
log-likelihoods and generated texts, lm-eval's results), and several tasks' results merged and
summarised."""

from __future__ import annotations

import dataclasses
from typing import Any

from tango import Step
from tango.common import Lazy
from tango.common.exceptions import ConfigurationError
from tango.common.logging import cli_logger
from tango.integrations.torch import Model

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import boolean, integer
from ..model.causal_lm import ModelWrapper, packing_refusal
from ..model.fingerprint import FingerprintedLazy
from ..parallel.precision import auto_precision_key, resolve_precision
from ..runtime.devices import start_cuda
from ..tasks.format import JsonDataFormat
from ..tasks.lm_eval import TaskSpec, load_tasks
from ..tasks.requests import documents_keyed, loaded_tasks, unique_id_with
from ..tasks.restoring import check_requests, use_requests
from ..tasks.tokens import checked_pairs, known_queries
from .call import EvalOptions, GenerationSettings, ModelCall
from .evaluator import Evaluator
from .harness import merge, summary, tokenizer_fields
from .lm import scoring_precision
from .scoring import default_device
from .shared_model import ModelSource, evaluation_model


@Step.register("tango_fairscale::task_scores")
class TaskScoresStep(Step[dict]):
    """Evaluate a model on one lm-eval task (or group) with the package's scorer.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::task_scores"``.

    lm-eval builds the task's requests (its prompts, few-shot examples, choices; once for every
    model when ``requests`` gives them) and computes its metrics (``process_results`` and
    aggregation, stderr included); the log-likelihoods come from
    :class:`~tango_fairscale.evaluation.lm.ScorerLM` on the GPU when there is one: length-sorted
    batches of at most ``batch_size`` queries and ``max_batch_tokens`` tokens, packed (a
    question's context once for all its choices) where the model takes packed batches
    (``pack_sequences: null``, the default), or as ``pack_sequences`` says (``true`` is refused
    for a model that does not take them; ``false`` pads). ``generate_until`` tasks are answered
    as lm-eval's HF backend answers them (its prompt encoding, ``gen_kwargs`` and stop
    sequences), by batched decoding with a key/value cache
    (:mod:`~tango_fairscale.evaluation.generation`). None of those three is part of the cache
    key: they change speed, not scores (up to float rounding).

    A model given as a config is loaded when the step runs, not when Tango builds the steps (a
    step found in the cache loads nothing), and once for all the steps of a command that score
    the same model on the same device in the same weight dtype
    (:mod:`~tango_fairscale.evaluation.shared_model`); the cache key is the same as if it had
    been loaded to build the step.

    :param model: the model (``tango_fairscale::causal_lm``, or a trained model's step).
    :param task: a :class:`~tango_fairscale.tasks.lm_eval.TaskSpec` (a name is enough).
    :param precision: ``32-true`` (lm-eval's HF backend in fp32, to 1e-4 per request),
        ``bf16-mixed`` / ``16-mixed`` (autocast: faster; bf16's summed log-likelihoods within
        about 2e-3 relative of fp32's on PIQA), ``bf16-true`` (the model cast to bf16) or
        ``auto`` (bf16-mixed on a bf16 GPU, else 32-true; keyed as such). The model scores from
        fp32 weights (whatever its checkpoint stores) except under ``bf16-true``.
    :param bootstrap_iters: lm-eval's bootstrap resamples for the stderr of metrics that are
        not means (0: no stderr).
    :param max_gen_toks: for ``generate_until`` tasks whose ``generation_kwargs`` set none, the
        most tokens generated (lm-eval's default, 256).
    :param generation_seed: seeds sampling, for tasks that sample (request ``i`` from
        ``generation_seed + i``). Generation batches hold at most ``batch_size`` prompts.
    :param requests: the task's requests, built once for every model by a
        ``tango_fairscale::task_requests`` step of the same ``task`` (refused in one line
        otherwise): lm-eval's evaluator takes them instead of building them
        (:func:`~tango_fairscale.tasks.restoring.use_requests`), so every request, score and
        metric is the one it would have built; ``null``: built here (chat-templated tasks).
        Not part of the cache key: they are a function of ``task``, which is.
    :param tokens: those requests tokenized once for every model of the tokenizer, by a
        ``tango_fairscale::task_tokens`` step (refused in one line when made with another
        tokenizer or from other requests); ``null``: tokenized here. Not part of the cache key:
        they are a function of the requests and of the model's tokenizer, which are.

    Returns lm-eval's results JSON for the task (``results`` with keys such as ``acc,none`` and
    ``acc_stderr,none``, ``groups``, ``n-samples``, ``n-shot``, ``versions``, ...) and its
    ``samples``: per document its requests (``arguments``), their answers (``resps``:
    ``(log-likelihood, greedy)``, or the generated text), the filtered answers and metric values;
    ``config``: the precision, the device and (``tokenizer``) lm-eval's tokenizer fields of the
    model that scored (:func:`~.harness.tokenizer_fields`); ``truncated_continuations``: how many
    continuations were longer than the model's window and scored on their last tokens only
    (lm-eval's HF backend refuses them; a warning says so), and, when ``strict: false`` left
    documents out, ``skipped_documents`` (``{task: count}``).

    Example (Jsonnet)::

        arc_easy: {type: "tango_fairscale::task_scores", model: {ref: "trained_model"},
                   task: {name: "arc_easy", num_fewshot: 2}}
    """

    VERSION = "004"  # 002: float64 sums; 003: lm-eval's task configs; 004: tokenizer fields
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = JsonDataFormat()
    SKIP_ID_ARGUMENTS = {"batch_size", "max_batch_tokens", "pack_sequences", "requests", "tokens"}

    @classmethod
    def massage_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """A model given as a config (a ``Lazy``) becomes a
        :class:`~tango_fairscale.evaluation.shared_model.ModelSource`: loaded when needed; one
        whose config holds a step's result stays a ``Lazy``, keyed by its files' fingerprints
        as well (:class:`~tango_fairscale.model.fingerprint.FingerprintedLazy`)."""
        model = kwargs.get("model")
        if isinstance(model, Lazy) and not isinstance(model, FingerprintedLazy):
            source = ModelSource.of(model)
            kwargs = {**kwargs, "model": FingerprintedLazy.of(model) if source is None else source}
        return kwargs

    @property
    def unique_id(self) -> str:
        """Tango's unique id, with a :class:`ModelSource` hashed as the model it loads and
        precision ``auto`` as what it means here
        (:func:`~tango_fairscale.parallel.precision.auto_precision_key`)."""
        model = self.kwargs.get("model")
        auto = self.kwargs.get("precision") == "auto"
        if not isinstance(model, ModelSource) and not auto:
            return super().unique_id

        def stand_ins() -> dict[str, Any]:
            hashed: dict[str, Any] = {"precision": auto_precision_key()} if auto else {}
            if isinstance(model, ModelSource):
                hashed["model"] = model.hash_stand_in()
            return hashed

        return unique_id_with(self, stand_ins)

    def run(  # type: ignore[override]
        self,
        model: Lazy[Model],  # see massage_kwargs: run() gets a ModelSource or a step's model
        task: TaskSpec,
        precision: str = "32-true",
        batch_size: int = EvalOptions.batch_size,
        max_batch_tokens: int | None = EvalOptions.max_batch_tokens,
        pack_sequences: bool | None = None,
        bootstrap_iters: int = 100000,
        max_gen_toks: int = GenerationSettings.max_gen_toks,
        generation_seed: int = GenerationSettings.seed,
        requests: dict | None = None,
        tokens: dict | None = None,
    ) -> dict:
        options = EvalOptions(batch_size, max_batch_tokens)
        generation = GenerationSettings(max_gen_toks, generation_seed)
        if pack_sequences is not None:
            boolean("pack_sequences", pack_sequences)
        integer("bootstrap_iters", bootstrap_iters)
        # A ModelSource (massage_kwargs), a step's model, or a Lazy of another model type.
        given: Any = model.construct() if isinstance(model, Lazy) else model
        if not isinstance(given, (ModelWrapper, ModelSource)):
            raise ConfigurationError(
                f"needs a tango_fairscale::causal_lm model, got {type(given).__name__}"
            )
        device = default_device()
        start_cuda(device)  # while the tasks and the model's code load
        resolved = resolve_precision(precision, device)
        # Checked before the model is loaded or scores anything (loaded by the requests step
        # when it ran in this process).
        loaded = load_tasks(task) if requests is None else loaded_tasks(task, requests)
        if requests is not None:  # built once by a task_requests step: lm-eval takes them
            check_requests(task, requests, loaded)  # local data: its fingerprint too
            use_requests(loaded, requests, documents_keyed=documents_keyed(task))
        if tokens is not None:
            if requests is None:
                raise ConfigurationError("tokens need their requests: give task_scores both")
            fields = given.origin[2]  # model_origin's arguments
            pairs = checked_pairs(tokens, requests, fields["tokenizer"] or fields["model"])
        # fp32 weights whatever the model holds (bf16 ones under bf16-true), on the device
        scorer = evaluation_model(given, device, resolved.param_dtype)
        if pack_sequences is None:
            pack_sequences = scorer.supports_packing
        elif pack_sequences and not scorer.supports_packing:
            raise ConfigurationError(packing_refusal(scorer))
        evaluator = Evaluator(
            ModelCall.local(scorer, device),
            dataclasses.replace(options, packed=pack_sequences),
            generation,
        )
        evaluator.check(task, loaded)
        if tokens is not None:
            evaluator.lm.take_queries(known_queries(tokens, pairs, scorer.max_length))
        with scoring_precision(scorer, resolved):
            scores = evaluator.evaluate(task, loaded, bootstrap_iters)
        del loaded  # gone on return even if a library's garbage (a traceback) holds this frame
        config = {"precision": resolved.name, "device": device.type}
        scores["config"] = config | {"tokenizer": tokenizer_fields(scorer)}
        scores["truncated_continuations"] = evaluator.lm.truncated_continuations
        return scores


@Step.register("tango_fairscale::task_metrics")
class TaskMetricsStep(Step[dict]):
    """lm-eval's results of several scored tasks, merged, and a flat summary of them.

    Registered as a Tango ``Step`` under the name ``"tango_fairscale::task_metrics"``.

    :param scores: results of ``tango_fairscale::task_scores`` steps.

    Returns the flat summary (``"<task>/<metric>"``, e.g. ``"arc_easy/acc"``,
    ``"arc_easy/acc_stderr"``, ``"arc_easy/num_examples"``; for a single task also ``acc``,
    ``acc_norm``, ``num_examples``, ...) and, under ``"lm_eval"``, lm-eval's results JSON of all
    of them (``results``, ``groups``, ``n-samples``, ...).

    Example (Jsonnet)::

        metrics: {type: "tango_fairscale::task_metrics", scores: [{ref: "piqa_scores"}]}
    """

    VERSION = "001"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = JsonDataFormat()

    def run(self, scores: list[dict]) -> dict:  # type: ignore[override]
        if not isinstance(scores, list) or not scores:
            raise ConfigurationError("scores must be a non-empty list of task_scores results")
        merged = merge(scores)
        configs = [score["config"] for score in scores if "config" in score]
        if configs:
            merged["config"] = configs[0]
        for line in describe(merged):  # the run's final numbers, on the console
            cli_logger.info(line)
        return {**summary(merged), "lm_eval": merged}


def describe(results: dict) -> list[str]:
    """One line per task of lm-eval ``results``:
    ``task: metric value ± stderr, ... (N examples)``."""
    lines = []
    for task, metrics in results.get("results", {}).items():
        shown = []
        for key, value in metrics.items():
            metric, _, filter_name = key.partition(",")
            if not filter_name or "_stderr" in metric or not isinstance(value, (int, float)):
                continue
            stderr = metrics.get(f"{metric}_stderr,{filter_name}")
            spread = f" ± {stderr:.4f}" if isinstance(stderr, (int, float)) else ""
            label = metric if filter_name == "none" else f"{metric} ({filter_name})"
            shown.append(f"{label} {value:.4f}{spread}")
        count = results.get("n-samples", {}).get(task, {}).get("effective")
        suffix = f" ({count} examples)" if count is not None else ""
        lines.append(f"{task}: {', '.join(shown)}{suffix}")
    return lines
