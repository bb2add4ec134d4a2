"""What importing the package imports: Tango imports every module of it (``include_package``), a
``tango run`` whose steps are all cached included, so no module imports at its top the costly
modules that only training, a checkpoint or a model load needs; the fork server imports those for
its workers (``train/launch.py``'s ``DEFERRED_IMPORTS``). Checked in a fresh process (about 3 s).
"""

from __future__ import annotations

import sys

from helpers.commands import run_command

from tango_fairscale.train.launch import DEFERRED_IMPORTS

#: Imported where they are used: DCP and FSDP2 (with DTensor and sympy: ~0.8 s on a 2-core
#: machine), and each module a component of the package defers (transformers' model code, ~1 s).
DEFERRED = (
    "torch.distributed.checkpoint",
    "torch.distributed.tensor",
    "torch.distributed.fsdp",
    "sympy",
    *(name for names in DEFERRED_IMPORTS.values() for name in names),
)


def test_importing_every_module_as_tango_does_imports_none_of_the_deferred_modules() -> None:
    code = (
        "import sys\n"
        "from tango.common.util import import_module_and_submodules\n"
        "import_module_and_submodules('tango_fairscale')\n"
        "assert 'tango_fairscale.parallel.fsdp2' in sys.modules  # every module imported\n"
        f"imported = [name for name in {DEFERRED!r} if name in sys.modules]\n"
        "assert not imported, f'imported at the package import: {imported}'\n"
    )
    done = run_command([sys.executable, "-c", code])
    assert done.returncode == 0, done.stderr[-2000:]
