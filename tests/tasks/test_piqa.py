"""The PIQA data step and reader of the official files (``tango_fairscale.tasks.piqa``)."""

import functools
import json
import socket
import threading
import urllib.error
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import GOOD_FILES, line, make_piqa_dir
from tango import Step
from tango.common.exceptions import ConfigurationError

from tango_fairscale.tasks import piqa as data
from tango_fairscale.tasks.piqa import (
    PIQA_FILES,
    PiqaDataStep,
    PiqaDownloadError,
    PiqaFormatError,
    download_piqa,
    read_piqa,
)

OFFLINE_HINT = "pass data_dir=<directory with the official PIQA files> to run offline"


def assert_one_line_naming(err: Exception, path: Path, line_number: int | None = None) -> None:
    message = str(err)
    assert "\n" not in message
    assert str(path) in message
    if line_number is not None:
        assert f"{path}:{line_number}:" in message


# Real data ---------------------------------------------------------------------------------


def test_real_piqa_files(piqa_dir: Path) -> None:
    piqa = read_piqa(piqa_dir)
    assert {split: len(examples) for split, examples in piqa.items()} == {
        "train": 16113,
        "validation": 1838,
        "test": 3084,
    }
    first, second = piqa["validation"][:2]
    assert first["goal"] == "How do I ready a guinea pig cage for it's new occupants?"
    assert first["label"] == 0
    assert second == {
        "goal": "dresser",
        "sol1": "replace drawer with bobby pin ",
        "sol2": "finish, woodgrain with  bobby pin ",
        "label": 1,
    }
    labels = [example["label"] for example in piqa["validation"]]
    assert (labels.count(0), labels.count(1)) == (910, 928)
    assert {example["label"] for example in piqa["train"]} == {0, 1}
    assert {example["label"] for example in piqa["test"]} == {-1}
    assert piqa["test"][0]["goal"] == "how do you puncture a vein?"


# Fixture files: good input -----------------------------------------------------------------


def test_splits_labels_and_verbatim_strings(tmp_path: Path) -> None:
    odd = {"goal": "  two  spaces ", "sol1": "caf\u00e9 ", "sol2": 'quote " and \\ tab\t'}
    piqa_dir = make_piqa_dir(
        tmp_path, {"valid.jsonl": json.dumps(odd) + "\n", "valid-labels.lst": "1\n"}
    )
    piqa = read_piqa(piqa_dir)
    assert list(piqa.keys()) == ["train", "validation", "test"]
    assert all(type(examples) is list for examples in piqa.values())
    assert piqa["validation"] == [{**odd, "label": 1}]
    assert [example["label"] for example in piqa["train"]] == [1, 0, 1]
    assert piqa["test"] == [
        {"goal": f"test {i}", "sol1": "a", "sol2": "b", "label": -1} for i in range(3)
    ]


def test_trailing_blank_lines_and_missing_final_newline_are_fine(tmp_path: Path) -> None:
    overrides = {
        "train-labels.lst": "1\n0\n1\n\n\n",
        "tests.jsonl": GOOD_FILES["tests.jsonl"].rstrip(),
    }
    piqa_dir = make_piqa_dir(tmp_path, overrides)
    piqa = read_piqa(piqa_dir)
    assert len(piqa["train"]) == 3 and len(piqa["test"]) == 3


def test_limit_keeps_first_examples_of_each_split(tmp_path: Path) -> None:
    piqa = read_piqa(make_piqa_dir(tmp_path), limit=2)
    assert [example["goal"] for example in piqa["train"]] == ["train 0", "train 1"]
    assert [example["goal"] for example in piqa["validation"]] == ["valid 0", "valid 1"]
    assert [example["goal"] for example in piqa["test"]] == ["test 0", "test 1"]
    assert len(read_piqa(tmp_path, limit=100)["train"]) == 3


def test_limit_still_checks_whole_files(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path, {"train-labels.lst": "1\n0\nx\n"})
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir, limit=1)
    assert_one_line_naming(err.value, piqa_dir / "train-labels.lst", 3)


