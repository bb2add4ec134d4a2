"""The launcher's environment variables (``runtime/launcher.py``): a torchrun process's are read,
bad ones refused in one line. Training under torchrun itself is
``tests/integration/runtime/test_torchrun_nodes.py``."""

from __future__ import annotations

import pytest

from tango_fairscale.runtime.launcher import LaunchEnvironment


def test_environment_of_a_torchrun_process() -> None:
    environ = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RESTART_COUNT": "1",
    }
    assert LaunchEnvironment.from_environ(environ) == LaunchEnvironment(
        rank=3,
        world_size=4,
        local_rank=1,
        local_world_size=2,
        master_addr="node0",
        master_port=29500,
        attempt=1,
    )
    assert LaunchEnvironment.from_environ({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "0", "WORLD_SIZE": "2"}, "RANK, WORLD_SIZE set but MASTER_ADDR, MASTER_PORT not"),
        (
            {"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "launcher variables must be integers",
        ),
        (
            {"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"},
            "inconsistent launcher variables: RANK=2 WORLD_SIZE=2",
        ),
    ],
)
def test_bad_launcher_environment_is_one_line(environ: dict[str, str], message: str) -> None:
    from tango.common.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=message):
        LaunchEnvironment.from_environ(environ)
