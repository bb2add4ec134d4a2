"""What a ``generate_until`` task asks of the model (``tasks/generation.py``): ``gen_kwargs`` read
as lm-eval's HF backend reads them, and the one-line refusals of what the package does not
decode (unknown keys, beam search, sampling at temperature 0, a window too small, code
execution)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tango.common.exceptions import ConfigurationError

from tango_fairscale.tasks.generation import (
    DEFAULT_MAX_GEN_TOKS,
    Decoding,
    check_generation_task,
    check_window,
    decoding_of,
    refuse_code_execution,
)


def refusal(check: Any, *args: Any) -> str:
    with pytest.raises(ConfigurationError) as error:
        check(*args)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_gen_kwargs_are_normalised_as_lm_eval_does() -> None:
    assert decoding_of("t", {}, 99) == Decoding(until=(), max_gen_toks=99)
    assert decoding_of("t", {"until": "Q:", "max_new_tokens": 5}, 99) == Decoding(("Q:",), 5)
    # max_gen_toks first of its aliases
    assert decoding_of("t", {"max_gen_toks": 3, "max_new_tokens": 7}, 99).max_gen_toks == 3
    assert decoding_of("t", {"max_tokens": 4}, 99).max_gen_toks == 4


def test_sampling_keeps_its_settings_and_greedy_drops_the_temperature() -> None:
    sampled = decoding_of("t", {"do_sample": True, "temperature": 0.7, "top_k": 5}, 9)
    assert (sampled.do_sample, sampled.temperature, sampled.top_k) == (True, 0.7, 5)
    greedy = decoding_of("t", {"do_sample": False, "temperature": 0.7}, 9)
    assert not greedy.do_sample and greedy.temperature == 0.0


@pytest.mark.parametrize(
    "gen_kwargs, message",
    [
        ([1], "task 't': gen_kwargs must be a mapping, got [1]"),
        (
            {"max_gen_tokens": 3},
            "task 't': unknown gen_kwargs key 'max_gen_tokens'; did you mean 'max_gen_toks'?; "
            "the package decodes with until, max_gen_toks",
        ),
        ({"num_beams": 4}, "task 't': num_beams 4: the package decodes greedily or samples"),
        ({"until": 3}, "task 't': until must be a text or a list, got 3"),
        ({"do_sample": True}, "task 't': do_sample with temperature None; sampling needs a"),
        ({"do_sample": True, "temperature": 0}, "task 't': do_sample with temperature 0;"),
    ],
)
def test_what_the_package_does_not_decode_is_refused(gen_kwargs: Any, message: str) -> None:
    assert refusal(decoding_of, "t", gen_kwargs, 9).startswith(message)


def test_num_beams_1_is_greedy_decoding() -> None:
    assert decoding_of("t", {"num_beams": 1}, 9) == Decoding((), 9)


def test_the_window_must_leave_room_for_a_prompt() -> None:
    check_window("t", Decoding((), 31), 32)
    assert refusal(check_window, "t", Decoding((), 32), 32).startswith(
        "task 't': max_gen_toks 32 is not below the model's window of 32 tokens"
    )


def test_tasks_running_generated_code_or_with_unknown_keys_are_refused() -> None:
    unsafe = {"unsafe_code": True, "output_type": "generate_until"}
    assert refusal(check_generation_task, "humaneval", None, unsafe).startswith(
        "task 'humaneval' runs the generated code (unsafe_code)"
    )
    bad_keys = {"output_type": "generate_until", "generation_kwargs": {"beams": 2}}
    assert "unknown gen_kwargs key 'beams'" in refusal(check_generation_task, "g", None, bad_keys)
    # Scoring tasks' generation_kwargs are never read; a config without output_type generates.
    check_generation_task("s", None, {**bad_keys, "output_type": "multiple_choice"})
    check_generation_task("s", None, {"output_type": "multiple_choice", "generation_kwargs": [1]})
    assert "unknown gen_kwargs" in refusal(
        check_generation_task, "g", None, {"generation_kwargs": {"beams": 2}}
    )
    check_generation_task("g", None, {"generation_kwargs": {"until": ["\n"]}})


def test_a_loaded_tasks_attributes_are_read() -> None:
    class Loaded:
        UNSAFE_CODE = False
        OUTPUT_TYPE = "generate_until"

        class config:  # noqa: N801 - lm-eval's attribute name
            generation_kwargs = {"num_beams": 2}

    assert "num_beams 2" in refusal(check_generation_task, "g", Loaded())
    Loaded.UNSAFE_CODE = True
    assert "unsafe_code" in refusal(check_generation_task, "g", Loaded())


def test_a_task_yaml_that_runs_code_is_refused_without_importing_it(tmp_path: Path) -> None:
    yaml_path = tmp_path / "coding.yaml"
    yaml_path.write_text(
        "task: coding\noutput_type: generate_until\nunsafe_code: true\n"
        "process_results: !function never_imported.score\n"
    )
    assert "runs the generated code" in refusal(refuse_code_execution, "coding", yaml_path)
    safe = tmp_path / "safe.yaml"
    safe.write_text("task: safe\noutput_type: generate_until\n")
    refuse_code_execution("safe", safe)
    refuse_code_execution("broken", tmp_path / "missing.yaml")  # its loader refuses it
    assert DEFAULT_MAX_GEN_TOKS == 256
