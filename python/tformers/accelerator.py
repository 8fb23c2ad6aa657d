"""Devices, as torch.accelerator presents them: the CPU is always there; accelerators ("tpu",
"cuda") are PJRT plugins found at run time."""

import site
import sysconfig

from . import _core


def _site_packages() -> list[str]:
    """This interpreter's site-packages (sys.prefix's, and the base's with
    --system-site-packages), where the plugin packages (pip install xla-cpu-pjrt, libtpu) go."""
    dirs = [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    return list(dict.fromkeys(dirs))


# Plugins are looked for in the running interpreter's environment first: venv/bin/python run
# without activating the environment sets no VIRTUAL_ENV.
_core.set_python_site_packages(_site_packages())


def is_available() -> bool:
    """True when an accelerator runtime was found and can run graphs."""
    return _core.accelerator_is_available()


def device_count() -> int:
    return _core.accelerator_device_count()


def current_accelerator() -> str | None:
    """"tpu", "cuda", or None when there is none."""
    return _core.current_accelerator() or None
