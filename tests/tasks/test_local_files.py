"""The local files a task definition reads, resolved as lm-eval and ``datasets`` resolve them.

* a YAML: itself, its includes (a name or a list, recursively, relative to the including YAML),
  its ``!function`` modules next to it (not lm-eval's own), its config with the includes merged;
* ``data_files`` as a string, a list, a split → path or split → list mapping, a glob; relative to
  a local ``dataset_path`` directory, else ``dataset_kwargs.data_dir``, else the working
  directory; URLs left out; a missing file kept;
* a local ``dataset_path`` directory or file; a hub name left out;
* a group's inline task configs; a YAML that does not parse is itself, with no config.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tango_fairscale.tasks.local_files import dataset_files, yaml_files


def test_data_files_in_every_form(tmp_path: Path) -> None:
    a, b, c = (str(tmp_path / name) for name in ("a.jsonl", "b.jsonl", "c.jsonl"))
    forms: list[tuple[object, list[str]]] = [
        (a, [a]),
        ([a, b], [a, b]),
        ({"test": a, "train": b}, [a, b]),
        ({"test": [a, c], "train": b}, [a, c, b]),
        ("~/x.jsonl", [str(Path("~/x.jsonl").expanduser())]),
    ]
    for data_files, expected in forms:
        config = {"dataset_path": "json", "dataset_kwargs": {"data_files": data_files}}
        assert dataset_files(config) == [Path(path) for path in expected], data_files


def test_globs_urls_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    for name in ("2.jsonl", "1.jsonl", "x.txt"):
        (tmp_path / "d" / name).write_text("")
    data_files = [
        str(tmp_path / "d" / "*.jsonl"),
        "https://example.org/t.jsonl",
        "hf://datasets/x/y/t.jsonl",
        str(tmp_path / "missing.jsonl"),
        str(tmp_path / "none*.jsonl"),
    ]
    config = {"dataset_path": "json", "dataset_kwargs": {"data_files": data_files}}
    assert dataset_files(config) == [
        tmp_path / "d" / "1.jsonl",
        tmp_path / "d" / "2.jsonl",
        tmp_path / "missing.jsonl",
        tmp_path / "none*.jsonl",
    ]


def test_relative_paths_resolve_as_datasets_resolves_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "local"
    local.mkdir()
    relative = {"data_files": {"test": "t.jsonl"}}
    assert dataset_files({"dataset_path": "json", "dataset_kwargs": relative}) == [Path("t.jsonl")]
    assert dataset_files(
        {"dataset_path": "json", "dataset_kwargs": {**relative, "data_dir": "sub"}}
    ) == [Path("sub/t.jsonl")]
    assert dataset_files({"dataset_path": str(local), "dataset_kwargs": relative}) == [
        local,
        local / "t.jsonl",
    ]


def test_a_local_dataset_path_directory_or_file_and_not_a_hub_name(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("")
    assert dataset_files({"dataset_path": str(tmp_path)}) == [tmp_path]
    assert dataset_files({"dataset_path": str(tmp_path / "data.jsonl")}) == [
        tmp_path / "data.jsonl"
    ]
    assert dataset_files({"dataset_path": "allenai/ai2_arc", "dataset_name": "ARC-Easy"}) == []


def test_a_groups_inline_tasks(tmp_path: Path) -> None:
    config = {
        "group": "mine",
        "task": [
            "arc_easy",
            {"task": "one", "dataset_path": "json", "dataset_kwargs": {"data_files": "/d/1.jsonl"}},
            {"task": "two", "dataset_path": "json", "dataset_kwargs": {"data_files": "/d/2.jsonl"}},
        ],
    }
    assert dataset_files(config) == [Path("/d/1.jsonl"), Path("/d/2.jsonl")]


def test_a_yaml_its_includes_and_function_modules(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "_common.yaml").write_text(
        "dataset_path: json\ndataset_kwargs:\n  data_files: {test: /d/base.jsonl}\n"
        "process_docs: !function helpers.process\nmetric_list:\n  - metric: acc\n"
    )
    (tmp_path / "base" / "helpers.py").write_text("def process(docs): return docs\n")
    (tmp_path / "extra.yaml").write_text("doc_to_text: '{{goal}}'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "utils.py").write_text("def target(doc): return 0\n")
    task = tmp_path / "task.yaml"
    task.write_text(
        "include: [base/_common.yaml, extra.yaml, missing.yaml]\ntask: mine\n"
        "doc_to_target: !function pkg.utils.target\n"
        "filter_list:\n  - filter: [{function: !function lm_eval.filters.x}]\n"
    )
    files, config = yaml_files(task)
    assert files == [
        task.resolve(),
        (tmp_path / "base" / "_common.yaml").resolve(),
        (tmp_path / "base" / "helpers.py").resolve(),
        (tmp_path / "extra.yaml").resolve(),
        (tmp_path / "pkg" / "utils.py").resolve(),
    ]
    assert config["task"] == "mine" and config["doc_to_text"] == "{{goal}}"
    assert dataset_files(config) == [Path("/d/base.jsonl")]


def test_an_include_by_name_and_a_yaml_that_does_not_parse(tmp_path: Path) -> None:
    (tmp_path / "_template").write_text("dataset_path: json\n")
    (tmp_path / "task.yaml").write_text("include: _template\ntask: t\n")
    files, config = yaml_files(tmp_path / "task.yaml")
    assert files == [(tmp_path / "task.yaml").resolve(), (tmp_path / "_template").resolve()]
    assert config == {"dataset_path": "json", "task": "t"}
    (tmp_path / "bad.yaml").write_text("task: [unclosed\n")
    assert yaml_files(tmp_path / "bad.yaml") == ([(tmp_path / "bad.yaml").resolve()], {})
    assert yaml_files(tmp_path / "absent.yaml") == ([], {})
