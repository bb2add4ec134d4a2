"""Offline consolidation: a saved checkpoint's files → the full model's state, in one process with
no process group (for ``tango-fairscale export`` and for Tango's ``torch::train``, which asks rank 0
alone for the final weights after the other ranks have gone).

The checkpoint's manifest names its format (:mod:`.checkpoint_format`), which verifies every file
against the manifest and rebuilds the full state from its own layout; ``hf/`` holds the model's
Hugging Face config and tokenizer, so that the directory alone rebuilds the model. The full state
has :class:`~tango_fairscale.model.causal_lm.ModelWrapper`'s keys (``model.transformer.wte.weight``,
...), checked against the model that ``hf/config.json`` describes: every key, no other, same
shapes.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)
from ..checks import reason
from ..model.causal_lm import ModelWrapper
from ..model.loading import weights_loaded_over
from ..records.checkpoints import (
    HF_FILES,
    CheckpointError,
    checkpoint_dir,
    read_manifest,
)
from .checkpoint_format import CheckpointFormat
from .distributed_checkpoint import DistributedCheckpoint
from .rank_files import RankFiles

# transformers' model code costs ~1 s to import: imported where a model is built, not by every
# ``tango run`` (Tango imports each submodule of the package).
if TYPE_CHECKING:
    from transformers import PreTrainedModel

#: Every format, by the name a manifest records.
FORMATS: dict[str, type[CheckpointFormat]] = {
    format.name: format for format in (RankFiles, DistributedCheckpoint)
}


def full_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """The full model state of complete checkpoint ``directory``, every file verified against its
    manifest, checked against the model its ``hf`` files describe. Raises
    :class:`CheckpointError` (one line; ``DamagedCheckpoint`` for a file that does not match
    the manifest)."""
    directory = checkpoint_dir(Path(directory))
    manifest = read_manifest(directory)
    if manifest.format not in FORMATS:
        raise CheckpointError(
            f"{directory} is in the {manifest.format!r} format, which this tango_fairscale "
            f"does not know (it reads {', '.join(FORMATS)})"
        )
    checkpoint_format = FORMATS[manifest.format]()
    checkpoint_format.verify(directory, manifest)
    try:
        state = checkpoint_format.full_state(directory, manifest)
    except CheckpointError:
        raise
    except Exception as error:  # readable digests, unreadable content (a forged manifest)
        raise CheckpointError(f"cannot read {directory} ({reason(error)})") from None
    return _matched_to_model(state, directory)


def hf_model(checkpoint_dir: Path, state: dict[str, torch.Tensor]) -> PreTrainedModel:
    """The Hugging Face model holding ``state`` (from :func:`full_state_dict`): built on the meta
    device, given ``state``'s tensors (no copy), tied weights tied again."""
    model = _meta_model(checkpoint_dir)
    hf_state = {key.removeprefix("model."): value for key, value in state.items()}
    model.load_state_dict(hf_state, strict=True, assign=True)
    model.tie_weights()
    return model


def hf_tokenizer(checkpoint_dir: Path) -> Any:
    """The tokenizer of ``checkpoint_dir``'s ``hf/`` files, as transformers loads it (no code
    from them run)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_dir / HF_FILES, trust_remote_code=False)


def plain_model(checkpoint_dir: Path, state: dict[str, torch.Tensor]) -> ModelWrapper:
    """A :class:`ModelWrapper` of the checkpoint's model (its ``hf`` files) holding ``state``."""
    with weights_loaded_over():  # config only: no weights read, none initialised
        model = ModelWrapper(str(checkpoint_dir / HF_FILES), config={})
    model.load_state_dict(state)  # strict
    return model


def _meta_model(checkpoint_dir: Path) -> PreTrainedModel:
    """The model of the checkpoint's config, its parameters on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    files = checkpoint_dir / HF_FILES
    if not (files / "config.json").is_file():
        raise CheckpointError(
            f"{checkpoint_dir} carries no model config ({HF_FILES}/config.json): it is not a "
            "checkpoint of tango_fairscale's"
        )
    try:
        config = AutoConfig.from_pretrained(files, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"cannot read {files / 'config.json'} ({reason(error)})") from None
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _matched_to_model(
    state: dict[str, torch.Tensor], checkpoint_dir: Path
) -> dict[str, torch.Tensor]:
    """``state`` with every name of a tied parameter it holds once (FairScale without flattening
    keeps no record of ties), checked against the model of the checkpoint's config."""
    model = _meta_model(checkpoint_dir)
    tied: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(parameter), []).append(f"model.{name}")
    for names in tied.values():
        held = [state[name] for name in names if name in state]
        if held:
            for name in names:
                state.setdefault(name, held[0])
    expected = {f"model.{key}": value.shape for key, value in model.state_dict().items()}
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    wrong = sorted(k for k in expected.keys() & state.keys() if state[k].shape != expected[k])
    problems = [
        f"{what} {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
        for what, keys in (
            ("lacks", missing),
            ("has unexpected", unexpected),
            ("has other shapes for", wrong),
        )
        if keys
    ]
    if problems:
        raise CheckpointError(
            f"{checkpoint_dir} does not match its model config ({HF_FILES}/config.json): it "
            f"{'; '.join(problems)}"
        )
    return state
