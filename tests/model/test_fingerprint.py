"""What a model's sources add to a step's cache key (``model/fingerprint.py``): a directory's
files (not its path), a hub id's commit (offline: the local hub cache's), and a one-line refusal
when neither the hub nor the cache knows the id. No test here reaches the network."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tango.common import Lazy, Params
from tango.common.det_hash import det_hash
from tango.common.exceptions import ConfigurationError
from tango.integrations.torch import Model

from tango_fairscale.model.fingerprint import (
    FingerprintedLazy,
    HubRevision,
    hub_revision,
    is_hub_id,
    source_fingerprint,
    unreachable,
)

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The hub offline, its cache an empty directory; ``hub_revision``'s memory cleared."""
    from huggingface_hub import constants

    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    hub_revision.cache_clear()
    yield cache
    hub_revision.cache_clear()


def cached(cache: Path, repo_id: str, commit: str = COMMIT) -> None:
    """The hub cache holds ``repo_id`` at ``commit`` (as ``hf download`` leaves it)."""
    refs = cache / f"models--{repo_id.replace('/', '--')}" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text(commit + "\n")


def model_dir(root: Path, config: str = '{"n_layer": 2}') -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(config)
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.mark.parametrize(
    "source, hub",
    [
        ("gpt2", True),
        ("EleutherAI/pythia-70m", True),
        ("a/b/c", False),
        ("./gpt2", False),
        ("/models/gpt2", False),
        ("~/gpt2", False),
        ("", False),
        ("/", False),
    ],
)
def test_hub_ids_are_names_or_org_slash_name(source: str, hub: bool) -> None:
    assert is_hub_id(source) is hub


def test_a_local_directory_named_like_a_hub_id_is_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    model_dir(tmp_path / "gpt2")
    assert not is_hub_id("gpt2")
    assert source_fingerprint("gpt2")[0] == "dir"


def test_a_directory_is_fingerprinted_by_its_files_not_its_path(tmp_path: Path) -> None:
    first = source_fingerprint(str(model_dir(tmp_path / "a")))
    assert first[0] == "dir"
    copy = shutil.copytree(tmp_path / "a", tmp_path / "elsewhere")
    assert source_fingerprint(str(copy)) == first
    (copy / "config.json").write_text('{"n_layer": 3}')
    assert source_fingerprint(str(copy)) != first


def test_a_path_that_is_no_directory_stands_for_itself() -> None:
    assert source_fingerprint("./no/such/model") == ("path", "./no/such/model")


def test_a_hub_id_is_its_cached_commit_offline(offline_cache: Path) -> None:
    cached(offline_cache, "org/tiny")
    assert hub_revision("org/tiny") == HubRevision(COMMIT, online=False)
    assert source_fingerprint("org/tiny") == ("hub", "org/tiny", COMMIT)


def test_a_commit_revision_is_its_own_answer(offline_cache: Path) -> None:
    assert hub_revision("org/unknown", COMMIT) == HubRevision(COMMIT, online=False)


def test_a_hub_id_nobody_knows_is_refused_in_one_line(offline_cache: Path) -> None:
    with pytest.raises(ConfigurationError) as error:
        source_fingerprint("org/never-downloaded")
    assert str(error.value) == unreachable("org/never-downloaded")
    assert "\n" not in str(error.value) and "hf download org/never-downloaded" in str(error.value)


def test_the_cache_key_follows_the_files_of_model_and_tokenizer(tmp_path: Path) -> None:
    model = model_dir(tmp_path / "model")
    tokenizer = model_dir(tmp_path / "tokenizer", "{}")
    params = {
        "type": "tango_fairscale::causal_lm",
        "model": str(model),
        "tokenizer": str(tokenizer),
    }

    def keys() -> tuple[str, str]:
        lazy = Lazy(Model, Params(dict(params)))
        return det_hash(lazy), det_hash(FingerprintedLazy.of(lazy))

    plain, fingerprinted = keys()
    assert [
        name for name, _ in FingerprintedLazy.of(Lazy(Model, Params(dict(params)))).sources
    ] == [
        "model",
        "tokenizer",
    ]
    (model / "config.json").write_text('{"n_layer": 4}')
    assert keys()[0] == plain  # a Lazy alone sees the path only
    assert keys()[1] != fingerprinted
    changed = keys()[1]
    (tokenizer / "tokenizer.json").write_text('{"v": 1}')
    assert keys()[1] != changed


def test_the_fingerprinted_lazy_builds_what_the_lazy_builds(tmp_path: Path) -> None:
    lazy = Lazy(Model, Params({"type": "tango_fairscale::causal_lm", "model": "./missing"}))
    made = FingerprintedLazy.of(lazy)
    assert made.sources == (("model", ("path", "./missing")),)
    assert made._params.as_dict() == lazy._params.as_dict()
    assert made._constructor is lazy._constructor
