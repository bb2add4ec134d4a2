"""The package's one evaluator: lm-eval's evaluator over task specs with the package's ``LM``,
built in one place over one model call and one options object, for the cached steps and for
validation during training."""

from __future__ import annotations

from typing import Any

from tango.common.exceptions import ConfigurationError

from ..data.chat import check_chat_template
from ..model.decoding import check_generation_config
from ..tasks.generation import check_window, decoding_of
from ..tasks.lm_eval import TaskDict, TaskSpec, load_tasks
from .call import EvalOptions, GenerationSettings, ModelCall
from .harness import evaluate_task
from .lm import ScorerLM


class Evaluator:
    """Evaluates task specs with one :class:`~.call.ModelCall`, :class:`~.call.EvalOptions`
    and :class:`~.call.GenerationSettings`: lm-eval builds the requests and computes the
    metrics, :class:`~.lm.ScorerLM` answers them (log-likelihoods, generated text). With an
    engine's call, use it on every rank.

    Example::

        evaluator = Evaluator(ModelCall.of_engine(engine), EvalOptions(batch_size=32))
        results = evaluator.evaluate(TaskSpec(name="gsm8k", limit=100))
    """

    def __init__(
        self,
        call: ModelCall,
        options: EvalOptions | None = None,
        generation: GenerationSettings | None = None,
    ) -> None:
        self.call = call
        self.options = options or EvalOptions()
        self.generation = generation or GenerationSettings()
        self.lm = ScorerLM(call, self.options, self.generation)

    def check(self, spec: TaskSpec, loaded: TaskDict) -> None:
        """Refuse in one line, before any work, what this model call cannot run: a chat template
        the tokenizer lacks; for generation tasks an engine that does not generate (pipe), a
        model whose generation config changes greedy decoding, a ``max_gen_toks`` that leaves no
        room for a prompt in the model's window. (Unknown ``gen_kwargs`` keys and code execution
        are refused when tasks load.)"""
        model = self.call.model
        if spec.apply_chat_template:
            check_chat_template(model.tokenizer, spec.label)
        for name, task in loaded["tasks"].items():
            if getattr(task, "OUTPUT_TYPE", None) != "generate_until":
                continue
            if self.call.generation_refusal is not None:
                raise ConfigurationError(f"task {name!r}: {self.call.generation_refusal}")
            check_generation_config(model.model, type(model.model).__name__)
            gen_kwargs = getattr(getattr(task, "config", None), "generation_kwargs", None)
            if isinstance(gen_kwargs, dict):
                decoding = decoding_of(name, gen_kwargs, self.generation.max_gen_toks)
                check_window(name, decoding, model.max_length)

    def evaluate(
        self,
        spec: TaskSpec,
        loaded: TaskDict | None = None,
        bootstrap_iters: int = 100000,
        samples: bool = True,
    ) -> dict[str, Any]:
        """lm-eval's results JSON of ``spec`` and, with ``samples``, its samples
        (:func:`~.harness.evaluate_task`); ``loaded``: its tasks, already loaded."""
        loaded = load_tasks(spec) if loaded is None else loaded
        self.check(spec, loaded)
        return evaluate_task(self.lm, spec, loaded, bootstrap_iters, samples)
