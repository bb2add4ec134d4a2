"""``tango-fairscale eval``'s arguments (``tango_fairscale.eval_arguments``): what cannot be right
is refused by the parser in one line (no usage block), lm_eval's own forms among them."""

from __future__ import annotations

import pytest

from tango_fairscale.cli import main


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--limit", "0.5"], "--limit: a number of documents, not a fraction of each task as in"),
        (["--limit", "-3"], "argument --limit: must be a whole number >= 0, got '-3'"),
        (["--num_fewshot", "-1"], "argument --num_fewshot: must be a whole number >= 0"),
        (["--batch_size", "0"], "argument --batch_size: must be a positive whole number, auto"),
        (["--device_count", "0"], "argument --device_count: must be a whole number >= 1, got '0'"),
        (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["--engine", "deepspeed"], "argument --engine: invalid choice: 'deepspeed'"),
        (["--batch_size", "auto:x"], "--batch_size: must be a positive whole number, auto or"),
        (["--device", "mps"], "argument --device: must be cuda, cuda:N or cpu, got 'mps'"),
        (["--dev", "cuda"], "unrecognized arguments: --dev cuda"),  # no abbreviations
        (["--fewshot_as_multiturn", "maybe"], "--fewshot_as_multiturn: must be true or false"),
    ],
)
def test_malformed_arguments_are_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str], option: list[str], fragment: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["eval", "--model", "m", "--tasks", "copa", *option])
    assert done.value.code == 2
    err = capsys.readouterr().err  # one line, no usage block (cli.OneLineErrors)
    assert err.count("\n") == 1 and fragment in err and "--help')" in err, err
