"""``tango-fairscale eval``'s arguments (``tango_fairscale.eval_arguments``): what cannot be right
is refused by the parser in one line (no usage block), lm_eval's own forms among them."""

from __future__ import annotations

import pytest

from tango_fairscale.cli import main


@pytest.mark.parametrize(
    ("option", "fragment"),
    [
        (["--limit", "1.5"], "--limit: must be a whole number of documents >= 0 or a fraction"),
        (["--limit", "-3"], "--limit: must be a whole number of documents >= 0 or a fraction"),
        (["--num_fewshot", "-1"], "argument --num_fewshot: must be a whole number >= 0"),
        (["--batch_size", "0"], "argument --batch_size: must be a positive whole number, auto"),
        (["--device_count", "0"], "argument --device_count: must be a whole number >= 1, got '0'"),
        (["--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
        (["--engine", "deepspeed"], "argument --engine: invalid choice: 'deepspeed'"),
        (["--batch_size", "auto:x"], "--batch_size: must be a positive whole number, auto or"),
        (["--device", "mps"], "argument --device: must be cuda, cuda:N or cpu, got 'mps'"),
        (["--dev", "cuda"], "unrecognized arguments: --dev cuda"),  # no abbreviations
        (["--fewshot_as_multiturn", "maybe"], "--fewshot_as_multiturn: must be true or false"),
        (["--seed", "1,2"], "--seed: one integer or a comma-separated list of 3 or 4, as lm_eval"),
        (["--seed", "0,1,2,None"], "--seed: the few-shot seed cannot be None here"),
        (["--seed", "0,x,2"], "--seed: integers or None, as lm_eval takes, got '0,x,2'"),
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


@pytest.mark.parametrize(
    ("seed", "fewshot_seed"), [("7", 7), ("0,1234,1234,99", 99), ("0,None,3", 1234), ("-1", -1)]
)
def test_the_fewshot_seed_is_lm_evals_fourth_seed(seed: str, fewshot_seed: int) -> None:
    import argparse

    from tango_fairscale import eval_arguments

    parser = argparse.ArgumentParser()
    eval_arguments.add_parser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--model", "m", "--tasks", "copa", "--seed", seed])
    assert args.seed == fewshot_seed
