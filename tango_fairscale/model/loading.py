"""Loading a Hugging Face causal LM, its config and its tokenizer from the hub, a directory or a
config, with fp32 master weights whatever the checkpoint stores, its context length as lm-eval
reads it, and one-line errors for what cannot be loaded or does not make a usable model (a
tokenizer without its files, an end-of-text id outside it)."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
from tango.common.exceptions import ConfigurationError

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..checks import one_line
from .fingerprint import hub_revision, is_hub_id, unreachable

# transformers is imported where a model, config or tokenizer is loaded: its model code costs
# ~1 s to import, which a ``tango run`` that loads nothing (every step cached) does not pay.
if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: The transformers modules that loading a model and its tokenizer imports (what the top-level
#: imports of this package's model modules once pulled in): a fork server imports them once for
#: its workers (:func:`~tango_fairscale.train.launch.component_modules`).
MODEL_CODE = (
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
)

#: Encoded by :func:`check_tokenizer`: a tokenizer that cannot encode it is not a real one.
PROBE_TEXT = "Question: How do I open a jar?\nAnswer: Twist the lid."

#: A tokenizer's ``model_max_length`` when it sets none (transformers' ``VERY_LARGE_INTEGER``).
UNBOUNDED_TOKENIZER_LENGTH = int(1e30)

#: huggingface_hub 1.16's message when it retries a request on the client it closed after a
#: connection error (the hub unreachable without ``HF_HUB_OFFLINE``).
_CLOSED_CLIENT = "client has been closed"

#: Set inside :func:`weights_loaded_over`.
_WEIGHTS_LOADED_OVER: ContextVar[bool] = ContextVar("weights_loaded_over", default=False)


@contextmanager
def weights_loaded_over() -> Iterator[None]:
    """Models built from a config inside skip their random initialisation: the caller loads a
    full state over them at once, strictly (a trained model rebuilt from its weights). At 124M
    that initialisation is ~1.5 s of the 2-core CPU; at 1.5B, over ten times that."""
    token = _WEIGHTS_LOADED_OVER.set(True)
    try:
        yield
    finally:
        _WEIGHTS_LOADED_OVER.reset(token)


def fuse_tanh_gelu(model: torch.nn.Module) -> None:
    """Compute GPT-2's ``gelu_new`` with torch's fused kernel (the same tanh formula).

    Hugging Face's ``NewGELUActivation`` evaluates it as five elementwise kernels (measured: a
    third of the GPU time of PIQA scoring); ``nn.GELU(approximate="tanh")`` is one, and agrees to
    within float rounding (4.8e-7 in fp32). The saved config still says ``gelu_new``.
    """
    from transformers.activations import NewGELUActivation

    for name, module in list(model.named_modules()):
        if isinstance(module, NewGELUActivation):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, torch.nn.GELU(approximate="tanh"))


def build_model(model: str | None, config: dict[str, Any] | None, seed: int) -> PreTrainedModel:
    """The model of ``model`` (hub id or directory) or of ``config`` (random weights, seeded),
    in fp32 whatever the checkpoint stores: transformers 5 keeps a checkpoint's dtype by default,
    so a bf16 checkpoint would train and score in bf16 under any precision (bf16 values upcast
    exactly; an engine casts to bf16 for ``bf16-true``)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if config is None:
        assert model is not None
        try:
            return AutoModelForCausalLM.from_pretrained(
                model, dtype=torch.float32, **hub_options(model)
            )
        except (OSError, ValueError) as error:
            raise ConfigurationError(_cannot_load("model", model, error)) from None
        except RuntimeError as error:
            raise _unreachable_or(error, model) from None
    config = dict(config)
    if model is not None:
        hf_config = load_config(model, **config)
    else:
        model_type = config.pop("model_type", None)
        if model_type is None:
            raise ConfigurationError("'config' needs 'model_type' (e.g. \"gpt2\") without 'model'")
        if model_type not in CONFIG_MAPPING:
            close = difflib.get_close_matches(str(model_type), list(CONFIG_MAPPING.keys()), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigurationError(f"unknown config.model_type {model_type!r}{hint}")
        hf_config = AutoConfig.for_model(model_type, **config)
    torch.manual_seed(seed)
    try:
        if _WEIGHTS_LOADED_OVER.get():
            return _uninitialised(hf_config)
        return AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    except (ValueError, TypeError) as error:  # e.g. n_embd not divisible by n_head
        reason = one_line(error, 300)
        raise ConfigurationError(f"cannot build a model from 'config': {reason}") from None


def _uninitialised(hf_config: Any) -> PreTrainedModel:
    """The model of ``hf_config`` with its parameters and persistent buffers left as allocated,
    its tied weights tied. Its non-persistent buffers (rotary frequencies, embedding scales,
    attention masks), which a strict load leaves alone, are computed by the modules' own
    constructors in every verified family (``tests/model/test_loading.py``)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    with no_init_weights():  # skips transformers' init_weights, which also ties the weights
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    model.tie_weights()
    return model


def hub_options(source: str) -> dict[str, Any]:
    """``from_pretrained``'s options: ``trust_remote_code=False`` (a directory's or the hub's
    Python files never run, and transformers never asks at a terminal whether they may), and
    ``local_files_only`` for a hub id the hub does not answer for but the local cache holds
    (:func:`~.fingerprint.hub_revision`; one line when neither does): huggingface_hub 1.16 would
    otherwise retry on a closed client and raise a ``RuntimeError`` instead of using the cache."""
    if not is_hub_id(source) or hub_revision(source).online:
        return {"trust_remote_code": False}
    return {"trust_remote_code": False, "local_files_only": True}


def _unreachable_or(error: RuntimeError, source: str) -> Exception:
    """The one-line error for huggingface_hub's closed-client ``RuntimeError``, else ``error``."""
    if _CLOSED_CLIENT in str(error):
        return ConfigurationError(unreachable(source))
    return error