@pytest.mark.parametrize("limit", [0, -3, True, 2.0, "5"])
def test_bad_limit_is_a_configuration_error(tmp_path: Path, limit: Any) -> None:
    with pytest.raises(ConfigurationError) as err:
        read_piqa(tmp_path / "does-not-matter", limit=limit)
    assert "\n" not in str(err.value)
    assert f"limit must be a positive integer or null, got {limit!r}" in str(err.value)


# Fixture files: bad input ------------------------------------------------------------------


BAD_FILES = [
    pytest.param(
        "valid.jsonl",
        line("v0") + "\n" + '{"goal": "v1", "sol1": "a"\n' + line("v2") + "\n",
        2,
        "malformed JSON",
        id="malformed-json",
    ),
    pytest.param(
        "train.jsonl",
        line("t0") + "\n" + line("t1") + "\n" + '{"goal": "t2", "sol1": "a"}\n',
        3,
        "missing key 'sol2'",
        id="missing-key",
    ),
    pytest.param(
        "tests.jsonl",
        '{"goal": 7, "sol1": "a", "sol2": "b"}\n' + line("x") + "\n" + line("y") + "\n",
        1,
        "value of 'goal' must be a string, got int 7",
        id="int-value",
    ),
    pytest.param(
        "valid.jsonl",
        line("v0") + "\n" + '{"goal": "v1", "sol1": null, "sol2": "b"}\n' + line("v2") + "\n",
        2,
        "value of 'sol1' must be a string, got NoneType None",
        id="null-value",
    ),
    pytest.param(
        "train.jsonl",
        '["t0", "a", "b"]\n' + line("t1") + "\n" + line("t2") + "\n",
        1,
        "expected a JSON object, got list",
        id="not-an-object",
    ),
    pytest.param("train-labels.lst", "1\n2\n0\n", 2, "label must be 0 or 1, got '2'", id="label-2"),
    pytest.param(
        "valid-labels.lst", "0\n1\nyes\n", 3, "label must be 0 or 1, got 'yes'", id="label-word"
    ),
    pytest.param(
        "valid-labels.lst", "0\n\n1\n0\n", 2, "blank line before the end", id="blank-line-labels"
    ),
    pytest.param(
        "tests.jsonl",
        line("x") + "\n\n" + line("y") + "\n",
        2,
        "blank line before the end",
        id="blank-line-jsonl",
    ),
    pytest.param(
        "tests.jsonl",
        (line("x") + "\n").encode() + b'{"goal": "caf\xe9", "sol1": "a", "sol2": "b"}\n',
        2,
        "not valid UTF-8 (byte 0xe9 at column 14)",
        id="non-utf8",
    ),
]


@pytest.mark.parametrize("name, content, line_number, problem", BAD_FILES)
def test_bad_file_gives_one_line_error_with_file_and_line(
    tmp_path: Path, name: str, content: str | bytes, line_number: int, problem: str
) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    path = piqa_dir / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    assert isinstance(err.value, ValueError)
    assert_one_line_naming(err.value, path, line_number)
    assert problem in str(err.value)


@pytest.mark.parametrize(
    "labels_name, labels, examples_name",
    [
        ("valid-labels.lst", "0\n1\n", "valid.jsonl"),
        ("train-labels.lst", "0\n1\n1\n0\n", "train.jsonl"),
    ],
)
def test_label_count_mismatch_gives_both_counts(
    tmp_path: Path, labels_name: str, labels: str, examples_name: str
) -> None:
    piqa_dir = make_piqa_dir(tmp_path)
    (piqa_dir / labels_name).write_text(labels)
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    n_labels = labels.count("\n")
    assert_one_line_naming(err.value, piqa_dir / labels_name)
    assert (
        f"{piqa_dir / labels_name} has {n_labels} labels but {piqa_dir / examples_name} has 3 "
        "examples" in str(err.value)
    )


