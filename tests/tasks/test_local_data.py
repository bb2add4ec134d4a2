"""A task's own documents (``tasks/local_data.py``): the ``<split>.jsonl`` files of a directory,
the splits a run reads of a task's config, and a config narrowed to the splits the data holds —
few-shot examples from the scored split never showing a document in its own context. (Loading
whole fixture tasks through lm-eval with their documents checked: ``test_documents.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_piqa_dir
from tango.common.exceptions import ConfigurationError

from tango_fairscale.tasks.local_data import data_files, keep_splits, splits_read

CONFIG = {"training_split": "train", "validation_split": "validation", "test_split": None}


def test_a_directory_gives_its_jsonl_files_by_split(tmp_path: Path) -> None:
    for name in ("train.jsonl", "validation.jsonl", "notes.txt"):
        (tmp_path / name).write_text("{}\n")
    assert data_files(str(tmp_path), "t") == {
        "train": str((tmp_path / "train.jsonl").resolve()),
        "validation": str((tmp_path / "validation.jsonl").resolve()),
    }
    with pytest.raises(ConfigurationError, match="task 'x': data_dir .* holds no <split>.jsonl"):
        data_files(str(tmp_path / "notes.txt"), "x")


def test_piqas_official_release_is_refused_with_its_reader_named(tmp_path: Path) -> None:
    """The official PIQA files (``valid.jsonl`` without its labels) are not ``<split>.jsonl``
    documents: the refusal names the config variable that reads them."""
    release = make_piqa_dir(tmp_path / "piqa")
    with pytest.raises(ConfigurationError) as refused:
        data_files(str(release), "piqa")
    assert str(refused.value) == (
        f"task 'piqa': data_dir '{release}' holds PIQA's official release files, not "
        "<split>.jsonl documents: give it to a tango_fairscale::piqa step instead "
        f"(configs/mc_suite.jsonnet: -D data_dir={release})"
    )


def test_a_missing_scored_split_names_the_file_to_give() -> None:
    with pytest.raises(ConfigurationError) as refused:
        keep_splits(dict(CONFIG), ["train", "valid"], "piqa")
    assert str(refused.value) == (
        "task 'piqa' scores split 'validation', which its data does not hold (its splits: "
        "'train', 'valid'): give it that split (in a data_dir, the file validation.jsonl)"
    )
    with pytest.raises(ConfigurationError) as refused:
        keep_splits({"training_split": "train"}, ["train"], "mine")
    assert str(refused.value) == (
        "task 'mine' names no split to score: give its config a test_split or validation_split"
    )


@pytest.mark.parametrize(
    "config, num_fewshot, training, splits",
    [
        (CONFIG, 0, False, ["validation"]),
        (CONFIG, 5, False, ["validation", "train"]),
        (CONFIG, 0, True, ["validation", "train"]),
        ({**CONFIG, "test_split": "test", "fewshot_split": "dev"}, 2, False, ["test", "dev"]),
        ({**CONFIG, "fewshot_config": {"samples": [{"q": 1}]}}, 3, False, ["validation"]),
        ({**CONFIG, "fewshot_config": {"split": "extra"}}, 1, False, ["validation", "extra"]),
        ({"validation_split": "validation"}, 4, False, ["validation"]),
    ],
)
def test_the_splits_a_run_reads(config, num_fewshot, training, splits) -> None:
    assert splits_read(config, num_fewshot, training) == splits


def test_splits_the_data_lacks_are_forgotten_and_one_to_score_is_required() -> None:
    config = {**CONFIG, "test_split": "test"}
    keep_splits(config, ["train", "validation"], "t")
    assert config["test_split"] is None and config["training_split"] == "train"
    with pytest.raises(ConfigurationError, match="task 't' scores split 'validation'"):
        keep_splits(dict(CONFIG), ["train"], "t")


def test_few_shot_examples_from_the_scored_split_leave_each_document_out() -> None:
    """Without training data, few-shot examples come from the scored split: lm-eval leaves each
    document out of its own context only when its few-shot split equals ``test_split`` (``None``
    for both, too), so a scored test split is named as the few-shot split as well."""
    config = {"training_split": "train", "validation_split": None, "test_split": "test"}
    keep_splits(config, ["test"], "t")
    assert config["test_split"] == config["fewshot_split"] == "test"
    assert config["training_split"] is None
    validation_only = dict(CONFIG)  # few-shot split and test split both None: lm-eval's form
    keep_splits(validation_only, ["validation"], "t")
    assert validation_only == {**CONFIG, "training_split": None}
    listed = {**CONFIG, "test_split": "test", "fewshot_config": {"samples": [{"q": 1}]}}
    keep_splits(listed, ["test"], "t")
    assert "fewshot_split" not in listed  # examples listed in the config: nothing drawn


def test_lm_eval_is_given_the_splits_a_run_reads_alone(piqa_small) -> None:
    """Evaluation reads the scored split (lm-eval would materialise the training split's
    documents as few-shot candidates at 0 shots too); training adds the training split; the
    scored documents are the same."""
    from tango_fairscale.tasks.lm_eval import TaskSpec, load_tasks

    spec = TaskSpec(name="piqa", dataset=piqa_small)
    evaluated = load_tasks(spec)["tasks"]["piqa"]
    trained = load_tasks(spec, training=True)["tasks"]["piqa"]
    assert not evaluated.has_training_docs() and trained.has_training_docs()
    assert len(list(trained.training_docs())) == len(piqa_small["train"])
    assert list(evaluated.eval_docs) == list(trained.eval_docs)
