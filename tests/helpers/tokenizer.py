"""The tests' tokenizer: GPT-2's byte-level BPE cut to its first :data:`MERGES` merges.

GPT-2's ids 0-255 are its byte tokens and merge ``i`` makes token ``256 + i``, so keeping the first
merges keeps a valid BPE of :data:`VOCAB` tokens that encodes any text (PIQA's rows in about 1.7
times GPT-2's tokens), with ``<|endoftext|>`` as its last id. GPT-2's 50,257-token output layer
and its 2 MB tokenizer file (parsed three times per load) would be most of a tiny model's cost:
with this vocabulary a 3-step 2-process parity run takes 0.3 s instead of 1.3 s. The vocabulary
stays odd, so sharded embeddings still split unevenly. The comparisons with lm-eval keep GPT-2's
own tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

MERGES = 1000
BYTES = 256
#: The byte tokens, the kept merges and ``<|endoftext|>``.
VOCAB = BYTES + MERGES + 1
END_OF_TEXT = "<|endoftext|>"


def save_small_tokenizer(gpt2_dir: Path, directory: Path) -> Path:
    """Write the cut tokenizer of GPT-2's files in ``gpt2_dir`` (``tokenizer.json``,
    ``vocab.json``, ``merges.txt``) into ``directory``."""
    spec = json.loads((gpt2_dir / "tokenizer.json").read_text(encoding="utf-8"))
    model = spec["model"]
    vocab = {token: i for token, i in model["vocab"].items() if i < BYTES + MERGES}
    vocab[END_OF_TEXT] = BYTES + MERGES
    assert len(vocab) == VOCAB, "GPT-2's ids are not bytes then merges in order"
    merges = model["merges"][:MERGES]
    model.update(vocab=vocab, merges=merges)
    [special] = spec["added_tokens"]
    assert special["content"] == END_OF_TEXT
    special["id"] = vocab[END_OF_TEXT]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), "utf-8")
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), "utf-8")
    lines = merges if isinstance(merges[0], str) else [" ".join(pair) for pair in merges]
    (directory / "merges.txt").write_text("#version: 0.2\n" + "\n".join(lines) + "\n", "utf-8")
    return directory


def vocabulary_fields(tokenizer_dir: Path) -> dict[str, int]:
    """A model config's vocabulary size and BOS/EOS ids (``<|endoftext|>``) for the byte-level
    BPE tokenizer in ``tokenizer_dir`` (this one or GPT-2's own)."""
    vocab = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    end = vocab["vocab"][END_OF_TEXT]
    return {"vocab_size": len(vocab["vocab"]), "bos_token_id": end, "eos_token_id": end}
