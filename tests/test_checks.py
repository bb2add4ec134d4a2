"""The config checks (``checks.py``): each accepts exactly its values and refuses the rest in one
line that names the field, shows the value and says what to change."""

from __future__ import annotations

from typing import Any

import pytest
from tango.common.dataset_dict import DatasetDict
from tango.common.exceptions import ConfigurationError

from tango_fairscale.checks import (
    boolean,
    did_you_mean,
    document_limit,
    non_negative_int,
    one_line,
    one_of,
    positive_int,
    positive_ints,
    positive_number,
    reason,
    split_of,
    text,
)


def refusal(check: Any, *args: Any, **kwargs: Any) -> str:
    """The one-line message ``check(*args, **kwargs)`` refuses with."""
    with pytest.raises(ConfigurationError) as error:
        check(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_one_line_folds_whitespace_and_cuts() -> None:
    assert one_line("a\n  b\t\tc \n") == "a b c"
    assert one_line(ValueError("x\ny"), limit=2) == "x "
    assert reason(OSError("disk\nfull")) == "OSError: disk full"
    assert reason(RuntimeError("z" * 400)) == "RuntimeError: " + "z" * 300


def test_did_you_mean_names_the_closest_choice_only_when_close() -> None:
    assert did_you_mean("fairscle", ["fairscale", "fsdp2", "ddp"]) == "; did you mean 'fairscale'?"
    assert did_you_mean("zzz", ["fairscale", "fsdp2"]) == ""
    assert did_you_mean("fsdp", ["fsdp1", "fsdp2"], n=2) == "; did you mean 'fsdp2', 'fsdp1'?"


@pytest.mark.parametrize("value", [None, 1, 500, 0.1, 0.999])
def test_document_limit_accepts_counts_and_fractions_below_one(value: Any) -> None:
    assert document_limit("limit", value) == value


@pytest.mark.parametrize("value", [0, -2, 0.0, 1.0, 2.5, -0.5, True, "0.5"])
def test_document_limit_refuses_the_rest(value: Any) -> None:
    assert refusal(document_limit, "limit", value) == (
        "limit must be a number of documents (1, 2, ...), a fraction of each task's documents "
        f"between 0 and 1 (0.1), or null; got {value!r}"
    )


@pytest.mark.parametrize("value", [1, 7])
def test_positive_int_accepts_positive_integers(value: int) -> None:
    assert positive_int("steps", value) == value


@pytest.mark.parametrize("value", [0, -3, 1.0, "2", True, None])
def test_positive_int_refuses_the_rest(value: Any) -> None:
    assert refusal(positive_int, "steps", value) == (
        f"steps must be a positive integer, got {value!r}"
    )


def test_optional_checks_take_none_and_say_so_when_refusing() -> None:
    assert positive_int("every", None, optional=True) is None
    assert refusal(positive_int, "every", 0, optional=True) == (
        "every must be a positive integer or null, got 0"
    )
    assert positive_number("norm", None, optional=True) is None
    assert "or null" in refusal(positive_number, "norm", -1, optional=True)
    assert text("name", None, optional=True) is None
    assert refusal(text, "name", 3, optional=True) == "name must be a text or null, got 3"
    assert refusal(text, "name", None) == "name must be a text, got None"


def test_non_negative_int_takes_zero() -> None:
    assert non_negative_int("warmup", 0) == 0
    assert refusal(non_negative_int, "warmup", -1) == (
        "warmup must be 0 or a positive integer, got -1"
    )
    assert "got False" in refusal(non_negative_int, "warmup", False)


def test_positive_ints_names_the_first_bad_field() -> None:
    positive_ints({"a": 1, "b": 2})
    assert refusal(positive_ints, {"a": 1, "b": 0, "c": -1}).startswith("b must be")


@pytest.mark.parametrize("value", [0.5, 3])
def test_positive_number_accepts_ints_and_floats(value: float) -> None:
    assert positive_number("lr", value) == value


@pytest.mark.parametrize("value", [0, -0.1, float("nan"), True, "1"])
def test_positive_number_refuses_zero_nan_bools_and_text(value: Any) -> None:
    assert refusal(positive_number, "lr", value).startswith("lr must be a positive number, got")


def test_boolean_refuses_truthy_values() -> None:
    assert boolean("flag", False) is False
    assert refusal(boolean, "flag", 1) == "flag must be true or false, got 1"
    assert refusal(boolean, "flag", "true") == "flag must be true or false, got 'true'"


def test_one_of_lists_the_choices_and_the_closest() -> None:
    assert one_of("signal", "SIGTERM", ("SIGTERM", "SIGINT")) == "SIGTERM"
    assert refusal(one_of, "signal", "SIGTREM", ("SIGTERM", "SIGINT")) == (
        "unknown signal 'SIGTREM'; did you mean 'SIGTERM'?; choose one of SIGTERM, SIGINT"
    )
    assert refusal(one_of, "signal", 9, ("SIGTERM",)) == ("unknown signal 9; choose one of SIGTERM")


def test_split_of_names_the_missing_or_empty_split() -> None:
    dataset = DatasetDict(splits={"train": [1, 2], "validation": []})
    split_of(dataset, "train")
    assert refusal(split_of, dataset, "test", role="eval_split") == (
        "eval_split 'test' is not in the dataset; choose one of ['train', 'validation']"
    )
    assert refusal(split_of, dataset, "validation") == (
        "split 'validation' holds no examples; give it examples (check 'limit')"
    )
    assert refusal(split_of, dataset, "validation", role="val", optional=True).endswith(
        ", or set val to null"
    )
