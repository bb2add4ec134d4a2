"""How a trained model is stored (``train/format.py``): Hugging Face's layout plus the training
log, read back as the same weights and log, loadable without the package."""

from __future__ import annotations

from pathlib import Path

import torch

from tango_fairscale.model.causal_lm import ModelWrapper
from tango_fairscale.train.format import ModelFormat


def test_a_stored_model_reads_back_with_its_log(tmp_path: Path, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = ModelWrapper(str(tiny_model_dir))
    model.training_log = [{"step": 1, "train_loss": 2.5}, {"step": 2, "val_acc": 0.5}]
    ModelFormat().write(model, tmp_path / "stored")
    assert not list((tmp_path / "stored").glob("*.pt")) and not list(
        (tmp_path / "stored").glob("*.pkl")
    )  # no pickles
    read = ModelFormat().read(tmp_path / "stored")
    assert read.training_log == model.training_log
    expected = model.state_dict()
    assert all(torch.equal(read.state_dict()[key], value) for key, value in expected.items())
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "stored")
    assert torch.equal(plain.transformer.wte.weight, model.model.transformer.wte.weight)


def test_a_model_without_a_log_stores_an_empty_one(tmp_path: Path, tiny_model_dir: Path) -> None:
    model = ModelWrapper(str(tiny_model_dir))
    ModelFormat().write(model, tmp_path / "stored")
    assert (tmp_path / "stored" / "training_log.jsonl").read_text() == ""
    assert ModelFormat().read(tmp_path / "stored").training_log == []
