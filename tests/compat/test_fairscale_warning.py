"""FairScale's warning left out of a user's terminal (``compat/fairscale.py``); its fixes for
current torch and gloo are tested by ``tests/integration/compat/test_fairscale_fixes.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest

#: In a fresh interpreter (pytest's own settings ignore the warning): FairScale's
#: ``free_storage_`` (which calls ``Tensor.storage()``) and a call of this script's own, each
#: warned of by torch (told to warn every time), with and without the package's filter.
CODE = """
import sys, warnings, torch
from fairscale.nn.data_parallel.fully_sharded_data_parallel import free_storage_
from tango_fairscale.compat.fairscale import quiet_storage_deprecation
torch.storage._set_always_warn_typed_storage_removal(True)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("default")
    if sys.argv[1] == "quiet":  # (after the filter above, which would take precedence)
        quiet_storage_deprecation()
    free_storage_(torch.zeros(4))
    torch.zeros(4).storage()
print(sorted({w.filename.rsplit("/", 1)[-1] for w in caught if "TypedStorage" in str(w.message)}))
"""


@pytest.mark.parametrize(
    "mode, warned",
    [("quiet", "['<string>']"), ("plain", "['<string>', 'fully_sharded_data_parallel.py']")],
)
def test_fairscales_storage_calls_warn_nothing_anyone_elses_still_do(
    mode: str, warned: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-c", CODE, mode], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == warned, run.stderr[-2000:]
