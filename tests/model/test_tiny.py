"""The first run's model (``model/tiny.py``, ``tango-fairscale tiny-model``): written without the
hub, it loads with ``from_pretrained`` and as the package's model; its byte tokenizer encodes any
text and decodes it back; a directory that holds files is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tango_fairscale.cli import main
from tango_fairscale.model.causal_lm import ModelWrapper


def test_the_command_writes_a_model_that_loads(tmp_path: Path, capsys) -> None:
    directory = tmp_path / "tiny"
    assert main(["tiny-model", str(directory)]) == 0
    assert "wrote a tiny random model" in capsys.readouterr().err
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == model.config.vocab_size == 257
    assert tokenizer.eos_token_id == model.config.eos_token_id == 256
    text = "Question: how do I open a jar? ☃ é\nAnswer:"
    ids = tokenizer(text).input_ids
    assert len(ids) == len(text.encode()) and tokenizer.decode(ids) == text
    wrapped = ModelWrapper(str(directory))
    assert wrapped.num_parameters < 200_000 and wrapped.max_length == 512
    before = {path.name: path.stat().st_mtime_ns for path in directory.iterdir()}
    assert main(["tiny-model", str(directory)]) == 0  # the Quick start's command, repeated
    assert "already holds a model; left as it is" in capsys.readouterr().err
    assert {path.name: path.stat().st_mtime_ns for path in directory.iterdir()} == before


def test_a_directory_with_files_is_refused(tmp_path: Path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert main(["tiny-model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not empty" in err


def test_another_tokenizer(tmp_path: Path, tokenizer_dir: Path) -> None:
    from tango_fairscale.model.tiny import save_tiny_model

    save_tiny_model(tmp_path / "tiny", tokenizer=str(tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(tokenizer_dir))


@pytest.fixture(autouse=True)
def _quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
