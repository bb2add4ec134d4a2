"""Every missing input of a run in one message, before any step (``tango_fairscale/inputs.py``):
models and tokenizers (local directories, hub ids), PIQA's files (a directory, or the download)
and task data directories; the README's main command offline names the model and PIQA at once."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
from pathlib import Path

import pytest
import yaml
from tango.common import Params
from tango.common.exceptions import ConfigurationError

from tango_fairscale import inputs
from tango_fairscale.model import fingerprint

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = yaml.safe_load((REPO_ROOT / "tango.yml").read_text())["environment"]
SUITE_TASKS = DEFAULTS["tasks"].split(",")


def steps(config: str, **variables: object) -> dict:
    ext_vars = {**DEFAULTS, **{key: str(value) for key, value in variables.items()}}
    return Params.from_file(REPO_ROOT / "configs" / config, ext_vars=ext_vars).as_dict()["steps"]


def missing(config: str, **variables: object) -> str:
    with pytest.raises(ConfigurationError) as error:
        inputs.check_inputs(steps(config, **variables))
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No hub, an empty hub cache and PIQA download cache, a PIQA server that does not answer."""

    def unreachable(request: object, timeout: float) -> object:
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(inputs.urllib.request, "urlopen", unreachable)
    monkeypatch.setenv("CACHED_PATH_CACHE_ROOT", str(tmp_path / "cached"))
    from cached_path import common

    monkeypatch.setattr(common, "CACHE_DIRECTORY", tmp_path / "cached")
    fingerprint.hub_revision.cache_clear()
    yield
    fingerprint.hub_revision.cache_clear()


def test_the_main_config_offline_names_the_model_and_the_piqa_files(offline) -> None:
    message = missing("gpt2_piqa.jsonnet")
    assert message.startswith("2 inputs are missing: ")
    assert "cannot load model 'gpt2': neither a local directory nor reachable" in message
    assert "cannot download the PIQA files from https://yonatanbisk.com/piqa/data/" in message
    assert "-D model=DIR" in message and "-D data_dir=DIR" in message


def test_local_inputs_that_are_not_there(
    tmp_path: Path, piqa_dir: Path, tiny_model_dir: Path
) -> None:
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "valid.jsonl").write_text("{}\n")
    message = missing("gpt2_piqa.jsonnet", model=tmp_path / "nope", data_dir=tmp_path / "piqa")
    assert message.startswith("2 inputs are missing: ")
    assert f"cannot load model from path '{tmp_path / 'nope'}' (no such directory)" in message
    assert f"PIQA data directory {tmp_path / 'piqa'} is missing train.jsonl, train-lab" in message
    inputs.check_inputs(steps("gpt2_piqa.jsonnet", model=tiny_model_dir, data_dir=piqa_dir))


def test_a_model_directory_without_its_config_or_tokenizer_is_named(
    tmp_path: Path, piqa_dir: Path, tiny_model_dir: Path
) -> None:
    """Refused before any step, not after the data steps where the model loads."""
    import shutil

    empty = tmp_path / "empty"
    empty.mkdir()
    message = missing("gpt2_piqa.jsonnet", model=empty, data_dir=piqa_dir)
    assert (
        f"cannot load model from '{empty}': it has no config.json and no tokenizer files" in message
    )
    weights_only = shutil.copytree(tiny_model_dir, tmp_path / "weights-only")
    for name in inputs.TOKENIZER_FILES:
        (weights_only / name).unlink(missing_ok=True)
    message = missing("gpt2_piqa.jsonnet", model=weights_only, data_dir=piqa_dir)
    assert f"'{weights_only}': it has no tokenizer files" in message and "-D model=DIR" in message


@pytest.mark.parametrize("train_steps", ["0", "3"])
def test_every_missing_task_folder_is_named(
    tmp_path: Path, tiny_model_dir: Path, train_steps: str
) -> None:
    (tmp_path / "piqa").mkdir()
    (tmp_path / "piqa" / "validation.jsonl").write_text("{}\n")
    message = missing(
        "mc_suite.jsonnet", model=tiny_model_dir, task_data_dir=tmp_path, train_steps=train_steps
    )
    assert message.startswith("no task data: ")  # one problem: the message alone
    assert (
        f"{tmp_path} has no <task>/<split>.jsonl for {', '.join(sorted(SUITE_TASKS[1:]))} ("
        in message
    )


def test_a_misspelled_task_with_local_data_is_named_as_a_typo(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Not sent to fill a data directory for a task lm-eval does not have; spaces after the
    commas of ``-D tasks`` are no part of a name."""
    for name in ("piqa", "arc_easy"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "validation.jsonl").write_text("{}\n")
    message = missing(
        "mc_suite.jsonnet", model=tiny_model_dir, task_data_dir=tmp_path, tasks="piqa,arc_esay"
    )
    assert message.startswith("unknown lm-eval task 'arc_esay'") and "'arc_easy'" in message
    spaced = steps(
        "mc_suite.jsonnet", model=tiny_model_dir, task_data_dir=tmp_path, tasks="piqa, arc_easy"
    )
    assert {"scores_piqa", "scores_arc_easy"} <= set(spaced)
    inputs.check_inputs(spaced)


def test_only_the_selected_steps_and_what_they_use(offline, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="^cannot download the PIQA files"):
        inputs.check_inputs(steps("gpt2_piqa.jsonnet"), ["piqa"])


def test_the_literal_command_offline_fails_once_naming_both(tmp_path: Path) -> None:
    """``tango run configs/gpt2_piqa.jsonnet -w workspace`` with no network: one message, before
    the workspace exists (the PIQA server is reached through a proxy that refuses)."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "CACHED_PATH_CACHE_ROOT": str(tmp_path / "cached"),
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    workspace = tmp_path / "workspace"
    done = subprocess.run(
        [sys.executable, "-m", "tango", "run", "configs/gpt2_piqa.jsonnet", "-w", str(workspace)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "missing" in line]
    assert len(lines) == 1 and "2 inputs are missing" in lines[0], done.stderr[-2000:]
    assert "model 'gpt2'" in lines[0] and "PIQA files" in lines[0]
    assert "Traceback" not in done.stderr and not workspace.exists()
