"""A command's main process collects garbage less often (``runtime/collector.py``): ``tango
run``'s own process (``tango_fairscale/__init__.py``) freezes what it holds after its imports and
collects at the module's thresholds; another process importing the package keeps Python's
defaults."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO_ROOT

from tango_fairscale.runtime.collector import THRESHOLDS

SHOW = "import gc; print(gc.get_threshold(), gc.get_freeze_count() > 0)"


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_tango_runs_own_process_collects_less(tmp_path) -> None:
    as_tango_run = (
        f"import sys; sys.argv = ['/venv/bin/tango', 'run', 'configs/gpt2_piqa.jsonnet', "
        f"'-w', {str(tmp_path / 'workspace')!r}]; import tango.__main__, tango_fairscale; {SHOW}"
    )
    assert run(as_tango_run) == f"{THRESHOLDS} True"


def test_another_process_keeps_pythons_collector() -> None:
    assert run(f"import tango_fairscale; {SHOW}") == "(700, 10, 10) False"


CYCLE = """
import gc, weakref
from tango_fairscale.runtime import collector

class Node:
    pass

def dropped_cycle():
    node = Node()
    node.itself = node
    return weakref.ref(node)

gc.disable()
{apply}
cycle = dropped_cycle()
collector.collect_cycles()
print(cycle() is None)
"""


def test_cycles_are_collected_on_demand_where_the_process_collects_less() -> None:
    assert run(CYCLE.format(apply="collector.collect_less(); gc.disable()")) == "True"
    assert run(CYCLE.format(apply="")) == "False"  # elsewhere Python's thresholds do it
