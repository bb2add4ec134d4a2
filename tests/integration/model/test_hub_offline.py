"""A hub id with the hub unreachable, in a fresh process (the hub's settings are read when it is
imported): refused in one line with and without ``HF_HUB_OFFLINE``; loaded from the local cache
when the cache holds it. The other refusals at load are ``tests/model/test_loading.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT
from helpers.families import save_family


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
