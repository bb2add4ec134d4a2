"""Hostile pickles for the unpickler tests: each names one global and calls it with a shell
command that would create a marker file, so a test proves both that the global was refused and
that nothing ran."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator
from pathlib import Path

#: Globals that run code when called, whatever an allow-list's modules are.
DANGEROUS = [
    ("builtins", "eval"),
    ("builtins", "exec"),
    ("builtins", "getattr"),
    ("builtins", "__import__"),
    ("builtins", "open"),
    ("builtins", "compile"),
    ("os", "system"),
    ("os", "popen"),
    ("os", "execv"),
    ("posix", "system"),
    ("subprocess", "Popen"),
    ("subprocess", "run"),
    ("subprocess", "check_output"),
    ("importlib", "import_module"),
    ("pickle", "loads"),
]

#: Attribute walks that protocol 4's ``STACK_GLOBAL`` resolves under any importable module.
DOTTED = [
    "os.system",
    "os.popen",
    "subprocess.Popen",
    "sys.modules",
    "builtins.eval",
    "__builtins__.eval",
]


def hostile_globals(allowed: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Every global a hostile pickle might name against an allow-list of ``(module, name)``
    pairs: each public name of each allowed module that the list does not hold, dotted names
    under each allowed module and each allowed name, and :data:`DANGEROUS`."""
    allowed = set(allowed)
    modules = sorted({module for module, _ in allowed})
    for module in modules:
        for name in sorted(dir(importlib.import_module(module))):
            if not name.startswith("__") and (module, name) not in allowed:
                yield module, name
        for dotted in DOTTED:
            yield module, dotted
    for module, name in sorted(allowed):
        yield module, f"{name}.__init__.__globals__"
        yield module, f"{name}.__class__"
    yield from DANGEROUS


def _text(value: str) -> bytes:
    data = value.encode()
    if len(data) < 256:
        return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def calling_pickle(module: str, name: str, marker: Path, protocol: int = 4) -> bytes:
    """A pickle that resolves ``module``/``name`` and calls it with ``touch MARKER``: through
    ``STACK_GLOBAL`` (protocol 4, dotted names walk attributes) or ``GLOBAL`` (protocol 2)."""
    command = f"touch {marker}"
    if protocol >= 4:
        resolve = _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL
        return b"\x80\x04" + resolve + _text(command) + b"\x85R."  # TUPLE1, REDUCE, STOP
    resolve = b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL
    return b"\x80\x02" + resolve + _text(command) + b"\x85R."


def plant_byte_entry(directory: Path, key: str, data: bytes) -> None:
    """Point ``key``'s entry of the DCP checkpoint in ``directory`` at ``data`` (appended to its
    file), as someone handing over a doctored checkpoint would."""
    metadata_file = directory / ".metadata"
    import pickle

    from tango_fairscale.parallel.safe_load import read_dcp_metadata

    metadata = read_dcp_metadata(metadata_file.read_bytes())
    index = next(i for i in metadata.storage_data if i.fqn == key)
    info = metadata.storage_data[index]
    target = directory / info.relative_path
    offset = target.stat().st_size
    with target.open("ab") as file:
        file.write(data)
    info.offset, info.length = offset, len(data)
    metadata_file.write_bytes(pickle.dumps(metadata))
