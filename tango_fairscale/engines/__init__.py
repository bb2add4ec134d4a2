"""Training engines, one per parallelism strategy, behind one config surface."""

from .base import Engine, Precision, resolve_precision, unwrap
from .ddp import DDPEngine

__all__ = ["DDPEngine", "Engine", "Precision", "resolve_precision", "unwrap"]
