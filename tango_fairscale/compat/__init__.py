"""Fixes for what Tango 1.3.2 gets wrong, applied once when this package is imported (guarded).

Every module that registers a Tango component imports it; FairScale's and transformers' fixes
are in :mod:`.fairscale` and :mod:`.transformers`, applied where those libraries are used.


* Tango 1.3.2 records the git commit and ``origin`` remote of the working directory before each
  step and crashes (``ValueError``) in a repository with no commit or no ``origin`` remote — a
  fresh ``git init`` or a clone whose remote was renamed. Record no git metadata there instead.
  (``EnvironmentMetadata`` captured the method as its dataclass default factory, so the factory
  held by its ``__init__`` is replaced, not just the class attribute.)
* A config key a component does not take fails with Tango's "Extra parameters passed to X: {...}",
  which names neither the fields X takes nor the one meant: the closest field and the list are
  added (``difflib``), for every ``FromParams`` class and step (``patch_tango_unknown_fields``),
  and a key of a block given at the top level (``device_count`` of the training step's
  ``runtime``) is told where it goes.
* While building the step graph, Tango deep-copies each argument that holds a step — and with it
  the step and everything the step holds, such as a model its config built (5 s for a GPT-2 124M
  on every ``tango run``). A step is a node of the graph: a copy of it is the step itself.
* An unregistered ``type`` (a typo) makes Tango import each of its integrations in search of the
  name; with the pinned transformers its ``transformers`` integration raises ``ImportError``, so a
  typo surfaced as a raw import error. Integrations that do not import are skipped, and the typo
  ends in Tango's ``RegistryKeyError`` ("... is not a registered name ..., did you mean ...?").
* Tango's ``torch::train`` builds its engine in each spawned process: an engine config it refuses
  (``pipe`` with ``device_count`` 2, a misspelt ``sharding`` key) failed in every worker (61
  lines). The package's engines check their config when the step is built
  (:meth:`~tango_fairscale.parallel.engine.Engine.check_config`).
* An expected error (a ``ConfigurationError``, the package's one-line errors) reaches the terminal
  as its message alone, its traceback kept in the run's log (:mod:`.tango_errors`).
* Two runs on one local workspace: a step one of them runs is waited for by the other, never run
  twice or failed (:mod:`.tango_locks`).
* A local workspace's files run no code: step records are unpickled through an allow-list, legacy
  ``stepinfo.dill`` files refused, a cached result read by its step's own format
  (:mod:`.tango_workspace`).
* No ``pkg_resources`` warning before every step, one line per finished progress bar
  (:mod:`.tango_output`).
* A local run records when its command started, before models were loaded; a finished
  ``tango run`` typed by the user ends without freeing its modules one by one (:mod:`.tango_runs`,
  applied by ``tango_fairscale/__init__.py``).
* transformers does not import scikit-learn for assisted generation, which the package never runs
  (:mod:`.transformers`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from typing import Any

from . import tango_errors, tango_locks, tango_output, tango_runs, tango_workspace, transformers


def patch_tango_git_metadata() -> None:
    from tango.step_info import EnvironmentMetadata, GitMetadata

    original = GitMetadata.check_for_repo

    def check_for_repo() -> GitMetadata | None:
        try:
            return original()
        except ValueError:  # no commit yet, or no "origin" remote
            return None

    cells: Any = EnvironmentMetadata.__init__.__closure__ or ()
    for cell in cells:
        if cell.cell_contents == original:
            cell.cell_contents = check_for_repo


def _subclasses(cls: type) -> Iterator[type]:
    subclass: type
    for subclass in cls.__subclasses__():
        yield subclass
        yield from _subclasses(subclass)


def config_parameters(class_name: str) -> Iterator[inspect.Parameter]:
    """The parameters through which the ``FromParams`` classes named ``class_name`` take their
    config keys: a step's ``run`` then Tango's ``Step.__init__``, else ``__init__``."""
    from tango import Step
    from tango.common import FromParams

    for cls in _subclasses(FromParams):
        if cls.__name__ != class_name:
            continue
        functions = [cls.run, Step.__init__] if issubclass(cls, Step) else [cls.__init__]
        for function in functions:
            try:
                yield from inspect.signature(function).parameters.values()
            except (TypeError, ValueError):
                continue


def accepted_fields(class_name: str) -> list[str]:
    """The config keys that the ``FromParams`` classes named ``class_name`` take (for a step: its
    ``run`` arguments, then Tango's ``step_*`` options)."""
    fields: list[str] = []
    for p in config_parameters(class_name):
        if (
            p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in ("self", "train_config", "step_config", "step_unique_id_override")
            and p.name not in fields
        ):
            fields.append(p.name)
    return fields


def block_fields(class_name: str) -> dict[str, str]:
    """``{key: block}`` for the keys of the config blocks (``FromParams`` dataclasses given as
    defaults, such as the training step's ``runtime``) that the classes named ``class_name``
    take: where a key given at the top level belongs."""
    import dataclasses

    from tango.common import FromParams

    found: dict[str, str] = {}
    for parameter in config_parameters(class_name):
        default = parameter.default
        if isinstance(default, FromParams) and dataclasses.is_dataclass(default):
            for block_field in dataclasses.fields(default):
                found.setdefault(block_field.name, parameter.name)
    return found


def patch_tango_unknown_fields() -> None:
    from tango.common.exceptions import ConfigurationError
    from tango.common.params import Params

    original = Params.assert_empty
    if getattr(original, "suggests_fields", False):
        return

    def assert_empty(self: Params, name: str) -> None:
        try:
            original(self, name)
        except ConfigurationError as error:
            fields = accepted_fields(name)
            if not fields:
                raise
            blocks = block_fields(name)
            guesses = [
                f"{close[0]!r} for {key!r}"
                for key in self.params
                if key not in blocks
                and (close := difflib.get_close_matches(str(key), fields, n=1, cutoff=0.6))
            ]
            hint = f"; did you mean {', '.join(guesses)}?" if guesses else ""
            for block in dict.fromkeys(blocks[key] for key in self.params if key in blocks):
                keys = [key for key in self.params if blocks.get(key) == block]
                inside = ", ".join(f"{key}: ..." for key in keys)
                verb = "belongs" if len(keys) == 1 else "belong"
                hint += f"; {', '.join(keys)} {verb} in the {block!r} block: {block}: {{{inside}}}"
            raise ConfigurationError(f"{error}{hint} ({name} takes {', '.join(fields)})") from None

    assert_empty.suggests_fields = True  # type: ignore[attr-defined]
    Params.assert_empty = assert_empty  # type: ignore[method-assign]


def patch_tango_registry_search() -> None:
    """Tango looks for a name no module has registered in each of its integrations; one that
    fails to import is skipped as missing (``IntegrationMissingError``), whatever it raises: an
    installed library of another version breaks an integration in any way (seen: a jax whose
    ``jax.random`` has no ``PRNGKeyArray`` made Tango's flax integration raise
    ``AttributeError``, and a config naming Tango's own ``torch::naive`` engine failed)."""
    import tango.common.registrable as registrable
    from tango.common.exceptions import IntegrationMissingError

    original = registrable.import_module_and_submodules
    if getattr(original, "skips_broken_integrations", False):
        return

    broken: set[str] = set()  # imported half-way once: importing again re-registers names

    def import_module_and_submodules(module: str, *args: Any, **kwargs: Any) -> None:
        if module in broken:
            raise IntegrationMissingError(module.rsplit(".", 1)[-1])
        try:
            original(module, *args, **kwargs)
        except Exception as error:  # noqa: BLE001 - see the docstring
            if not module.startswith("tango.integrations."):
                raise
            broken.add(module)
            raise IntegrationMissingError(module.rsplit(".", 1)[-1]) from error

    import_module_and_submodules.skips_broken_integrations = True  # type: ignore[attr-defined]
    registrable.import_module_and_submodules = import_module_and_submodules  # type: ignore[assignment]


def registered_engine(engine: Any) -> tuple[type, dict[str, Any]] | None:
    """The registered ``TrainingEngine`` class that ``engine``, a config not yet built (a
    ``Lazy``), names, with that config as written; ``None`` for a name no engine is registered
    under (refused where the engine is built) or anything that is no such config."""
    from tango.common.exceptions import ConfigurationError
    from tango.integrations.torch import TrainingEngine

    params: Any = getattr(engine, "_params", None)  # the config as written: Lazy has no view
    fields = params.as_dict(quiet=True) if hasattr(params, "as_dict") else None
    if not isinstance(fields, dict) or not isinstance(fields.get("type"), str):
        return None
    name = fields["type"]
    try:
        return TrainingEngine.resolve_class_name(name)[0], fields
    except ConfigurationError:
        return None


def check_engine_config(engine: Any, world_size: int) -> None:
    """The ``check_config(fields, world_size)`` of the engine class that ``engine``, a config not
    yet built (a ``Lazy``), names, where it has one (the package's engines:
    :meth:`~tango_fairscale.parallel.engine.Engine.check_config`); anything else is left to its
    own construction."""
    found = registered_engine(engine)
    if found is None:
        return
    check = getattr(found[0], "check_config", None)
    if check is not None:
        check(found[1], world_size)
    check_scheduler_config(found[1].get("lr_scheduler"))


def check_scheduler_config(block: Any) -> None:
    """The ``check_config(fields)`` of the learning-rate scheduler that ``block``, an engine's
    ``lr_scheduler`` as written, names, where it has one (``tango_fairscale::warmup``)."""
    from tango.common.exceptions import ConfigurationError
    from tango.integrations.torch import LRScheduler

    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        return
    try:
        scheduler = LRScheduler.resolve_class_name(block["type"])[0]
    except ConfigurationError:  # an unknown name: refused where the engine builds it
        return
    check = getattr(scheduler, "check_config", None)
    if check is not None:
        check({key: value for key, value in block.items() if key != "type"})


def patch_torch_train_engine_check() -> None:
    from tango.integrations.torch.train import TorchTrainStep

    original = TorchTrainStep.massage_kwargs.__func__  # type: ignore[attr-defined]
    if getattr(original, "checks_engine_config", False):
        return

    def massage_kwargs(cls: type, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = original(cls, kwargs)
        check_engine_config(kwargs.get("training_engine"), kwargs.get("device_count", 1))
        return kwargs

    massage_kwargs.checks_engine_config = True  # type: ignore[attr-defined]
    TorchTrainStep.massage_kwargs = classmethod(massage_kwargs)  # type: ignore[method-assign,assignment]


def patch_tango_step_copies() -> None:
    from tango import Step

    Step.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]


def apply() -> None:
    tango_errors.patch_tango_error_logging()
    tango_locks.patch_tango_step_locks()
    tango_workspace.patch_tango_step_records()
    tango_workspace.patch_tango_cached_results()
    tango_output.apply()
    tango_runs.patch_tango_run_start()
    patch_tango_step_copies()
    patch_tango_git_metadata()
    patch_tango_unknown_fields()
    patch_tango_registry_search()
    patch_torch_train_engine_check()
    transformers.skip_sklearn_import()


apply()
