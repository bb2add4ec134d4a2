"""Offline consolidation: a saved checkpoint's files → the full model's state, in one process with
no process group (for ``tango-fairscale export`` and for Tango's ``torch::train``, which asks rank 0
alone for the final weights after the other ranks have gone).

A checkpoint directory, as the engines write it:

* ``rank{r}.pt`` — ``{"model": ..., "optimizer": ..., ...}``. From ``ddp`` and ``pipe``: rank 0's
  file only, its ``model`` the full state. From ``fairscale``: every rank's ``local_state_dict()``
  shards, with FairScale's own ``local_metadata_dict()`` (which parameters each flat shard holds,
  their shapes and the padding) as ``model_metadata`` and the number of ranks as ``world_size``.
* ``.metadata`` + ``*.distcp`` — from ``fsdp2``: a ``torch.distributed.checkpoint`` directory
  whose ``model`` entry holds the full tensors (read here without a process group).
* ``hf/`` — the model's Hugging Face config and tokenizer (rank 0), so that the directory alone
  rebuilds the model.

The full state has :class:`~tango_fairscale.model.causal_lm.ModelWrapper`'s keys
(``model.transformer.wte.weight``, ...), checked against the model that ``hf/config.json``
describes: every key, no other, same shapes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from ..checks import reason
from ..model.causal_lm import ModelWrapper
from .safe_load import SafeReader, load_dcp, load_torch_file

#: The checkpoint's subdirectory holding the model's config and tokenizer.
HF_FILES = "hf"
#: Prefix of a checkpoint our training loop is still writing (``train/checkpoints.py``).
PARTIAL_PREFIX = ".partial-"
#: A ``torch.distributed.checkpoint`` directory's index, written last.
DCP_METADATA = ".metadata"
RANK_FILE = re.compile(r"rank(\d+)\.pt")
#: Where a directory may be told to look for its checkpoint: ours, then torch::train's.
LATEST = ("checkpoints/latest", "latest")
TORCH_TRAIN_LATEST = "checkpoint_state_latest"
WHERE = "give a checkpoint (.../checkpoints/stepN), its checkpoints/ directory or the work dir"


class CheckpointError(ValueError):
    """A directory that is not a complete, readable checkpoint (the message is one line)."""


def save_model_files(model: ModelWrapper, checkpoint_dir: Path) -> None:
    """Write ``model``'s Hugging Face config and tokenizer (no weights) into ``checkpoint_dir/hf``.
    Call on one rank."""
    target = checkpoint_dir / HF_FILES
    model.model.config.save_pretrained(target)
    model.tokenizer.save_pretrained(target)


def find_checkpoint(path: Path) -> Path:
    """The complete checkpoint directory that ``path`` names: ``path`` itself, the one its
    ``latest`` file names (``path`` a ``checkpoints/`` directory or a work dir holding one), or
    torch::train's ``checkpoint_state_latest`` in a work dir."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory; {WHERE}")
    for name in LATEST:
        latest = path / name
        if latest.is_file():
            return _complete(latest.parent / latest.read_text().strip())
    if (path / TORCH_TRAIN_LATEST).exists():
        return _complete((path / TORCH_TRAIN_LATEST).resolve())
    if (path / "checkpoints").is_dir():
        raise CheckpointError(
            f"{path / 'checkpoints'} holds no complete checkpoint yet (no 'latest'); export it "
            "once the run has written one"
        )
    return _complete(path)


def _complete(directory: Path) -> Path:
    if directory.name.startswith(PARTIAL_PREFIX):
        raise CheckpointError(
            f"{directory} is a partial checkpoint (its run stopped while writing it); export "
            f"the complete one that {directory.parent / 'latest'} names"
        )
    if not directory.is_dir():
        raise CheckpointError(f"{directory} does not exist; {WHERE}")
    if (directory / DCP_METADATA).is_file() or _rank_files(directory):
        return directory
    if any(directory.glob("*.distcp")):
        raise CheckpointError(
            f"{directory} is a partial distributed checkpoint (no {DCP_METADATA}: its run "
            "stopped while writing it); export an earlier, complete one"
        )
    raise CheckpointError(
        f"{directory} holds no checkpoint (no rank*.pt, no {DCP_METADATA}); {WHERE}"
    )


def full_state_dict(checkpoint_dir: Path) -> dict[str, torch.Tensor]:
    """The full model state of a complete checkpoint directory (see the module docstring),
    checked against the model its ``hf`` files describe."""
    checkpoint_dir = _complete(Path(checkpoint_dir))
    if (checkpoint_dir / DCP_METADATA).is_file():
        state = _dcp_model_state(checkpoint_dir)
    else:
        state = _rank_files_model_state(checkpoint_dir)
    return _matched_to_model(state, checkpoint_dir)


def hf_model(checkpoint_dir: Path, state: dict[str, torch.Tensor]) -> PreTrainedModel:
    """The Hugging Face model holding ``state`` (from :func:`full_state_dict`): built on the meta
    device, given ``state``'s tensors (no copy), tied weights tied again."""
    model = _meta_model(checkpoint_dir)
    hf_state = {key.removeprefix("model."): value for key, value in state.items()}
    model.load_state_dict(hf_state, strict=True, assign=True)
    model.tie_weights()
    return model


def plain_model(checkpoint_dir: Path, state: dict[str, torch.Tensor]) -> ModelWrapper:
    """A :class:`ModelWrapper` of the checkpoint's model (its ``hf`` files) holding ``state``."""
    model = ModelWrapper(str(checkpoint_dir / HF_FILES), config={})  # config only: no weights
    model.load_state_dict(state)  # strict
    return model