def context_length(config: Any, tokenizer: Any) -> int:
    """The longest input of a model, as lm-eval's HF backend reads it: the (text) config's
    ``n_positions``, ``max_position_embeddings`` or ``n_ctx``, else the tokenizer's
    ``model_max_length`` unless unbounded, else 2048."""
    config = getattr(config, "text_config", None) or config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    limit = tokenizer.model_max_length
    return limit if limit < UNBOUNDED_TOKENIZER_LENGTH else 2048


def load_config(source: str, **overrides: Any) -> Any:
    """The Hugging Face config of the model at ``source`` (hub id or directory), with
    ``overrides``."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, **hub_options(source), **overrides)
    except (OSError, ValueError) as error:
        raise ConfigurationError(_cannot_load("model config", source, error)) from None
    except RuntimeError as error:
        raise _unreachable_or(error, source) from None


def load_tokenizer(source: str) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source, **hub_options(source))
    except (OSError, ValueError, TypeError) as error:
        raise ConfigurationError(_cannot_load("tokenizer", source, error)) from None
    except RuntimeError as error:
        raise _unreachable_or(error, source) from None


def check_tokenizer(tokenizer: Any, source: str, config: Any) -> None:
    """Refuse the near-empty tokenizer transformers 5 builds, without an error, from a directory
    that lacks tokenizer files (GPT-2's: no tokens, text encodes to nothing; Gemma's: 5 special
    tokens, text encodes to ``<unk>``): text must encode to known tokens, and the tokenizer must
    have at least half the model's vocabulary (models pad theirs)."""
    ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
    unknown = getattr(tokenizer, "unk_token_id", None)
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    too_small = isinstance(vocab_size, int) and len(tokenizer) < vocab_size // 2
    if not ids or all(i == unknown for i in ids) or too_small:
        raise ConfigurationError(
            f"the tokenizer loaded from {source!r} has {len(tokenizer)} tokens for a model with a "
            f"vocabulary of {vocab_size} and does not encode text: are its files missing "
            "(tokenizer.json, or vocab.json + merges.txt)? Add them, or set 'tokenizer' to a "
            "directory that has them"
        )


def set_padding_token(tokenizer: Any, config: Any) -> None:
    """GPT-2 style: pad with end-of-text (padding is masked out, so any real token serves).

    Tokenizer files without ``tokenizer_config.json`` name no special tokens: take the model
    config's ``eos_token_id`` then.
    """
    if tokenizer.pad_token_id is not None:
        return
    if tokenizer.eos_token_id is None:
        eos_id = getattr(config, "eos_token_id", None)
        if not isinstance(eos_id, int):
            raise ConfigurationError(
                "the tokenizer has no pad or end-of-text token and the model config no "
                "eos_token_id; add one of them to the model directory"
            )
        if not 0 <= eos_id < len(tokenizer):
            raise ConfigurationError(
                f"the model config's eos_token_id {eos_id} is outside the tokenizer's "
                f"{len(tokenizer)} tokens; fix eos_token_id in config.json, or name the "
                "tokenizer's end-of-text token in tokenizer_config.json"
            )
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos_id)
    tokenizer.pad_token = tokenizer.eos_token


def _cannot_load(what: str, source: str, error: Exception) -> str:
    if os.path.isdir(source):
        where = f"local directory {source!r}"
    elif source.startswith((".", "/", "~")) or os.sep in source.strip("/").split("/", 1)[-1]:
        where = f"path {source!r} (no such directory)"
    else:
        where = f"{source!r} (neither a local directory nor reachable on the Hugging Face hub)"
    reason = one_line(error, 300)
    return f"cannot load {what} from {where}: {reason}"
