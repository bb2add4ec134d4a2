"""``tango-fairscale export``: a saved checkpoint (any engine, any world size) → a Hugging Face
model directory, in this process alone (no process group, no job)."""

from __future__ import annotations

from pathlib import Path

from .records.checkpoints import (
    CheckpointError,
    DamagedCheckpoint,
    NoManifest,
    complete_checkpoints,
    find_checkpoint,
)


def export(checkpoint: Path, out_dir: Path) -> Path:
    """Write the model of ``checkpoint`` (see :func:`~.records.checkpoints.find_checkpoint`) into
    ``out_dir`` as ``save_pretrained`` output (safetensors, config, tokenizer): it loads with
    ``AutoModelForCausalLM.from_pretrained(out_dir)``, every key matched. Every file is verified
    against the checkpoint's manifest first. Returns the checkpoint directory read. Raises
    :class:`CheckpointError` (one line) for what cannot be exported."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise CheckpointError(f"{out_dir} already exists and is not empty; give a new directory")
    directory = find_checkpoint(Path(checkpoint))
    # torch's and transformers' imports (~4 s on 2 cores) after the checks above, and only when
    # exporting: this module is imported by every ``tango run`` (Tango imports each submodule).
    from .parallel.consolidate import full_state_dict, hf_model, hf_tokenizer

    try:
        state = full_state_dict(directory)
    except NoManifest as error:
        raise CheckpointError(
            f"{error}; export it with the tango_fairscale that wrote it"
        ) from None
    except DamagedCheckpoint as damage:
        earlier = [path for path in complete_checkpoints(directory.parent) if path != directory]
        hint = f"; export an earlier checkpoint ({earlier[0]})" if earlier else ""
        raise CheckpointError(f"{damage}{hint}") from None
    model = hf_model(directory, state)
    tokenizer = hf_tokenizer(directory)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return directory
