"""Devices, as torch.accelerator presents them: the CPU is always there; accelerators ("tpu",
"cuda") are PJRT plugins found at run time."""

from . import _core


def is_available() -> bool:
    """True when an accelerator runtime was found and can run graphs."""
    return _core.accelerator_is_available()


def device_count() -> int:
    return _core.accelerator_device_count()


def current_accelerator() -> str | None:
    """"tpu", "cuda", or None when there is none."""
    return _core.current_accelerator() or None
