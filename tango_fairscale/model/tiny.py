"""A small GPT-2-shaped model with random weights, saved as a Hugging Face directory: the model of
a first run (``tango-fairscale tiny-model DIR``) that needs neither the hub nor a GPU.

Its tokenizer is built here unless one is given: GPT-2's byte-level pre-tokenizer with no merges,
one token per byte (256) and ``<|endoftext|>``, so it encodes any text and the output layer stays
small. Its scores are those of an untrained model (PIQA accuracy near 0.5): it shows that the
pipeline runs, not what fine-tuning gains.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import compat  # noqa: F401  (the fixes; transformers' before it is imported)

END_OF_TEXT = "<|endoftext|>"

#: The model's shape (``transformers.GPT2Config`` fields); the vocabulary is the tokenizer's.
TINY_GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 64,
    "n_positions": 512,
}


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` with one token per byte and ``<|endoftext|>`` (id 256) as
    its beginning, end, unknown and padding token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab[END_OF_TEXT] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([END_OF_TEXT])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        unk_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
    )


def save_tiny_model(directory: Path, tokenizer: str | None = None, seed: int = 0) -> Path:
    """Write the model (:data:`TINY_GPT2`, seeded) and its tokenizer into ``directory`` (new or
    empty): the byte tokenizer, or the one at ``tokenizer`` (hub id or directory). It loads as
    ``-D model=DIRECTORY`` and with ``AutoModelForCausalLM.from_pretrained``. A directory that
    already holds a model is left as it is (so the command can be repeated: the steps that read
    it stay cached); one that holds other files is refused."""
    import tempfile

    from tango.common.exceptions import ConfigurationError

    from .causal_lm import ModelWrapper
    from .loading import load_tokenizer

    directory = Path(directory)
    if holds_model(directory):
        return directory
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigurationError(f"{directory} already exists and is not empty; give a new one")
    with tempfile.TemporaryDirectory() as scratch:
        if tokenizer is None:
            byte_tokenizer().save_pretrained(scratch)
        source = scratch if tokenizer is None else tokenizer
        loaded = load_tokenizer(source)
        end, vocabulary = end_of_text(loaded), len(loaded)
        config = {**TINY_GPT2, "vocab_size": vocabulary, "bos_token_id": end, "eos_token_id": end}
        ModelWrapper(config=config, tokenizer=source, seed=seed).save(directory)
    return directory


def end_of_text(tokenizer: Any) -> int:
    """The tokenizer's end-of-text id: the one it names, else ``<|endoftext|>``'s (GPT-2's files
    without ``tokenizer_config.json`` name none)."""
    from tango.common.exceptions import ConfigurationError

    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    found = tokenizer.get_vocab().get(END_OF_TEXT)
    if found is None:
        raise ConfigurationError(
            "the tokenizer names no end-of-text token and has no <|endoftext|>"
        )
    return int(found)


def holds_model(directory: Path) -> bool:
    """Whether ``directory`` holds a saved model: a config, weights and a tokenizer."""
    return (
        (directory / "config.json").is_file()
        and any(directory.glob("*.safetensors"))
        and (directory / "tokenizer_config.json").is_file()
    )
