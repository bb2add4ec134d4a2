"""Training engines, one per parallelism strategy, behind one config surface."""

from .base import Engine, Precision, resolve_precision, unwrap
from .ddp import DDPEngine
from .fairscale import FairScaleEngine
from .fsdp2 import FSDP2Engine

__all__ = [
    "DDPEngine",
    "Engine",
    "FairScaleEngine",
    "FSDP2Engine",
    "Precision",
    "resolve_precision",
    "unwrap",
]
