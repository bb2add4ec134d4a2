"""What a ``generate_until`` task asks of the model: its ``gen_kwargs`` read as lm-eval's HF
backend reads them (:class:`Decoding`), and the tasks the package refuses to generate for, each
refused in one line before any work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tango.common.exceptions import ConfigurationError

from ..checks import did_you_mean

#: lm-eval's default ``max_gen_toks`` (``HFLM.max_gen_toks``) for a task that sets none.
DEFAULT_MAX_GEN_TOKS = 256

#: The ``gen_kwargs`` keys the package decodes with (lm-eval's aliases of ``max_gen_toks``
#: included); any other key is refused.
KNOWN_KEYS = (
    "until",
    "max_gen_toks",
    "max_new_tokens",
    "max_tokens",
    "max_completion_tokens",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "num_beams",
)

#: Sampling settings a model's generation config supplies when a sampling task leaves them out
#: (as ``generate`` merges them).
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")


@dataclass(frozen=True)
class Decoding:
    """How the requests of one ``gen_kwargs`` are decoded: greedy unless ``do_sample``; stop
    after ``max_gen_toks`` tokens, an end-of-sequence token or one of ``until`` (lm-eval's stop
    sequences; the caller adds the EOS text, as lm-eval's ``handle_stop_sequences`` does)."""

    until: tuple[str, ...]
    max_gen_toks: int
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None


def decoding_of(task: str, gen_kwargs: Any, default_max_gen_toks: int) -> Decoding:
    """A request's ``gen_kwargs`` normalised as lm-eval's ``normalize_gen_kwargs`` does
    (``max_gen_toks`` and its aliases by priority, greedy when ``do_sample`` is false or the
    temperature 0); one-line ``ConfigurationError`` s for an unknown key, ``num_beams`` other
    than 1 and sampling at temperature 0."""
    from lm_eval.models.utils import normalize_gen_kwargs

    if not isinstance(gen_kwargs, dict):
        raise ConfigurationError(f"task {task!r}: gen_kwargs must be a mapping, got {gen_kwargs!r}")
    for key in gen_kwargs:
        if key not in KNOWN_KEYS:
            raise ConfigurationError(
                f"task {task!r}: unknown gen_kwargs key {key!r}{did_you_mean(key, KNOWN_KEYS)}; "
                f"the package decodes with {', '.join(KNOWN_KEYS)}"
            )
    if gen_kwargs.get("num_beams", 1) != 1:
        raise ConfigurationError(
            f"task {task!r}: num_beams {gen_kwargs['num_beams']!r}: the package decodes greedily "
            "or samples (no beam search); set num_beams to 1"
        )
    until = gen_kwargs.get("until")
    if until is not None and not isinstance(until, (str, list)):
        raise ConfigurationError(f"task {task!r}: until must be a text or a list, got {until!r}")
    kwargs = normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks)
    do_sample = bool(kwargs.get("do_sample"))
    temperature = kwargs.get("temperature")
    if do_sample and not (temperature is not None and float(temperature) > 0):
        raise ConfigurationError(
            f"task {task!r}: do_sample with temperature {temperature!r}; sampling needs a "
            "temperature above 0 (or set do_sample to false for greedy decoding)"
        )
    return Decoding(
        until=tuple(str(text) for text in kwargs["until"]),
        max_gen_toks=int(kwargs["max_gen_toks"]),
        do_sample=do_sample,
        temperature=None if temperature is None else float(temperature),
        top_k=kwargs.get("top_k"),
        top_p=kwargs.get("top_p"),
        min_p=kwargs.get("min_p"),
    )


def check_window(task: str, decoding: Decoding, max_length: int) -> None:
    """Refuse a ``max_gen_toks`` that leaves no room for a prompt in the model's window
    (lm-eval's HF backend asserts the same)."""
    if decoding.max_gen_toks >= max_length:
        raise ConfigurationError(
            f"task {task!r}: max_gen_toks {decoding.max_gen_toks} is not below the model's "
            f"window of {max_length} tokens; lower max_gen_toks (the task's generation_kwargs, "
            "or the step's max_gen_toks for tasks that set none)"
        )


def refuse_code_execution(name: str, yaml_path: Any) -> None:
    """Refuse a task YAML (its includes followed) that sets ``unsafe_code``, read without
    importing its ``!function`` modules (humaneval's import a code-execution metric)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        config = load_yaml(yaml_path, resolve_func=False)
    except Exception:  # noqa: BLE001 - a YAML that does not load is refused by its loader
        return
    check_generation_task(name, None, {"output_type": None, **config})


def check_generation_task(name: str, task: Any, config: dict[str, Any] | None = None) -> None:
    """Refuse, before any work, a task that needs code execution (lm-eval's ``unsafe_code``) and
    a ``generate_until`` task whose ``generation_kwargs`` hold a key the package does not
    decode with. ``task``: a loaded lm-eval task, or ``None`` with its ``config`` (a dict)."""
    if task is not None:
        unsafe = bool(getattr(task, "UNSAFE_CODE", False))
        output_type = getattr(task, "OUTPUT_TYPE", None)
        gen_kwargs = getattr(getattr(task, "config", None), "generation_kwargs", None)
    else:
        config = config or {}
        unsafe = bool(config.get("unsafe_code"))
        output_type = config.get("output_type", "generate_until")
        gen_kwargs = config.get("generation_kwargs")
    if unsafe:
        raise ConfigurationError(
            f"task {name!r} runs the generated code (unsafe_code) to score it, which the "
            "package does not do; choose another task"
        )
    if output_type == "generate_until" and gen_kwargs is not None:
        decoding_of(name, gen_kwargs, DEFAULT_MAX_GEN_TOKS)