def test_missing_file_names_it_and_the_files_needed(tmp_path: Path) -> None:
    piqa_dir = make_piqa_dir(tmp_path, {"tests.jsonl": None, "valid-labels.lst": None})
    with pytest.raises(PiqaFormatError) as err:
        read_piqa(piqa_dir)
    message = str(err.value)
    assert "\n" not in message
    assert f"PIQA data directory {piqa_dir} is missing valid-labels.lst, tests.jsonl;" in message
    assert all(name in message.split(";", 1)[1] for name in PIQA_FILES)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(PiqaFormatError, match="is missing train.jsonl, train-labels.lst"):
        read_piqa(tmp_path / "nowhere")


# Through Tango -----------------------------------------------------------------------------


def test_step_through_tango(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tango 1.3.2 records the git commit and "origin" remote of the working directory and fails
    # in a repository that has neither; run from a directory outside any repository.
    monkeypatch.chdir(tmp_path)
    piqa_dir = make_piqa_dir(tmp_path / "piqa")
    result = PiqaDataStep(data_dir=str(piqa_dir), limit=2).result()
    assert [example["goal"] for example in result["validation"]] == ["valid 0", "valid 1"]
    assert result["test"][1]["label"] == -1

    step = Step.from_params({"type": "tango_fairscale::piqa", "data_dir": str(piqa_dir)})
    assert isinstance(step, PiqaDataStep)
    assert len(step.result()["train"]) == 3


def test_step_rejects_bad_limit(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        PiqaDataStep().run(data_dir=str(make_piqa_dir(tmp_path)), limit=0)


# Downloading -------------------------------------------------------------------------------


def test_download_failure_says_how_to_run_offline(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    timeouts = []

    def unreachable(url: str, timeout: float) -> Any:
        timeouts.append(timeout)
        raise urllib.error.URLError(OSError(101, "Network is unreachable"))

    monkeypatch.setattr(data.urllib.request, "urlopen", unreachable)
    monkeypatch.setattr(data, "default_cache_dir", lambda: tmp_path / "cache")
    with pytest.raises(PiqaDownloadError) as err:
        PiqaDataStep().run()
    assert str(err.value) == (
        "cannot reach https://yonatanbisk.com/piqa/data/train.jsonl: "
        f"[Errno 101] Network is unreachable; {OFFLINE_HINT}"
    )
    assert timeouts == [data.DOWNLOAD_TIMEOUT_S] and data.DOWNLOAD_TIMEOUT_S <= 10
    assert list((tmp_path / "cache").iterdir()) == []


def test_download_failure_with_a_real_refused_connection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setattr(data, "PIQA_URL", f"http://127.0.0.1:{port}/piqa/data/")
    with pytest.raises(PiqaDownloadError) as err:
        download_piqa(tmp_path)
    message = str(err.value)
    assert message.startswith(f"cannot reach http://127.0.0.1:{port}/piqa/data/train.jsonl: ")
    assert message.endswith(f"; {OFFLINE_HINT}")
    assert "\n" not in message


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``serve(directory)`` serves ``directory`` over local HTTP as :data:`data.PIQA_URL`."""
    servers: list[ThreadingHTTPServer] = []

    class QuietHandler(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    def start(directory: Path) -> ThreadingHTTPServer:
        handler = functools.partial(QuietHandler, directory=str(directory))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        monkeypatch.setattr(data, "PIQA_URL", f"http://127.0.0.1:{server.server_port}/")
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_download_then_read_from_cache(
    serve: Any, monkeypatch: pytest.MonkeyPatch, piqa_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setattr(data, "default_cache_dir", lambda: cache)
    server = serve(piqa_dir)
    result = PiqaDataStep(limit=3).run()
    assert sorted(path.name for path in cache.iterdir()) == sorted(PIQA_FILES)
    assert result["validation"][1]["goal"] == "dresser"

    server.shutdown()  # the cached files are used without the network
    assert len(PiqaDataStep().run(limit=None)["test"]) == 3084


def test_download_with_wrong_checksum_is_not_cached(serve: Any, tmp_path: Path) -> None:
    serve(make_piqa_dir(tmp_path / "server"))
    with pytest.raises(PiqaDownloadError) as err:
        download_piqa(tmp_path / "cache")
    assert "train.jsonl has sha256 " in str(err.value) and "\n" not in str(err.value)
    assert list((tmp_path / "cache").iterdir()) == []
