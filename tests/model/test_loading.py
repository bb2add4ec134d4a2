"""Loading a model: fp32 master weights whatever the checkpoint stores, and one line (not a
traceback, not a silently broken model) for what cannot make a usable model.

* a bf16-stored Llama loads as fp32, scores like an independent fp32 forward and trains exactly
  like its fp32 copy;
* a directory without tokenizer files (transformers builds a near-empty tokenizer quietly), an
  ``eos_token_id`` outside the tokenizer, a hub id with the hub unreachable (with and without
  ``HF_HUB_OFFLINE``) are refused in one line; a hub id the local cache holds loads offline.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.families import VERIFIED_FAMILIES, package_scores, reference_scores, save_family
from tango.common.exceptions import ConfigurationError

from tango_fairscale.model.causal_lm import ModelWrapper

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_a_bf16_checkpoint_is_loaded_with_fp32_master_weights(
    tmp_path, tokenizer_dir, piqa_small
) -> None:
    from conftest import choice_queries

    directory = save_family(tmp_path / "llama", "llama", tokenizer_dir)
    bf16 = tmp_path / "llama-bf16"
    ModelWrapper(str(directory)).model.to(torch.bfloat16).save_pretrained(bf16)
    shutil.copy(directory / "tokenizer.json", bf16)
    shutil.copy(directory / "tokenizer_config.json", bf16)
    assert '"dtype": "bfloat16"' in (bf16 / "config.json").read_text()

    for model in (ModelWrapper(str(bf16)), ModelWrapper(str(bf16), config={})):
        assert {p.dtype for p in model.parameters()} == {torch.float32}
    model = ModelWrapper(str(bf16))
    queries = choice_queries(list(piqa_small["validation"])[:3], model.tokenizer, 128)
    torch.testing.assert_close(
        package_scores(model, queries), reference_scores(bf16, queries), rtol=1e-6, atol=1e-4
    )


@pytest.mark.slow
def test_a_bf16_checkpoint_trains_like_its_fp32_copy(tmp_path, tokenizer_dir, piqa_small) -> None:
    """4 steps at 32-true: the same fp32 weights, bit for bit, whether the checkpoint stored the
    (bf16-representable) weights in bf16 or in fp32."""
    from conftest import assert_close_by_key, train_tiny

    fp32 = tmp_path / "fp32"
    model = ModelWrapper(str(save_family(tmp_path / "llama", "llama", tokenizer_dir)))
    with torch.no_grad():
        for parameter in model.parameters():  # values bf16 holds exactly
            parameter.copy_(parameter.to(torch.bfloat16))
    model.save(fp32)
    bf16 = tmp_path / "bf16"
    model.model.to(torch.bfloat16).save_pretrained(bf16)
    model.tokenizer.save_pretrained(bf16)

    a = train_tiny(tmp_path / "wa", bf16, piqa_small, train_steps=4).state_dict()
    b = train_tiny(tmp_path / "wb", fp32, piqa_small, train_steps=4).state_dict()
    assert all(value.dtype == torch.float32 for value in a.values())
    assert_close_by_key(a, b)


@pytest.mark.parametrize("family", ["gpt2", "gemma2"])
def test_a_directory_without_tokenizer_files_is_refused(tmp_path, tokenizer_dir, family) -> None:
    """GPT-2's files missing give a tokenizer of 0 tokens; Gemma's, one of 5 special tokens
    that encodes text as ``<unk>`` (not empty: a check for ``[]`` alone would miss it)."""
    directory = save_family(tmp_path / family, family, tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).unlink()
    with pytest.raises(ConfigurationError, match="does not encode text") as error:
        ModelWrapper(str(directory))
    assert "\n" not in str(error.value)


def test_an_eos_token_outside_the_vocabulary_is_refused(tokenizer_dir) -> None:
    config = {**VERIFIED_FAMILIES["gpt2"], "eos_token_id": 60000, "bos_token_id": 60000}
    with pytest.raises(ConfigurationError, match="eos_token_id 60000 is outside the tokenizer"):
        ModelWrapper(config=config, tokenizer=str(tokenizer_dir))


def load_in_subprocess(source: str, hf_home: Path, **env: str) -> subprocess.CompletedProcess:
    """``ModelWrapper(source)`` in a fresh process whose hub is unreachable; it prints
    ``origin`` when it loads."""
    code = (
        "from tango_fairscale.model.causal_lm import ModelWrapper\n"
        f"print(ModelWrapper({source!r}).origin)"
    )
    variables = {name: value for name, value in os.environ.items() if name != "HF_HUB_OFFLINE"}
    variables.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(hf_home), **env)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=variables,
        cwd=REPO_ROOT,
    )


@pytest.mark.parametrize(
    "offline",
    [pytest.param(False, marks=pytest.mark.slow), True],
    ids=["unreachable", "HF_HUB_OFFLINE"],
)
def test_an_unreachable_hub_id_is_one_line(tmp_path, offline) -> None:
    """``model=gpt2`` without network: huggingface_hub 1.16 retried on a client it had closed
    (``RuntimeError: Cannot send a request, as the client has been closed``)."""
    done = load_in_subprocess(
        "gpt2", tmp_path / "hf", **({"HF_HUB_OFFLINE": "1"} if offline else {})
    )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("tango.common.exceptions.ConfigurationError: cannot load model"), last
    assert "hub is unreachable" in last and "hf download gpt2" in last, last
    assert "client has been closed" not in done.stderr


@pytest.mark.slow
def test_a_hub_id_the_cache_holds_loads_without_the_hub(tmp_path, tokenizer_dir) -> None:
    """With the hub unreachable a cached hub id loads from the cache, and its fingerprint is the
    commit the cache's ``refs/main`` names."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "hub" / "models--org--tiny"
    save_family(repo / "snapshots" / commit, "gpt2", tokenizer_dir)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    done = load_in_subprocess("org/tiny", tmp_path / "hf")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"('hub', 'org/tiny', '{commit}')" in done.stdout
