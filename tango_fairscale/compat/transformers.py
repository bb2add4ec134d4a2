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
which the package never trains; scipy itself is not hidden from anything else.
"""

from __future__ import annotations

import contextlib
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


class _BeforeTransformersReads(importlib.abc.MetaPathFinder):
    """Applies :func:`skip_sklearn_import` when a module of :data:`SKLEARN_READERS` is about to
    be imported (``transformers.utils`` is imported by then, with its parent packages), and
    :func:`~.package_metadata.remember_packages_distributions_once` before
    :data:`DISTRIBUTIONS_READER`; finds :data:`SCIPY_READER` as the import system's own path
    finder does, its loader run without scipy (:func:`_imported_without_scipy`), and nothing
    else itself. It stays in ``sys.meta_path``: the import system is iterating that list."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == DISTRIBUTIONS_READER:
            remember_packages_distributions_once()
        if fullname in SKLEARN_READERS:
            skip_sklearn_import()
        if fullname == SCIPY_READER:
            return _imported_without_scipy(fullname, path)
        return None


def _imported_without_scipy(
    fullname: str, path: Sequence[str] | None
) -> importlib.machinery.ModuleSpec | None:
    """The spec the import system would find for ``fullname``, its loader run with transformers'
    ``is_scipy_available`` answering ``False``."""
    spec = importlib.machinery.PathFinder.find_spec(fullname, path)
    if spec is None or spec.loader is None:
        return spec
    spec.loader = _WithoutScipy(spec.loader)
    return spec


class _WithoutScipy(importlib.abc.Loader):
    """A module's own loader, its module executed while ``transformers.utils`` says scipy is
    absent (what its imports bind then); anything else is the loader's own."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        import transformers.utils as utils

        available = utils.is_scipy_available
        utils.is_scipy_available = _absent  # type: ignore[assignment]
        try:
            self.loader.exec_module(module)
        finally:
            utils.is_scipy_available = available  # type: ignore[assignment]


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
