"""PIQA (Bisk et al., AAAI 2020) read from the official release files.

The release (https://yonatanbisk.com/piqa/data/) has five files, listed in :data:`PIQA_FILES`:
``train.jsonl`` + ``train-labels.lst``, ``valid.jsonl`` + ``valid-labels.lst`` and the unlabeled
``tests.jsonl``. Each ``.jsonl`` line is ``{"goal": ..., "sol1": ..., "sol2": ...}``; each
``.lst`` line is ``0`` (``sol1`` is correct) or ``1`` (``sol2``), aligned with the ``.jsonl`` lines.

:func:`read_piqa` turns a directory holding them into a ``DatasetDict`` with splits ``train``,
``validation`` and ``test``, each a list of ``{"goal", "sol1", "sol2", "label"}`` dicts (``label``
is -1 for the test split). Strings are kept exactly as in the files (some have trailing or double
spaces; lm-eval scores the raw strings). Malformed files raise :class:`PiqaFormatError` with a
one-line message naming the file and, where it applies, the 1-based line number: bytes that are not
UTF-8, JSON that is malformed or not an object, a missing or non-string field, a string holding an
unpaired surrogate escape (``"\\ud800"``: valid JSON, but no tokenizer can encode it), a label
other than ``0``/``1``, a blank line before the end, a ``.jsonl`` file with no examples, labels
not aligned with the examples, and any line longer than :data:`MAX_LINE_BYTES` (100 kB; the
longest official line is 4,467 bytes): a 10 MB line is refused at once rather than tokenized for
seconds and then cut to the model's context. Texts longer than the model's context are accepted
and left-truncated when tokenized, as lm-eval does (:mod:`tango_fairscale.data.queries`).
"""

import hashlib
import http.client
import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TypedDict

from cached_path import get_cache_dir
from tango import Step
from tango.common.dataset_dict import DatasetDict
from tango.common.det_hash import CustomDetHash

from .. import compat  # noqa: F401  (Tango fixes)
from ..checks import one_line, positive_int
from ..records.fingerprint import local_fingerprint
from .format import DatasetDictFormat

PIQA_URL = "https://yonatanbisk.com/piqa/data/"
"""Where the official release files are downloaded from when no ``data_dir`` is given."""

SPLIT_FILES: dict[str, tuple[str, str | None]] = {
    "train": ("train.jsonl", "train-labels.lst"),
    "validation": ("valid.jsonl", "valid-labels.lst"),
    "test": ("tests.jsonl", None),
}
"""Split name -> (examples file, labels file or ``None`` for the unlabeled test split)."""

PIQA_FILES: tuple[str, ...] = (
    "train.jsonl",
    "train-labels.lst",
    "valid.jsonl",
    "valid-labels.lst",
    "tests.jsonl",
)
"""The five files of the official release that a PIQA data directory must hold."""

PIQA_SHA256: dict[str, str] = {
    "train.jsonl": "f805f9c96518d7b59f2f870d90f712457cda949979469d9fa3fd706ce22e0a1a",
    "train-labels.lst": "df8ae080c41f02f88e81f6932d425f4b7ee72f433ad552e6a30d45e358e8f8bb",
    "valid.jsonl": "93503cc97c679e459b065c3d13e848282e44b2a25213985bed3e5d458abef72d",
    "valid-labels.lst": "b4192dc3a2a0363d9d60ccf79800cbbe2f32ebb17726efdde6970e0b8131bceb",
    "tests.jsonl": "402f1e2e61347db773e6e5e0a6b24f97396b59f6fd046dcdcbc12f483ac8553b",
}
"""SHA-256 of the official files (unchanged upstream since 2019); downloads are checked."""

DOWNLOAD_TIMEOUT_S = 10.0
"""Socket timeout for each download, so an offline machine fails fast."""

MAX_LINE_BYTES = 100_000
"""Longest line accepted in a PIQA file (the official files' longest is 4,467 bytes)."""

TEXT_KEYS = ("goal", "sol1", "sol2")
TEST_LABEL = -1


class PiqaExample(TypedDict):
    goal: str
    sol1: str
    sol2: str
    label: int


class PiqaFormatError(ValueError):
    """A PIQA file is missing or malformed. The message is one line naming the file (and line)."""


class PiqaDownloadError(ConnectionError):
    """The official PIQA files could not be downloaded. The message is one line."""


# Reading ------------------------------------------------------------------------------------


