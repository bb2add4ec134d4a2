"""A run's final checkpoint abandons the background write it supersedes on every rank of a
2-process ``fairscale`` job (each rank writes its shard) and of a 2-process ``fsdp2`` one (DCP,
whose writes exchange their plans on the writer's own group): no rank fails, the superseded
``.partial-`` directory is gone, the final checkpoint is committed and ``latest``, the one before
stays, and the final save did not wait for the slow write (``train/checkpoints.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_config
from helpers.abandon import supersede_on_ranks
from helpers.ranks import two_rank_plan

from tango_fairscale.records.checkpoints import LATEST, complete_checkpoints, read_manifest

#: Each engine's files of a rank: rank 0's and rank 1's.
RANK_FILES = {
    "fairscale": {"rank0.pt", "rank1.pt"},
    "fsdp2": {"__0_0.distcp", "__1_0.distcp"},
}


@pytest.mark.slow  # two spawned processes
@pytest.mark.parametrize("engine_name", sorted(RANK_FILES))
def test_the_final_checkpoint_abandons_the_write_in_flight_on_every_rank(
    tmp_path: Path, tiny_model_dir: Path, engine_name: str
) -> None:
    fields = engine_config(f"tango_fairscale::{engine_name}")
    plan = two_rank_plan("abandon", tmp_path / "run", tiny_model_dir, fields)
    seconds = supersede_on_ranks(plan, slow_write_s=0.5)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert [p.name for p in complete_checkpoints(checkpoints)] == ["step0000010", "step0000003"]
    assert (checkpoints / LATEST).read_text() == "step0000010"
    assert not any(p.name.startswith(".partial") for p in checkpoints.iterdir())
    assert read_manifest(checkpoints / "step0000010").model_only
    assert RANK_FILES[engine_name] <= {p.name for p in (checkpoints / "step0000010").iterdir()}
    assert seconds < 5.0  # the step-5 write, 0.5 s a file write, would take far longer
