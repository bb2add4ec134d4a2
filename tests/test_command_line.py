"""``tango run`` command lines checked before any work (tango_fairscale/command_line.py):

* the variables each config reads are found statically (literal ``std.extVar`` calls, helpers
  that pass a parameter to it, imports followed); an unknown ``-D`` name is refused with the
  closest known one, through ``tango run`` (at the package's import) and through the launcher
  (``python -m tango_fairscale run``), before the workspace exists, in one line (no traceback);
* a read-only workspace is refused in one line instead of a ``PermissionError`` deep in Tango;
* importing the package (or ``tango_fairscale.results``) outside ``tango run`` imports neither
  Tango nor torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.commands import run_command
from tango.common.exceptions import ConfigurationError

from tango_fairscale.command_line import check_tango_run, config_variables

REPO_ROOT = Path(__file__).resolve().parents[1]
GPT2_PIQA = REPO_ROOT / "configs" / "gpt2_piqa.jsonnet"
MC_SUITE = REPO_ROOT / "configs" / "mc_suite.jsonnet"
COMMON = {
    "model", "train_steps", "device_count", "engine", "precision", "batch_size", "lr", "seed",
    "validate_every", "limit", "warmup_steps", "lr_decay", "log_every",
}  # fmt: skip


def test_the_configs_variables_are_found() -> None:
    assert config_variables(GPT2_PIQA) == (COMMON | {"data_dir"}, False)
    suite = COMMON | {"tasks", "task_data_dir", "num_fewshot", "train_task", "data_dir"}
    suite |= {"apply_chat_template", "fewshot_as_multiturn", "system_instruction"}
    suite |= {"fewshot_seed", "include_path", "gen_kwargs"}
    assert config_variables(MC_SUITE) == (suite, False)


def test_helpers_imports_comments_and_computed_names(tmp_path: Path) -> None:
    (tmp_path / "lib.libsonnet").write_text(
        "{\n  get(default, name):: std.extVar(name),\n  other(x):: x,\n}\n"
    )
    config = tmp_path / "config.jsonnet"
    config.write_text(
        "local lib = import 'lib.libsonnet';\n"
        "local v(name) = std.parseInt(std.extVar(name));\n"
        "// std.extVar('commented')\n"
        "{ a: v('alpha'), b: lib.get(1, 'beta'), url: 'http://x', c: std.extVar(\"gamma\"),\n"
        "  d: lib.other('not_a_variable') }\n"
    )
    assert config_variables(config) == ({"alpha", "beta", "gamma"}, False)
    config.write_text("local p = 'x_'; { a: std.extVar(p + 'name') }\n")
    assert config_variables(config) == (set(), True)


@pytest.mark.parametrize(
    "config, define, closest",
    [(GPT2_PIQA, "train_step=4", "train_steps"), (MC_SUITE, "task=piqa", "tasks")],
)
def test_an_unknown_variable_is_refused_with_the_closest_name(config, define, closest) -> None:
    with pytest.raises(ConfigurationError, match=f"did you mean '{closest}'") as error:
        check_tango_run(["run", str(config), "-D", "limit=4", "-D", define])
    assert str(error.value).startswith(f"-D {define.split('=')[0]} is not a variable of ")
    check_tango_run(["--log-level", "info", "run", str(config), "-D", "limit=4"])


def test_a_variable_of_another_config_is_refused() -> None:
    """tango.yml holds the defaults of both configs; gpt2_piqa.jsonnet reads no ``tasks``."""
    with pytest.raises(ConfigurationError, match="-D tasks is not a variable of"):
        check_tango_run(["run", str(GPT2_PIQA), "-D", "tasks=arc_easy"])


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize(
    "program",
    [["-m", "tango"], pytest.param(["-m", "tango_fairscale"], marks=pytest.mark.slow)],
    ids=["tango", "launcher"],
)
def test_a_misspelled_variable_is_refused_before_any_work(
    tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path, program: list[str]
) -> None:
    workspace = tmp_path / "workspace"
    defines = ["train_step=4", "train_steps=0", f"model={tiny_model_dir}", f"data_dir={piqa_dir}"]
    command = [sys.executable, *program, "run", "configs/gpt2_piqa.jsonnet", "-w", str(workspace)]
    done = run_command(command + [a for d in defines for a in ("-D", d)])
    assert done.returncode != 0
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr  # no traceback
    line = last_line(done)
    assert "-D train_step is not a variable of" in line and "did you mean 'train_steps'" in line
    assert not workspace.exists()


def test_a_read_only_workspace_is_refused_up_front(
    tmp_path: Path, tiny_model_dir: Path, piqa_dir: Path
) -> None:
    workspace = tmp_path / "read-only"
    workspace.mkdir()
    as_root = os.geteuid() == 0  # root writes anywhere, except into an immutable directory
    if as_root and shutil.which("chattr") is None:
        pytest.skip("running as root without chattr: no directory is read-only")
    if as_root:
        subprocess.run(["chattr", "+i", str(workspace)], check=True)
    else:
        workspace.chmod(0o500)
    try:
        defines = ["train_steps=0", f"model={tiny_model_dir}", f"data_dir={piqa_dir}", "limit=4"]
        command = [sys.executable, "-m", "tango", "run", str(GPT2_PIQA), "-w", str(workspace)]
        done = run_command(command + [a for d in defines for a in ("-D", d)])
    finally:
        if as_root:
            subprocess.run(["chattr", "-i", str(workspace)], check=True)
        else:
            workspace.chmod(0o700)
    assert done.returncode != 0
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr  # no traceback
    line = last_line(done)
    assert " ERROR    workspace " in line, line
    assert "is not writable" in line and "choose another -w directory" in line, line


def test_importing_the_package_imports_neither_tango_nor_torch() -> None:
    code = (
        "import sys, tango_fairscale, tango_fairscale.results\n"
        "heavy = [m for m in ('torch', 'tango', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    done = run_command([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr[-2000:]