def read_piqa(data_dir: Path, limit: int | None = None) -> DatasetDict:
    """Read the official PIQA files in ``data_dir`` (see :data:`PIQA_FILES`).

    Returns ``DatasetDict(splits={"train": [...], "validation": [...], "test": [...]})``, each
    split a list of ``{"goal": str, "sol1": str, "sol2": str, "label": int}`` (label 0 means
    ``sol1`` is correct, 1 ``sol2``, -1 for the unlabeled test split), strings verbatim.
    ``limit`` keeps the first ``limit`` examples of each split; the whole files are still checked.

    Raises ``ConfigurationError`` for a bad ``limit`` and :class:`PiqaFormatError` for missing or
    malformed files, both with one-line messages.
    """
    positive_int("limit", limit, optional=True)
    data_dir = Path(data_dir)
    check_files_present(data_dir)
    splits = {
        split: read_split(data_dir / examples_file, data_dir / labels_file if labels_file else None)
        for split, (examples_file, labels_file) in SPLIT_FILES.items()
    }
    if limit is not None:
        splits = {split: examples[:limit] for split, examples in splits.items()}
    return DatasetDict(splits=splits)


def holds_release(directory: Path) -> bool:
    """Whether ``directory`` holds PIQA's official release (its labels file
    ``valid-labels.lst``, which no ``<split>.jsonl`` layout has): :func:`read_piqa` reads it."""
    return (Path(directory).expanduser() / "valid-labels.lst").is_file()


def check_files_present(data_dir: Path) -> None:
    """Raise :class:`PiqaFormatError` unless ``data_dir`` holds all of :data:`PIQA_FILES`."""
    missing = [name for name in PIQA_FILES if not (data_dir / name).is_file()]
    if missing:
        raise PiqaFormatError(
            f"PIQA data directory {data_dir} is missing {', '.join(missing)}; it must hold the "
            f"official PIQA files {', '.join(PIQA_FILES)} (from {PIQA_URL})"
        )


def read_split(examples_path: Path, labels_path: Path | None) -> list[PiqaExample]:
    """One split: examples joined line by line with their labels (-1 when there is no file)."""
    examples = read_examples(examples_path)
    if not examples:
        raise PiqaFormatError(
            f"{examples_path} holds no examples; it must hold one JSON object per line"
        )
    if labels_path is None:
        return [make_example(fields, TEST_LABEL) for fields in examples]
    labels = read_labels(labels_path)
    if len(labels) != len(examples):
        raise PiqaFormatError(
            f"{labels_path} has {len(labels)} labels but {examples_path} has {len(examples)} "
            "examples; the files must be aligned line by line"
        )
    return [make_example(fields, label) for fields, label in zip(examples, labels, strict=True)]


def make_example(fields: dict[str, str], label: int) -> PiqaExample:
    return {"goal": fields["goal"], "sol1": fields["sol1"], "sol2": fields["sol2"], "label": label}


def read_examples(path: Path) -> list[dict[str, str]]:
    """Parse a ``.jsonl`` file into ``{"goal", "sol1", "sol2"}`` dicts."""
    return [parse_example(text, path, number) for number, text in read_lines(path)]


def read_labels(path: Path) -> list[int]:
    """Parse a ``.lst`` file of ``0``/``1`` labels."""
    return [parse_label(text, path, number) for number, text in read_lines(path)]


def read_lines(path: Path) -> list[tuple[int, str]]:
    """``(1-based line number, text)`` for each line; blank lines are allowed only at the end."""
    raw_lines = path.read_bytes().splitlines()
    while raw_lines and not raw_lines[-1].strip():
        raw_lines.pop()
    return [(number, decode_line(raw, path, number)) for number, raw in enumerate(raw_lines, 1)]


def decode_line(raw: bytes, path: Path, number: int) -> str:
    """Decode one line as UTF-8, rejecting overlong lines, undecodable bytes and blank lines."""
    if len(raw) > MAX_LINE_BYTES:
        raise PiqaFormatError(
            f"{path}:{number}: line is {len(raw):,} bytes, longer than the {MAX_LINE_BYTES:,} "
            "accepted (official PIQA lines are under 5,000); is this a PIQA file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise PiqaFormatError(
            f"{path}:{number}: not valid UTF-8 (byte {raw[err.start]:#04x} at column "
            f"{err.start + 1})"
        ) from None
    if not text.strip():
        raise PiqaFormatError(f"{path}:{number}: blank line before the end of the file")
    return text


