"""No checkpoint file runs code: every global a hostile pickle can name is refused by the DCP
metadata allow-list and by the weights-only loads, and a real metadata file still reads."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers.hostile_pickles import calling_pickle, hostile_globals, plant_byte_entry

from tango_fairscale.parallel.dcp_storage import UnreadableCheckpoint, load_dcp, read_metadata
from tango_fairscale.parallel.safe_load import (
    dcp_metadata_globals,
    load_torch_file,
    read_dcp_metadata,
)


def weights_only_globals() -> set[tuple[str, str]]:
    """The globals torch's weights-only unpickler takes (the package's torch files' allow-list)."""
    from torch import _weights_only_unpickler

    return {tuple(key.rsplit(".", 1)) for key in _weights_only_unpickler._get_allowed_globals()}


def _refused_by(load, payloads) -> list[str]:
    """The globals ``load`` did not refuse with an UnpicklingError, or whose call ran."""
    failures = []
    for (module, name), data, marker in payloads:
        try:
            load(data)
        except pickle.UnpicklingError:
            pass
        except Exception as error:  # anything else means the global resolved
            failures.append(f"{module}/{name}: {type(error).__name__}: {error}")
            continue
        else:
            failures.append(f"{module}/{name}: loaded")
        if marker.exists():
            failures.append(f"{module}/{name}: ran")
    return failures


def _payloads(allowed, tmp_path: Path):
    for index, (module, name) in enumerate(hostile_globals(allowed)):
        marker = tmp_path / f"ran-{index}"
        for protocol in (2, 4):
            yield (module, name), calling_pickle(module, name, marker, protocol), marker


def test_dcp_metadata_refuses_every_hostile_global(tmp_path) -> None:
    payloads = list(_payloads(dcp_metadata_globals(), tmp_path))
    assert len(payloads) > 200
    assert _refused_by(read_dcp_metadata, payloads) == []
    assert not list(tmp_path.iterdir())


def test_the_known_exploit_is_refused(tmp_path) -> None:
    """``STACK_GLOBAL("torch.distributed.checkpoint.metadata", "os.system")`` resolved to
    ``os.system`` through a module-wide allow-list."""
    marker = tmp_path / "ran"
    data = calling_pickle("torch.distributed.checkpoint.metadata", "os.system", marker)
    with pytest.raises(pickle.UnpicklingError, match="os.system is not part of"):
        read_dcp_metadata(data)
    assert not marker.exists()


def test_weights_only_loads_refuse_every_hostile_global(tmp_path) -> None:
    def load(data: bytes) -> None:
        path = tmp_path / "file.pt"
        path.write_bytes(data)
        load_torch_file(path)

    (tmp_path / "markers").mkdir()
    payloads = list(_payloads(weights_only_globals(), tmp_path / "markers"))
    assert _refused_by(load, payloads) == []
    assert not list((tmp_path / "markers").iterdir())


def _checkpoint(directory: Path) -> dict:
    """A real DCP directory with tensors and an optimizer's non-tensor entries."""
    model = torch.nn.Linear(3, 2).to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3, dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    dcp.save(state, checkpoint_id=directory, no_dist=True)
    return state


def test_a_real_checkpoint_reads_through_the_allow_lists(tmp_path) -> None:
    saved = _checkpoint(tmp_path)
    metadata = read_metadata(tmp_path)
    assert (
        metadata.state_dict_metadata.keys()
        == dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata.keys()
    )
    loaded = {
        "model": {k: torch.empty_like(v) for k, v in saved["model"].items()},
        "optimizer": {"state": {}, "param_groups": []},
    }
    loaded["optimizer"] = {
        "state": {
            k: {n: torch.empty_like(t) if isinstance(t, torch.Tensor) else t for n, t in s.items()}
            for k, s in saved["optimizer"]["state"].items()
        },
        "param_groups": [dict(group) for group in saved["optimizer"]["param_groups"]],
    }
    load_dcp(loaded, tmp_path, no_dist=True)
    for key, value in saved["model"].items():
        assert torch.equal(loaded["model"][key], value)
    assert loaded["optimizer"]["param_groups"][0]["lr"] == 1e-3


def test_a_hostile_byte_entry_is_refused(tmp_path) -> None:
    """DCP loads non-tensor entries with ``torch.load(weights_only=False)``; ours does not."""
    saved = _checkpoint(tmp_path)
    marker = tmp_path / "ran"
    plant_byte_entry(
        tmp_path, "optimizer.param_groups.0.lr", calling_pickle("os", "system", marker)
    )
    loaded = {
        "optimizer": {
            "state": {},
            "param_groups": [dict(g) for g in saved["optimizer"]["param_groups"]],
        }
    }
    with pytest.raises(UnreadableCheckpoint, match="names a global that a checkpoint does not"):
        load_dcp(loaded, tmp_path, no_dist=True)
    assert not marker.exists()


def test_weights_only_is_what_the_planner_uses() -> None:
    buffer = io.BytesIO()
    torch.save({"lr": 0.1, "betas": (0.9, 0.99)}, buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == {"lr": 0.1, "betas": (0.9, 0.99)}
