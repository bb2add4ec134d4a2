"""Checks a ``tango run`` command line before any work: every ``-D name`` is a variable the config
reads (else refused with the closest known name), a local workspace is writable, and every input
the steps read can be found (:mod:`tango_fairscale.inputs`: all missing ones in one message).

``tango run`` evaluates the config, then imports ``include_package`` (this package), then builds
the step graph and opens the workspace, so the package runs :func:`check_tango_run` at import
(see ``tango_fairscale/__init__.py``); the launcher runs it before its ``tango run``.

The variables a config reads are found statically, in the config and the files it imports:

* literal ``std.extVar('name')`` calls;
* literal arguments of helper functions that pass a parameter to ``std.extVar`` (``local
  int(name) = ... std.extVar(name) ...``, or an object's ``int(name):: ...``), however they are
  called (``int('x')``, ``variables.int('x')``).

Jsonnet cannot list the variables a config reads, and evaluating it once without each name would
miss the names read only on other paths (``precision`` when ``train_steps=0``). A config that also
reads variables by computed names (``std.extVar(prefix + name)``) may read any name: the names of
tango.yml's ``environment`` are then accepted too.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tango.common.exceptions import ConfigurationError

from .checks import did_you_mean

_EXT_VAR = re.compile(r"std\.extVar\(\s*([^()]*?)\s*\)")
_LITERAL = re.compile(r"""^(['"])([^'"]*)\1$""")
_HELPER = re.compile(r"(?:\blocal\s+|^\s*)(\w+)\s*\(([^()]*)\)\s*(?:=|:{1,3})", re.MULTILINE)
_IMPORT = re.compile(r"""\bimport(?:str|bin)?\s+(['"])([^'"]+)\1""")
# A string (kept) or a comment (dropped): "//" inside a string ('http://...') is no comment.
_STRING_OR_COMMENT = re.compile(
    r"""('(?:\\.|[^'\\])*'|"(?:\\.|[^"\\])*")|//[^\n]*|#[^\n]*|/\*.*?\*/""", re.DOTALL
)


@dataclass
class TangoRun:
    """What a ``tango run`` command line names."""

    experiment: str
    ext_vars: list[str]
    workspace: str | None
    settings: str | None
    overrides: str | None = None
    step_names: list[str] | None = None


def check_tango_run(argv: Sequence[str]) -> None:
    """Refuse (one line) ``tango ARGV`` when it is ``run`` with a ``-D`` name its config does not
    read, a local workspace that is not writable, or inputs that cannot be found; anything else
    passes."""
    run = parse_tango_run(argv)
    if run is None:
        return
    check_ext_vars(run)
    check_workspace_writable(run.workspace)
    check_run_inputs(run)


def parse_tango_run(argv: Sequence[str]) -> TangoRun | None:
    """``argv`` (without the program) parsed by Tango's own ``click`` command, when it is a
    ``run`` of a Jsonnet config (by the user, not by Tango's executor)."""
    import click
    from tango.__main__ import main as tango_command

    try:
        context = tango_command.make_context("tango", list(argv), resilient_parsing=True)
        # click < 8.2 keeps the subcommand's name in ``protected_args``; later ones in
        # ``_protected_args`` (reading ``protected_args`` there warns).
        attributes = vars(context)
        protected = attributes.get("_protected_args", attributes.get("protected_args", []))
        rest = [*protected, *context.args]
        if not rest or rest[0] != "run" or context.params.get("called_by_executor"):
            return None
        command = tango_command.get_command(context, "run")
        assert command is not None
        run = command.make_context("run", rest[1:], parent=context, resilient_parsing=True)
    except click.ClickException:
        return None  # Tango itself says what is wrong
    experiment = run.params.get("experiment")
    if not experiment or not str(experiment).endswith((".jsonnet", ".libsonnet")):
        return None
    workspace = run.params.get("workspace") or run.params.get("workspace_dir")
    settings = context.params.get("settings")
    if workspace is None:
        workspace = _settings_workspace(settings)
    return TangoRun(
        str(experiment),
        list(run.params.get("ext_var") or ()),
        workspace,
        settings,
        run.params.get("overrides"),
        list(run.params.get("step_names") or ()),
    )


def check_ext_vars(run: TangoRun) -> None:
    known, dynamic = config_variables(Path(run.experiment))
    if dynamic:
        known |= _settings_environment(run.settings)
    for item in run.ext_vars:
        name = item.split("=", 1)[0]
        if name not in known:
            raise ConfigurationError(
                f"-D {name} is not a variable of {run.experiment}"
                f"{did_you_mean(name, sorted(known))} (it reads {', '.join(sorted(known))})"
            )


def check_run_inputs(run: TangoRun) -> None:
    """:func:`~tango_fairscale.inputs.check_inputs` on the config as ``tango run`` reads it (a
    config that does not evaluate here is left to Tango)."""
    from tango.common import Params

    from .inputs import check_inputs

    ext_vars = dict(item.split("=", 1) for item in run.ext_vars if "=" in item)
    try:
        params = Params.from_file(run.experiment, run.overrides or "", ext_vars).as_dict()
    except Exception:  # noqa: BLE001  (Tango reports it in its own words)
        return
    steps = params.get("steps")
    if isinstance(steps, dict):
        check_inputs(steps, run.step_names or None)


def config_variables(config: Path) -> tuple[set[str], bool]:
    """The external variables ``config`` and the files it imports read (see the module
    docstring), and whether any is read by a computed name."""
    texts = _config_texts(config.resolve(), {})
    helpers: dict[str, int] = {}  # helper name: index of its parameter passed to std.extVar
    names: set[str] = set()
    dynamic = False
    for text in texts.values():
        found, parameters = _helpers(text)
        helpers.update(found)
        for argument in _EXT_VAR.findall(text):
            literal = _LITERAL.match(argument)
            if literal:
                names.add(literal.group(2))
            elif argument not in parameters:
                dynamic = True
    for text in texts.values():
        for helper, index in helpers.items():
            for match in re.finditer(rf"(?<![\w$]){helper}\s*\(", text):
                arguments = _arguments(text, match.end())
                if index < len(arguments):
                    literal = _LITERAL.match(arguments[index])
                    if literal:
                        names.add(literal.group(2))
    return names, dynamic


def _config_texts(path: Path, texts: dict[Path, str]) -> dict[Path, str]:
    """``path``'s text without comments, and those of everything it imports, by path."""
    if path in texts or not path.is_file():
        return texts
    text = path.read_text(errors="replace")
    texts[path] = _STRING_OR_COMMENT.sub(lambda match: match.group(1) or "", text)
    for match in _IMPORT.finditer(texts[path]):
        _config_texts((path.parent / match.group(2)).resolve(), texts)
    return texts


def _helpers(text: str) -> tuple[dict[str, int], set[str]]:
    """The functions of ``text`` whose body passes one of their parameters to ``std.extVar``
    (name: that parameter's index), and the names of all such parameters. A body runs to the
    next definition."""
    definitions = list(_HELPER.finditer(text))
    helpers: dict[str, int] = {}
    parameters: set[str] = set()
    for number, definition in enumerate(definitions):
        end = definitions[number + 1].start() if number + 1 < len(definitions) else len(text)
        body = text[definition.end() : end]
        params = [p.split("=", 1)[0].strip() for p in definition.group(2).split(",")]
        for argument in _EXT_VAR.findall(body):
            if argument in params:
                helpers[definition.group(1)] = params.index(argument)
                parameters.add(argument)
    return helpers, parameters


def _arguments(text: str, start: int) -> list[str]:
    """The top-level, comma-separated arguments of the call whose ``(`` ends at ``start``."""
    arguments, depth, current = [], 0, start
    for position in range(start, len(text)):
        char = text[position]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                arguments.append(text[current:position].strip())
                return arguments
            depth -= 1
        elif char == "," and depth == 0:
            arguments.append(text[current:position].strip())
            current = position + 1
    return arguments


def check_workspace_writable(url: str | None) -> None:
    """A local workspace (a path, or ``local://path``) must be writable, and so must its
    ``cache`` and ``runs`` directories where it has them; a new one, its nearest existing
    parent. Other workspaces (``memory://``, ``beaker://``, ...) pass."""
    if not url or ("://" in url and not url.startswith("local://")):
        return
    path = Path(url.removeprefix("local://")).expanduser()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    targets = [existing] + [path / sub for sub in ("cache", "runs") if (path / sub).is_dir()]
    for target in targets:
        try:
            with tempfile.TemporaryFile(dir=target):
                pass
        except OSError as error:
            raise ConfigurationError(
                f"workspace {url} is not writable ({target}: {error.strerror}): choose another "
                "-w directory (Tango writes its cache and run records there)"
            ) from None


def _settings(settings_path: str | None) -> Any:
    from tango.settings import TangoGlobalSettings

    if settings_path:
        return TangoGlobalSettings.from_file(settings_path)
    return TangoGlobalSettings.default()


def _settings_environment(settings_path: str | None) -> set[str]:
    settings = _settings(settings_path)
    return set((settings.environment or {}) if settings is not None else ())


def _settings_workspace(settings_path: str | None) -> str | None:
    settings = _settings(settings_path)
    workspace = getattr(settings, "workspace", None) if settings is not None else None
    if isinstance(workspace, dict) and workspace.get("type", "local") == "local":
        directory = workspace.get("dir")
        return str(directory) if directory else None
    return None
