"""tango_fairscale: sharded training and lm-eval-exact evaluation of causal LMs as Tango steps.

``include_package: [tango_fairscale]`` (in ``tango.yml``) registers every component: Tango imports
each submodule. Importing this package alone imports nothing heavy (no torch), so that
``tango_fairscale.results`` and the ``tango-fairscale`` command start fast; import the module of a
component to use it from Python (e.g. ``tango_fairscale.train.step``).

Imported by ``tango run`` (after it evaluates the config, before any step or the workspace), the
package applies its fixes to Tango (:mod:`tango_fairscale.compat`: among them, an expected error
printed as its message alone) and checks the command line (:mod:`tango_fairscale.command_line`):
an unknown ``-D`` name or a read-only workspace is refused in one line before any work; its
garbage collector collects less often (:mod:`tango_fairscale.runtime.collector`); once it has
succeeded, the process ends without freeing its modules one by one.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _invoked_as_tango_run(argv: list[str]) -> bool:
    """Whether this process is ``tango ... run ...`` itself (not a worker it spawned)."""
    program = argv[0] if argv else ""
    is_tango = _os.path.basename(program) == "tango" or program.endswith(
        _os.path.join("tango", "__main__.py")
    )
    if not is_tango or "run" not in argv[1:]:
        return False
    import multiprocessing

    return multiprocessing.parent_process() is None


if _invoked_as_tango_run(_sys.argv):
    from . import compat  # noqa: F401  (Tango, already imported here, fixed before the check)
    from .command_line import check_tango_run

    check_tango_run(_sys.argv[1:])
    # Only here: under a launcher, ``tango_fairscale run`` has work left after Tango's command.
    compat.tango_runs.patch_tango_run_exit()
    from .runtime.collector import collect_less

    collect_less()
