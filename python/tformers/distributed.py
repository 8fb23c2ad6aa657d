"""Tensor parallelism, as Transformers' DistributedConfig: one process per chip, started by
`tformers launch --nproc-per-node N -- python script.py` (Open MPI ranks; include/tformers/distributed.h)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _core


@dataclass
class DistributedConfig:
    """tp_size: processes the model is split over (None: every rank). tp_plan: {module pattern:
    style} rules over the architecture's default plan ("layers.*.self_attn.q_proj": "colwise").
    timeout: seconds a collective waits for the other ranks before the job is aborted."""

    tp_size: int | None = None
    tp_plan: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None


def world_rank() -> int:
    """This process's rank (0 when not started by tformers launch)."""
    return _core.world_rank()


def world_size() -> int:
    return _core.world_size()


def is_main_process() -> bool:
    """True on rank 0, the rank that prints."""
    return _core.is_main_process()
