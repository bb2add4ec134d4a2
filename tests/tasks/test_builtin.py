"""lm-eval's own tasks by name (``tango_fairscale.tasks.builtin``): the index of every task, group
and tag, kept in a cache file read back in milliseconds (without importing lm-eval's task code),
equal to the one lm-eval builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tango_fairscale.tasks.builtin import INDEX_HEADER, _read_index, builtin, builtin_index


def test_the_index_names_lm_evals_tasks_groups_and_tags() -> None:
    import lm_eval.tasks

    index = builtin_index()
    tasks_dir = Path(lm_eval.tasks.__file__).resolve().parent
    kind, path = index["piqa"]
    assert kind == "TASK" and path == str(tasks_dir / "piqa" / "piqa.yaml")
    assert index["mmlu"][0] == "GROUP" and builtin("piqa", local=True) == index["piqa"]
    assert all(path is None or Path(path).is_file() for _, path in list(index.values())[:200])


def test_a_stored_index_is_read_back_as_written_and_another_folders_refused(
    tmp_path: Path,
) -> None:
    stored = tmp_path / "index.tsv"
    tasks_dir = tmp_path / "tasks"
    stored.write_text(f"{INDEX_HEADER}\t{tasks_dir}\npiqa\tTASK\tpiqa/piqa.yaml\npy\tTASK\t\n")
    assert _read_index(stored, tasks_dir) == {
        "piqa": ("TASK", str(tasks_dir / "piqa" / "piqa.yaml")),
        "py": ("TASK", None),
    }
    with pytest.raises(ValueError, match="is not an index of"):
        _read_index(stored, tmp_path / "elsewhere")


@pytest.mark.parametrize("path", ["/elsewhere/piqa.yaml", "../elsewhere/piqa.yaml"])
def test_a_stored_index_naming_a_yaml_outside_lm_eval_is_refused(tmp_path: Path, path: str) -> None:
    """A task name loads lm-eval's own YAML (its ``!function`` modules run), never another."""
    stored = tmp_path / "index.tsv"
    tasks_dir = tmp_path / "tasks"
    stored.write_text(f"{INDEX_HEADER}\t{tasks_dir}\npiqa\tTASK\t{path}\n")
    with pytest.raises(ValueError, match="outside"):
        _read_index(stored, tasks_dir)


def test_reading_the_index_imports_none_of_lm_evals_task_code() -> None:
    """A command whose steps all come from the cache reads the index while Tango builds the step
    graph: ``lm_eval.tasks`` (datasets, pandas: seconds to import) stays out of it."""
    import subprocess
    import sys

    builtin_index()  # stored, if it was not
    check = (
        "import sys; from tango_fairscale.tasks.builtin import builtin_index; "
        "assert builtin_index()['piqa'][0] == 'TASK'; "
        "print(sorted(m for m in ('lm_eval.tasks', 'datasets', 'pandas') if m in sys.modules))"
    )
    output = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, check=True
    ).stdout
    assert output.strip() == "[]"
