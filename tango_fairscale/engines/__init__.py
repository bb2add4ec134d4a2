"""Training engines, one per parallelism strategy, behind one config surface."""

from .base import Engine, Precision, resolve_precision, unwrap
from .ddp import DDPEngine
from .fairscale import FairScaleEngine
from .fsdp2 import FSDP2Engine
from .pipe import PipeEngine

__all__ = [
    "DDPEngine",
    "Engine",
    "FairScaleEngine",
    "FSDP2Engine",
    "PipeEngine",
    "Precision",
    "resolve_precision",
    "unwrap",
]
