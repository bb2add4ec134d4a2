"""``DatasetDictFormat``: a data step's ``DatasetDict`` stored as JSON, read back as data only;
``RequestsFormat`` (a ``task_requests`` result) and ``JsonDataFormat`` (the evaluation steps'
results: Tango's ``JsonFormat`` file) likewise; ``TokensFormat`` (a ``task_tokens`` result) as
JSON and safetensors arrays.

* strings kept exactly (unicode, trailing and double spaces), labels, metadata;
* the PIQA step stores its result in it: one JSON file in the workspace, no pickle;
* a stored file naming a class or module (as Tango's ``JsonFormat`` would rebuild) is read as
  plain data: nothing is imported; a file of another shape is refused in one line (both
  formats).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import make_piqa_dir
from tango import JsonFormat
from tango.common.dataset_dict import DatasetDict
from tango.workspaces import LocalWorkspace

from tango_fairscale.tasks.format import (
    DATA_FILE,
    JSON_FILE,
    REQUESTS_FILE,
    DatasetDictFormat,
    JsonDataFormat,
    RequestsFormat,
    TokensFormat,
)
from tango_fairscale.tasks.piqa import PiqaDataStep

EXAMPLES = [
    {"goal": "Café  au lait ", "sol1": "ünïcødé ✓", "sol2": "b", "label": 0},
    {"goal": "x", "sol1": "a", "sol2": "b\n", "label": -1},
]


def test_round_trip(tmp_path: Path) -> None:
    stored = DatasetDict(splits={"train": EXAMPLES, "test": []}, metadata={"source": "piqa"})
    DatasetDictFormat().write(stored, tmp_path)
    assert [path.name for path in tmp_path.iterdir()] == [DATA_FILE]
    assert json.loads((tmp_path / DATA_FILE).read_text())["splits"]["train"] == EXAMPLES
    read = DatasetDictFormat().read(tmp_path)
    assert isinstance(read, DatasetDict)
    assert read.splits == stored.splits and read.metadata == stored.metadata


def test_the_piqa_step_stores_json_not_a_pickle(tmp_path: Path) -> None:
    workspace = LocalWorkspace(tmp_path / "workspace")
    step = PiqaDataStep(data_dir=str(make_piqa_dir(tmp_path / "piqa")), limit=2)
    assert isinstance(step.format, DatasetDictFormat)
    result = step.result(workspace)
    files = [p for p in (tmp_path / "workspace" / "cache").rglob("*") if p.is_file()]
    stored = [p.name for p in files if p.parent.name == step.unique_id]
    assert DATA_FILE in stored and not [name for name in stored if "dill" in name], stored
    again = PiqaDataStep(data_dir=str(tmp_path / "piqa"), limit=2).result(workspace)
    assert again.splits == result.splits and len(again["validation"]) == 2


def planted_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> tuple:
    """``(entry, marker)``: a Tango ``_dataclass`` entry naming class ``Boom`` of ``module``, an
    importable module that creates the file ``marker`` when it is imported."""
    modules = tmp_path / "modules"
    modules.mkdir()
    marker = tmp_path / "imported"
    (modules / f"{module}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nclass Boom:\n    def __init__(self, **kw): pass\n"
    )
    monkeypatch.syspath_prepend(str(modules))
    return {"_dataclass": [module, "Boom"]}, marker


def test_a_stored_class_name_is_read_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted, marker = planted_class(tmp_path, monkeypatch, "planted_module")
    stored = {"splits": {"train": [planted]}, "metadata": planted, "_dataclass": planted}
    (tmp_path / DATA_FILE).write_text(json.dumps(stored))
    read = DatasetDictFormat().read(tmp_path)
    assert read.splits == {"train": [planted]} and read.metadata == planted
    assert not marker.exists() and "planted_module" not in sys.modules


@pytest.mark.parametrize(
    "content",
    ["[1, 2]", '{"splits": {"train": 3}, "metadata": {}}', '{"splits": {}}', "{not json", "\udcff"],
)
def test_another_shape_is_refused_in_one_line(tmp_path: Path, content: str) -> None:
    (tmp_path / DATA_FILE).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError) as error:
        DatasetDictFormat().read(tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / DATA_FILE) in message, message


def test_stored_requests_are_read_as_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planted, marker = planted_class(tmp_path, monkeypatch, "planted_requests")
    stored = {"format": 1, "tasks": {"t": planted}, "spec": {"context": "Café  ✓ \n"}}
    RequestsFormat().write(stored, tmp_path)
    assert RequestsFormat().read(tmp_path) == stored
    assert not marker.exists() and "planted_requests" not in sys.modules


@pytest.mark.parametrize("content", ["[1, 2]", '{"tasks": {}}', "{not json", "\udcff"])
def test_stored_requests_of_another_shape_are_refused_in_one_line(
    tmp_path: Path, content: str
) -> None:
    (tmp_path / REQUESTS_FILE).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError) as error:
        RequestsFormat().read(tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / REQUESTS_FILE) in message, message


def test_json_results_are_tangos_file_read_as_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted, marker = planted_class(tmp_path, monkeypatch, "planted_results")
    result = {"results": {"piqa": {"acc,none": 0.5, "acc_stderr,none": float("nan")}}, "x": planted}
    for name, format_ in (("ours", JsonDataFormat()), ("tangos", JsonFormat())):
        (tmp_path / name).mkdir()
        format_.write(result, tmp_path / name)
    ours, tangos = ((tmp_path / name / JSON_FILE).read_text() for name in ("ours", "tangos"))
    assert json.loads(ours.replace("NaN", "null")) == json.loads(tangos.replace("NaN", "null"))
    for name in ("ours", "tangos"):  # a result Tango's JsonFormat stored reads the same way
        read = JsonDataFormat().read(tmp_path / name)
        assert read["x"] == planted and read["results"]["piqa"]["acc,none"] == 0.5
    assert not marker.exists() and "planted_results" not in sys.modules


def test_stored_tokens_round_trip_and_other_arrays_are_refused(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tokens = {
        "format": 1,
        "tokenizer": ["tokenizer", "abc"],
        "pairs": "def",
        "ids": torch.tensor([5, 6, 7], dtype=torch.int32),
        "offsets": torch.tensor([0, 1, 3]),
        "context_lengths": torch.tensor([0, 1], dtype=torch.int32),
    }
    TokensFormat().write(tokens, tmp_path)
    back = TokensFormat().read(tmp_path)
    assert back.keys() == tokens.keys()
    assert all(torch.equal(back[k], v) if isinstance(v, torch.Tensor) else back[k] == v
               for k, v in tokens.items())  # fmt: skip
    save_file({"ids": torch.zeros(3, dtype=torch.float32)}, str(tmp_path / "tokens.safetensors"))
    with pytest.raises(ValueError, match="does not hold a stored task_tokens result") as error:
        TokensFormat().read(tmp_path)
    assert "\n" not in str(error.value)
