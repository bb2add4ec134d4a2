"""How the package's steps store their results in the workspace: a data step's ``DatasetDict``, a
task's requests, its tokens and the JSON results of the evaluation steps — JSON files (and the
tokens' arrays in safetensors), read back as data only (no pickle, no class named by the file:
nothing read runs code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tango import Format
from tango.common.aliases import PathOrStr
from tango.common.dataset_dict import DatasetDict

from .. import compat  # noqa: F401  (Tango fixes)

DATA_FILE = "dataset_dict.json"
REQUESTS_FILE = "requests.json"
TOKENS_FILE = "tokens.json"
TOKEN_ARRAYS_FILE = "tokens.safetensors"
#: The arrays of a stored tokens result, with their element types.
TOKEN_ARRAYS = {"ids": "int32", "offsets": "int64", "context_lengths": "int32"}
#: Tango's ``JsonFormat`` file, which :class:`JsonDataFormat` writes and reads as data.
JSON_FILE = "data.json"


@Format.register("tango_fairscale::dataset_dict")
class DatasetDictFormat(Format[DatasetDict]):
    """Stores a Tango ``DatasetDict`` whose splits are lists of JSON values (dicts of strings and
    numbers, ...) as ``{"splits": {name: [...]}, "metadata": {...}}`` in ``dataset_dict.json``.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::dataset_dict"``. Reading
    builds lists, dicts, strings and numbers, and a ``DatasetDict`` of them; a file of another
    shape raises a one-line ``ValueError`` naming it.
    """

    VERSION = "001"

    def write(self, artifact: DatasetDict, dir: PathOrStr) -> None:
        stored = {
            "splits": {name: list(split) for name, split in artifact.splits.items()},
            "metadata": dict(artifact.metadata),
        }
        # json.dumps: C's encoder in one pass (json.dump encodes in Python); the same text.
        (Path(dir) / DATA_FILE).write_text(json.dumps(stored, allow_nan=False), encoding="utf-8")

    def read(self, dir: PathOrStr) -> DatasetDict:
        path = Path(dir) / DATA_FILE
        stored = _read_json(dir, DATA_FILE)
        splits = stored.get("splits") if isinstance(stored, dict) else None
        metadata = stored.get("metadata") if isinstance(stored, dict) else None
        if (
            not isinstance(splits, dict)
            or not all(isinstance(split, list) for split in splits.values())
            or not isinstance(metadata, dict)
        ):
            raise ValueError(
                f"{path} is not a stored DatasetDict ({{'splits': {{name: [...]}}, 'metadata': "
                f"{{...}}}}); delete {dir} to compute the step again"
            )
        return DatasetDict(splits=splits, metadata=metadata)


@Format.register("tango_fairscale::requests")
class RequestsFormat(Format[dict]):
    """Stores a ``tango_fairscale::task_requests`` result (a dict of JSON values) as
    ``requests.json``.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::requests"``. Reading builds
    lists, dicts, strings and numbers only (unlike Tango's ``JsonFormat``, no ``_dataclass`` key
    names a class to build); a file that is not such a dict with a ``format`` key raises a
    one-line ``ValueError`` naming it.
    """

    VERSION = "001"

    def write(self, artifact: dict, dir: PathOrStr) -> None:
        text = json.dumps(artifact, allow_nan=False, ensure_ascii=False)  # C's encoder
        (Path(dir) / REQUESTS_FILE).write_text(text, encoding="utf-8")

    def read(self, dir: PathOrStr) -> dict:
        path = Path(dir) / REQUESTS_FILE
        stored = _read_json(dir, REQUESTS_FILE)
        if not isinstance(stored, dict) or "format" not in stored:
            raise ValueError(
                f"{path} is not a stored task_requests result; delete {dir} to compute the step "
                "again"
            )
        return stored


@Format.register("tango_fairscale::tokens")
class TokensFormat(Format[dict]):
    """Stores a ``tango_fairscale::task_tokens`` result: its JSON values in ``tokens.json``, its
    1-D integer tensors (``TOKEN_ARRAYS``) in ``tokens.safetensors``.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::tokens"``. Reading builds
    plain data and tensors only; files of another shape raise a one-line ``ValueError`` naming
    them."""

    VERSION = "001"

    def write(self, artifact: dict, dir: PathOrStr) -> None:
        from safetensors.torch import save_file

        fields = {key: value for key, value in artifact.items() if key not in TOKEN_ARRAYS}
        (Path(dir) / TOKENS_FILE).write_text(json.dumps(fields, allow_nan=False), encoding="utf-8")
        arrays = {key: artifact[key].contiguous() for key in TOKEN_ARRAYS}
        save_file(arrays, str(Path(dir) / TOKEN_ARRAYS_FILE))

    def read(self, dir: PathOrStr) -> dict:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        fields = _read_json(dir, TOKENS_FILE)
        path = Path(dir) / TOKEN_ARRAYS_FILE
        try:
            arrays = load_file(str(path))
        except (OSError, SafetensorError) as error:
            raise ValueError(
                f"{path} cannot be read ({error}); delete {dir} to compute the step again"
            ) from None
        if (
            not isinstance(fields, dict)
            or "format" not in fields
            or sorted(arrays) != sorted(TOKEN_ARRAYS)
            or any(
                str(arrays[key].dtype) != f"torch.{kind}" or arrays[key].dim() != 1
                for key, kind in TOKEN_ARRAYS.items()
            )
        ):
            raise ValueError(
                f"{dir} does not hold a stored task_tokens result; delete it to compute the step "
                "again"
            )
        return fields | arrays


@Format.register("tango_fairscale::json")
class JsonDataFormat(Format[Any]):
    """Stores a JSON value (an evaluation step's results) as Tango's ``JsonFormat`` stores it
    uncompressed, in ``data.json``, and reads it back as data only.

    Registered as a Tango ``Format`` under the name ``"tango_fairscale::json"``. Tango's
    ``JsonFormat`` reads a ``{"_dataclass": [module, name], ...}`` entry by importing ``module``
    and calling ``name`` with the entry's other keys — ``["os", "system"]`` runs a command —, so a
    result file planted in a workspace ran code when a later step read it. Here such an entry
    stays a dict. A result stored by ``JsonFormat`` (the same file) reads the same way. NaN and
    infinities are written as ``JsonFormat`` writes them (lm-eval reports some metrics as NaN).
    """

    VERSION = "001"

    def write(self, artifact: Any, dir: PathOrStr) -> None:
        text = json.dumps(artifact, ensure_ascii=False)  # C's encoder (json.dump: Python's)
        (Path(dir) / JSON_FILE).write_text(text, encoding="utf-8")

    def read(self, dir: PathOrStr) -> Any:
        return _read_json(dir, JSON_FILE)


def _read_json(dir: PathOrStr, name: str) -> Any:
    """The JSON value of ``dir/name``, as plain data; a file that is not JSON raises a one-line
    ``ValueError`` naming it."""
    path = Path(dir) / name
    try:
        with path.open(encoding="utf-8") as file:
            return json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        reason = f"{type(error).__name__}: {error}"
        raise ValueError(
            f"{path} is not JSON ({reason}); delete {dir} to compute the step again"
        ) from None