def parse_example(text: str, path: Path, number: int) -> dict[str, str]:
    """Parse one ``.jsonl`` line; the three text fields must be present and be strings."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise PiqaFormatError(
            f"{path}:{number}: malformed JSON ({err.msg} at column {err.colno})"
        ) from None
    if not isinstance(obj, dict):
        raise PiqaFormatError(f"{path}:{number}: expected a JSON object, got {type(obj).__name__}")
    for key in TEXT_KEYS:
        if key not in obj:
            raise PiqaFormatError(f"{path}:{number}: missing key {key!r}")
        if not isinstance(obj[key], str):
            raise PiqaFormatError(
                f"{path}:{number}: value of {key!r} must be a string, got "
                f"{type(obj[key]).__name__} {short_repr(obj[key])}"
            )
        try:
            obj[key].encode("utf-8")
        except UnicodeEncodeError as err:
            raise PiqaFormatError(
                f"{path}:{number}: value of {key!r} holds an unpaired surrogate escape "
                f"(\\u{ord(obj[key][err.start]):04x}), which is not text; remove it"
            ) from None
    return {key: obj[key] for key in TEXT_KEYS}


def parse_label(text: str, path: Path, number: int) -> int:
    """Parse one ``.lst`` line: ``0`` or ``1`` (surrounding whitespace ignored)."""
    if text.strip() not in ("0", "1"):
        raise PiqaFormatError(f"{path}:{number}: label must be 0 or 1, got {short_repr(text)}")
    return int(text)


def short_repr(value: object, width: int = 60) -> str:
    """``repr`` cut to ``width`` characters (``repr`` escapes newlines, so it is one line)."""
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# Downloading --------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """Where downloaded files are kept: ``<cached_path cache>/tango_fairscale-piqa``."""
    return Path(get_cache_dir()) / "tango_fairscale-piqa"


def download_piqa(cache_dir: Path | None = None) -> Path:
    """Download the files of :data:`PIQA_FILES` missing from ``cache_dir``; return the directory.

    Each file is checked against :data:`PIQA_SHA256` before it is stored, so a failed or partial
    download never lands in the cache. Raises :class:`PiqaDownloadError` (one line) when the
    server cannot be reached or sends something else.
    """
    cache_dir = cache_dir or default_cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    for name in PIQA_FILES:
        path = cache_dir / name
        if not path.is_file():
            store(fetch(PIQA_URL + name), name, path)
    return cache_dir


def fetch(url: str) -> bytes:
    """The body of ``url``, or :class:`PiqaDownloadError` saying how to run offline."""
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
            return response.read()
    except (OSError, http.client.HTTPException) as err:  # URLError and timeouts are OSErrors
        reason = err.reason if isinstance(err, urllib.error.URLError) else err
        raise PiqaDownloadError(
            f"cannot reach {url}: {one_line(str(reason) or type(reason).__name__)}; "
            "pass data_dir=<directory with the official PIQA files> to run offline"
        ) from None


def store(body: bytes, name: str, path: Path) -> None:
    """Write a downloaded file atomically after checking its SHA-256."""
    digest = hashlib.sha256(body).hexdigest()
    if digest != PIQA_SHA256[name]:
        raise PiqaDownloadError(
            f"downloaded {PIQA_URL + name} has sha256 {digest}, expected {PIQA_SHA256[name]}; "
            "pass data_dir=<directory with the official PIQA files> to run offline"
        )
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(body)
    os.replace(partial, path)


# Step ---------------------------------------------------------------------------------------


class PiqaDirectory(str, CustomDetHash):
    """A PIQA ``data_dir`` (a ``str``) whose Tango hash is its path and the fingerprint of the
    files in it that :func:`read_piqa` reads (:data:`PIQA_FILES`), taken when it is hashed."""

    def det_hash_object(self) -> Any:
        directory = Path(self).expanduser()
        return (str(self), local_fingerprint([directory / name for name in PIQA_FILES]))


@Step.register("tango_fairscale::piqa")
class PiqaDataStep(Step[DatasetDict]):
    """The PIQA splits ``train`` / ``validation`` / ``test`` as lists of example dicts.

    Registered as a Step under the name "tango_fairscale::piqa".

    Each example is ``{"goal": str, "sol1": str, "sol2": str, "label": int}`` with label 0 when
    ``sol1`` is correct, 1 when ``sol2`` is, -1 throughout the unlabeled test split; strings are
    verbatim. ``data_dir`` is a directory holding the five official files (:data:`PIQA_FILES`);
    without it they are downloaded from :data:`PIQA_URL` into a cache directory. ``limit`` keeps
    the first ``limit`` examples of each split.

    Its cache key holds the fingerprint of the five files in ``data_dir`` (by content): files
    changed in place are read again. The result is stored as JSON
    (:class:`~tango_fairscale.tasks.format.DatasetDictFormat`), never pickled.

    .. code-block:: jsonnet

        steps: {
          piqa: { type: "tango_fairscale::piqa", data_dir: "/data/piqa", limit: 100 },
        }
    """

    VERSION = "002"
    DETERMINISTIC = True
    CACHEABLE = True
    FORMAT = DatasetDictFormat()

    @classmethod
    def massage_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``data_dir`` hashes as its path and its files (:class:`PiqaDirectory`)."""
        data_dir = kwargs.get("data_dir")
        if isinstance(data_dir, str) and data_dir and not isinstance(data_dir, PiqaDirectory):
            kwargs = {**kwargs, "data_dir": PiqaDirectory(data_dir)}
        return kwargs

    def run(  # type: ignore[override]
        self, data_dir: str | None = None, limit: int | None = None
    ) -> DatasetDict:
        positive_int("limit", limit, optional=True)
        directory = Path(data_dir).expanduser() if data_dir else download_piqa()
        return read_piqa(directory, limit)
