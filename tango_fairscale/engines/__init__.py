"""Training engines, one per parallelism strategy, behind one config surface."""

from .base import Engine, Precision, resolve_precision, unwrap
from .ddp import DDPEngine
from .fairscale import FairScaleEngine

__all__ = ["DDPEngine", "Engine", "FairScaleEngine", "Precision", "resolve_precision", "unwrap"]