def _meta_model(checkpoint_dir: Path) -> PreTrainedModel:
    """The model of the checkpoint's config, its parameters on the meta device (no memory)."""
    files = checkpoint_dir / HF_FILES
    if not (files / "config.json").is_file():
        raise CheckpointError(
            f"{checkpoint_dir} carries no model config ({HF_FILES}/config.json): it was written by "
            "an older tango_fairscale; resume its run once with this version to write one that has"
        )
    try:
        config = AutoConfig.from_pretrained(files)
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


# --- rank files: ddp / pipe (rank 0's full state) and fairscale (every rank's shards) ----------


def _rank_files(directory: Path) -> dict[int, Path]:
    found = (RANK_FILE.fullmatch(path.name) for path in directory.iterdir())
    return {int(match.group(1)): directory / match.group(0) for match in found if match}


def _load(path: Path) -> dict[str, Any]:
    try:
        state = load_torch_file(path, mmap=True)
    except Exception as error:  # truncated, not a torch file, pickled code, unreadable
        raise CheckpointError(f"cannot read {path} ({reason(error)})") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointError(f"{path} is not a tango_fairscale rank file (no 'model' state)")
    return state


def _rank_files_model_state(directory: Path) -> dict[str, torch.Tensor]:
    files = _rank_files(directory)
    if 0 not in files:
        raise CheckpointError(f"{directory} lacks rank0.pt; export a complete checkpoint")
    first = _load(files[0])
    if "model_metadata" not in first:
        if any(key.endswith("flat_param_0") for key in first["model"]):
            raise CheckpointError(
                f"{files[0]} holds FairScale shards without their layout (model_metadata): it "
                "was written by an older tango_fairscale; resume its run once with this version "
                "to write a checkpoint that has it"
            )
        return dict(first["model"])  # an unsharded engine's full state
    world_size = int(first["world_size"])
    missing = sorted(set(range(world_size)) - files.keys())
    extra = sorted(files.keys() - set(range(world_size)))
    if missing or extra:
        found = ", ".join(files[rank].name for rank in sorted(files))
        raise CheckpointError(
            f"{directory} was written by {world_size} processes but holds {found}: every "
            f"rank0.pt ... rank{world_size - 1}.pt of one checkpoint is needed"
        )
    states = [first] + [_load(files[rank]) for rank in range(1, world_size)]
    return consolidate_fairscale(
        [state["model"] for state in states], [state["model_metadata"] for state in states]
    )


def consolidate_fairscale(
    shards: list[dict[str, torch.Tensor]], metadata: list[dict[str, Any]]
) -> dict[str, torch.Tensor]:
    """The full state from every rank's ``local_state_dict()`` and ``local_metadata_dict()``.

    As FairScale 0.4.13's ``FSDP.consolidate_shard_weights``, but the shared (tied) parameters of
    *every* FSDP instance are restored: FairScale restores the last instance's only, which drops
    GPT-2's ``lm_head.weight`` whenever the root is not the last instance.
    """
    full: dict[str, torch.Tensor] = {}
    instances = metadata[0]["param_metadata"]
    for index, instance in enumerate(instances):
        prefix = instance["fsdp_path"] + "." if instance["fsdp_path"] else ""
        for backing_name, layout in instance["params"].items():
            pieces = []
            for rank_shards, rank_metadata in zip(shards, metadata):
                shard = rank_shards[prefix + backing_name].flatten()
                padding = rank_metadata["param_metadata"][index]["params"][backing_name]["padding"]
                pieces.append(shard[: shard.numel() - padding])  # padding sits at the end only
                if instance["no_broadcast_optim_state"]:  # not sharded: every rank holds it all
                    break
            flat = torch.cat(pieces)
            if flat.numel() != sum(layout["numels"]):
                raise CheckpointError(
                    f"the shards of {prefix}{backing_name} hold {flat.numel()} values, their "
                    f"layout {sum(layout['numels'])}: the rank files are of different checkpoints"
                )
            for name, shape, piece in zip(
                layout["names"], layout["shapes"], flat.split(layout["numels"])
            ):
                full[prefix + name] = piece.view(shape)
    for instance in instances:
        prefix = instance["fsdp_path"] + "." if instance["fsdp_path"] else ""
        for source, target in instance["shared_param_info"]:
            full[prefix + target] = full[prefix + source]
    for name in metadata[0]["buffer_names"]:  # replicated: rank 0's copy
        full[name] = shards[0][name]
    return full


# --- torch.distributed.checkpoint directories: fsdp2 ---------------------------------------------


def _dcp_model_state(directory: Path) -> dict[str, torch.Tensor]:
    """The ``model`` entry of a DCP directory, read in this process alone (``no_dist``: inside a
    job, ``dcp.load`` would otherwise run collectives that the other ranks never join)."""
    import warnings

    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = directory / DCP_METADATA
    try:
        metadata = SafeReader(directory).read_metadata()  # refuses a pickle that would run code
    except Exception as error:  # unreadable, truncated, not a pickle, a refused global
        raise CheckpointError(f"cannot read {index} ({reason(error)})") from None
    files = {getattr(info, "relative_path", None) for info in metadata.storage_data.values()}
    absent = sorted(name for name in files if name and not (directory / name).is_file())
    if absent:
        raise CheckpointError(
            f"{directory} lacks {', '.join(absent)}, which its {DCP_METADATA} names; export a "
            "complete checkpoint"
        )
    state: dict[str, Any] = {
        key.removeprefix("model."): torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata)
    }
    if not state:
        raise CheckpointError(f"{directory} is a distributed checkpoint without a 'model' entry")
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            load_dcp({"model": state}, directory, no_dist=True)
    except Exception as error:  # a truncated or damaged .distcp file
        raise CheckpointError(f"cannot read {directory} ({reason(error)})") from None
    return state
