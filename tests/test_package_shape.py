"""The package's measurable shape: no module over 350 lines, no function over 60 lines
or over 8 parameters, no import cycle among its modules, every module that imports transformers
importing the package's fixes first, and ``docs/ARCHITECTURE.md``'s module map naming every
module. Read with ``ast``, nothing imported: the whole file runs in about a second.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "tango_fairscale"

MAX_MODULE_LINES = 350
MAX_FUNCTION_LINES = 60  # from the ``def`` line (decorators aside) to the last line of its body
MAX_PARAMETERS = 8  # ``self`` and ``cls`` not counted; ``*args`` and ``**kwargs`` counted

#: Functions whose parameters are config keys: a Tango step's ``run`` takes its config fields
#: (named by ``configs/*.jsonnet``, the tests and users' own configs), each hashed into the step's
#: cache key on its own (what does not change results is one ``runtime`` block).
CONFIG_KEYS = {
    "train/step.py:TrainStep.run",  # step tango_fairscale::train
    "evaluation/steps.py:TaskScoresStep.run",  # step tango_fairscale::task_scores
}

#: Known violations not mended yet. Each entry goes once its function is mended (the test
#: below fails while a mended one is still listed).
PENDING: dict[str, str] = {}


@functools.cache
def modules() -> tuple[tuple[str, Path, ast.Module], ...]:
    """``(dotted name, path, tree)`` of every module of the package (parsed once)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path, ast.parse(path.read_text(), filename=str(path))))
    return tuple(found)


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.AST]]:
    """``(qualified name, node)`` of every function and method, nested ones too."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = function.args
    names = [a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return len([name for name in names if name not in ("self", "cls")])


def where(path: Path, function: str) -> str:
    return f"{path.relative_to(PACKAGE).as_posix()}:{function}"


def test_no_module_is_over_350_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for _, path, _ in modules()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def test_no_function_is_over_60_lines_or_8_parameters() -> None:
    long, wide = {}, {}
    for _, path, tree in modules():
        for name, node in functions(tree):
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            key = where(path, name)
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > MAX_FUNCTION_LINES and PENDING.get(key) != "lines":
                long[key] = lines
            count = parameter_count(node)
            exempt = key in CONFIG_KEYS or PENDING.get(key) == "parameters"
            if count > MAX_PARAMETERS and not exempt:
                wide[key] = count
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    assert not wide, f"functions over {MAX_PARAMETERS} parameters (group them): {wide}"


def test_the_exemptions_are_still_needed() -> None:
    """An exemption that no longer exempts anything is removed, so that it cannot hide a new
    violation of the same function."""
    found = {}
    for _, path, tree in modules():
        for name, node in functions(tree):
            assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            found[where(path, name)] = (lines, parameter_count(node))
    for key in CONFIG_KEYS:
        assert key in found and found[key][1] > MAX_PARAMETERS, f"exemption {key} not needed"
    stale = {
        key
        for key, kind in PENDING.items()
        if key not in found
        or (kind == "lines" and found[key][0] <= MAX_FUNCTION_LINES)
        or (kind == "parameters" and found[key][1] <= MAX_PARAMETERS)
    }
    assert not stale, f"pending violations fixed: remove them from PENDING: {sorted(stale)}"


def imported(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere (at module level, in a function, under
    ``TYPE_CHECKING``), relative imports resolved: ``from .x import y`` imports ``x.y`` when that
    is a module, else ``x``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                targets.add(submodule if submodule in known else source)
    return {target for target in targets if target in known and target != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in import order, the first repeated last)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)) is not None:
                return found
        stack.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def import_graph() -> dict[str, set[str]]:
    parsed = modules()
    known = {name for name, _, _ in parsed}
    return {name: imported(name, path, tree, known) for name, path, tree in parsed}


def test_no_import_cycle() -> None:
    found = cycle(import_graph())
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_results_and_records_read_runs_without_the_rest_of_the_package() -> None:
    """``results/`` imports of the package only ``records/`` (the names and formats of what a run
    leaves on disk), and ``records/`` only itself: both stay pure Python."""
    graph = import_graph()
    for package, allowed in (("results", ("results", "records")), ("records", ("records",))):
        prefixes = tuple(f"tango_fairscale.{name}" for name in allowed)
        for module, targets in graph.items():
            if module.startswith(f"tango_fairscale.{package}"):
                outside = sorted(t for t in targets if not t.startswith(prefixes))
                assert not outside, f"{module} imports {outside}"


def test_the_import_graph_resolves_relative_and_function_level_imports() -> None:
    graph = import_graph()
    # ``from . import consolidate``: the submodule, not the package.
    assert "tango_fairscale.parallel.consolidate" in graph["tango_fairscale.parallel.engine"]
    # ``from .clean import command`` inside ``main``; ``from .runtime import launcher`` likewise.
    assert {"tango_fairscale.clean", "tango_fairscale.runtime.launcher"} <= graph[
        "tango_fairscale.cli"
    ]
    # ``from ..loss import ...`` two levels up; ``from .summary import`` under TYPE_CHECKING.
    assert "tango_fairscale.model.loss" in graph["tango_fairscale.model.stages.stage"]
    assert "tango_fairscale.results.summary" in graph["tango_fairscale.results.report"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_every_module_that_imports_transformers_imports_the_fixes_first() -> None:
    """transformers' fixes (``compat/transformers.py``: no scikit-learn, scipy optimizer or
    torchao imported with it) hook its import, so they must be in place before the first import
    of transformers in any process: a module that imports transformers (at any level) imports
    ``compat`` at its top. A command whose first transformers import came before them would
    import scikit-learn and torchao too (1.5-2 s on 2 cores, torchao's warnings in its output)."""

    def imports_transformers(node: ast.AST) -> bool:
        if isinstance(node, ast.Import):
            return any(alias.name.split(".")[0] == "transformers" for alias in node.names)
        return (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and ((node.module or "").split(".")[0] == "transformers")
        )

    def imports_compat(node: ast.stmt) -> bool:
        return (
            isinstance(node, ast.ImportFrom)
            and node.level > 0
            and (
                (node.module or "").split(".")[0] == "compat"
                or (not node.module and any(alias.name == "compat" for alias in node.names))
            )
        )

    unfixed = [
        name
        for name, _, tree in modules()
        if ".compat" not in name
        and any(imports_transformers(node) for node in ast.walk(tree))
        and not any(imports_compat(node) for node in tree.body)
    ]
    assert not unfixed, f"modules importing transformers without compat's fixes: {unfixed}"


def test_the_module_map_names_every_module() -> None:
    """Every module with code is in a row of ``docs/ARCHITECTURE.md``'s module map: a row names a
    module by its path (a folder: all its modules), its siblings by their file names."""
    text = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    mapped: list[Path] = []
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for named in re.findall(r"`([\w/]+(?:\.py)?/?)`", line.split("|")[1]):
            if "/" in named:
                folder = named.rstrip("/").rpartition("/")[0] if named.endswith(".py") else ""
                mapped.append(PACKAGE / named)
            else:
                mapped.append(PACKAGE / folder / named)
    missing = [
        str(path.relative_to(PACKAGE))
        for _, path, tree in modules()
        if not (path.name == "__init__.py" and _docstring_only(tree))
        and not any(path == entry or entry in path.parents for entry in mapped)
    ]
    assert not missing, f"modules not in docs/ARCHITECTURE.md's module map: {missing}"
    stale = [str(entry.relative_to(PACKAGE)) for entry in mapped if not entry.exists()]
    assert not stale, f"docs/ARCHITECTURE.md's module map names modules that are gone: {stale}"


def _docstring_only(tree: ast.Module) -> bool:
    return all(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in tree.body
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [("def f(self, a, *b, c, **d): pass", 4), ("def f(cls, a, /, b): pass", 2)],
)
def test_parameters_are_counted_without_self_or_cls(source: str, expected: int) -> None:
    (function,) = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    assert parameter_count(function) == expected
