"""transformers 5 without a host wait per forward, and without scikit-learn or every package's
file list read at import.

Without an attention mask, transformers 5 looks for packed sequences in every forward
(``masking_utils.find_packed_sequence_indices``: ``(mask[:, -1] == 0).all()`` read on the host),
which makes the CPU wait for the GPU once per forward and leaves the GPU idle while Python
launches the rest of it. :class:`~tango_fairscale.model.causal_lm.ModelWrapper` calls the model
without a mask only for right-padded batches (one sequence per row, positions from 0; packed
batches come with their own mask), so :func:`unpacked_sequences` answers "not packed" without
looking, for the duration of that call.

transformers imports scikit-learn (with scipy, pandas and pyarrow: 4 s on 2 cores, in every
command and every worker) when its generation code is imported, for one use: assisted
generation's confidence threshold (``AssistedCandidateGenerator`` with
``assistant_confidence_threshold``), which the package never runs. :func:`skip_sklearn_import`
tells transformers that scikit-learn is absent, before its generation code is imported; lm-eval
still imports it where a metric needs it (``f1``, ``mcc``). Until transformers is imported, it
waits for the first import of a module that reads the answer at import (:data:`SKLEARN_READERS`),
so that a process that never uses transformers (a ``tango run`` with every step cached) does not
import it (~0.6 s on 2 cores) for the fix. The same hook answers transformers' map of installed
packages from a file (:mod:`.package_metadata`) as :data:`DISTRIBUTIONS_READER` is imported, and
lets transformers' loss functions (:data:`SCIPY_READER`, imported by its modeling code) find
scipy absent while they are imported: they import its optimizer (0.4-0.85 s a process, measured
on an H100's host: ``profile_lm_eval_h100_a5e020c.txt``) for object-detection models' losses,
which the package never trains; scipy itself is not hidden from anything else. Likewise its
torchao quantizer (:data:`TORCHAO_READER`, imported by its modeling code) is imported while
torchao seems absent: where torchao is installed (the ``float8`` extra) it imported torchao in
every process that loads a model (0.22-0.24 s on 2 cores), for checkpoints quantized by torchao;
the quantizer gets the real availability check back, and the one torchao function it binds at
import (:data:`TORCHAO_NAMES`) imports torchao when called, so such checkpoints load and save as
before.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .package_metadata import remember_packages_distributions_once

#: transformers' modules that ask at import whether scikit-learn is there (and import it if so).
SKLEARN_READERS = ("transformers.generation.candidate_generator", "transformers.data.metrics")
#: transformers' module that maps every import name to its distributions at its import.
DISTRIBUTIONS_READER = "transformers.utils.import_utils"
#: transformers' module whose import imports its object-detection losses, which import scipy's
#: optimizer when scipy is installed.
SCIPY_READER = "transformers.loss.loss_utils"
#: transformers' quantizer for torchao's checkpoints, which imports torchao when it is installed.
TORCHAO_READER = "transformers.quantizers.quantizer_torchao"
#: What :data:`TORCHAO_READER` binds from torchao at its import: (module, name).
TORCHAO_NAMES = (
    ("torchao.prototype.safetensors.safetensors_support", "flatten_tensor_state_dict"),
)


class _BeforeTransformersReads(importlib.abc.MetaPathFinder):
    """Applies :func:`skip_sklearn_import` when a module of :data:`SKLEARN_READERS` is about to
    be imported (``transformers.utils`` is imported by then, with its parent packages), and
    :func:`~.package_metadata.remember_packages_distributions_once` before
    :data:`DISTRIBUTIONS_READER`; finds :data:`SCIPY_READER` and :data:`TORCHAO_READER` as the
    import system's own path finder does, their loaders run without scipy and torchao
    (:func:`_imported_without`), and nothing else itself. It stays in ``sys.meta_path``: the
    import system is iterating that list."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == DISTRIBUTIONS_READER:
            remember_packages_distributions_once()
        if fullname in SKLEARN_READERS:
            skip_sklearn_import()
        if fullname == SCIPY_READER:
            return _imported_without(fullname, path, "is_scipy_available")
        if fullname == TORCHAO_READER:
            return _imported_without(fullname, path, "is_torchao_available", TORCHAO_NAMES)
        return None


def _imported_without(
    fullname: str,
    path: Sequence[str] | None,
    check: str,
    lazy_names: Sequence[tuple[str, str]] = (),
) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system would find for ``fullname``, its loader run with transformers'
    ``check`` (``is_scipy_available``, ...) answering ``False`` (:class:`_ImportedWithout`)."""
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is None or spec.loader is None:
        return spec
    spec.loader = _ImportedWithout(spec.loader, check, lazy_names)
    return spec


class _ImportedWithout(importlib.abc.Loader):
    """A module's own loader, its module executed while ``transformers.utils``' ``check`` says a
    package is absent (what its imports bind then). Afterwards the module's own ``check`` is the
    real one again and, where the package is installed, each of ``lazy_names`` (``(module,
    name)``, what it would have imported) a function that imports the real one when called.
    Anything else is the loader's own."""

    def __init__(self, loader: Any, check: str, lazy_names: Sequence[tuple[str, str]]) -> None:
        self.loader = loader
        self.check = check
        self.lazy_names = lazy_names

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        import transformers.utils as utils

        available = getattr(utils, self.check)
        setattr(utils, self.check, _absent)
        try:
            self.loader.exec_module(module)
        finally:
            setattr(utils, self.check, available)
        if getattr(module, self.check, None) is _absent:
            setattr(module, self.check, available)
        if available():
            for source, name in self.lazy_names:
                if not hasattr(module, name):
                    setattr(module, name, _imported_when_called(source, name))


def _imported_when_called(source: str, name: str) -> Any:
    """A stand-in for ``source.name`` that imports it at its first call and calls it."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(source), name)(*args, **kwargs)

    call.__name__ = name
    return call


def _absent() -> bool:
    return False


def skip_sklearn_import() -> None:
    """Make transformers' generation code skip scikit-learn (see the module's docstring); no
    effect once that code is imported."""
    if "transformers.generation.candidate_generator" in sys.modules:
        return
    if "transformers.utils" not in sys.modules:  # not imported yet: patched when it is needed
        if not any(isinstance(finder, _BeforeTransformersReads) for finder in sys.meta_path):
            sys.meta_path.insert(0, _BeforeTransformersReads())
        return
    import transformers.utils as utils
    import transformers.utils.import_utils as import_utils

    utils.is_sklearn_available = _absent  # type: ignore[assignment]
    import_utils.is_sklearn_available = _absent  # type: ignore[assignment]


@contextlib.contextmanager
def unpacked_sequences() -> Iterator[None]:
    """Within the block, transformers treats every row as one sequence."""
    from transformers import masking_utils

    detect = getattr(masking_utils, "find_packed_sequence_indices", None)
    if detect is None:  # another transformers: nothing to skip
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = detect
