"""PJRT plugins are found in the running interpreter's environment: a virtual environment run as
venv/bin/python, without activating it (no VIRTUAL_ENV) and outside the checkout (no ./.venv),
finds the xla-cpu plugin installed into it. The plugin package comes from the checkout's .venv/
(scripts/setup.sh --tests installs it there), linked into a fresh environment: nothing is
downloaded."""

import os
import shutil
import stat
import subprocess
import venv
from pathlib import Path

import numpy
import pytest

import tformers
from conftest import KJV, REPO

PLUGINS = sorted(REPO.glob(".venv/lib/python3*/site-packages/xla_plugins"))

SCRIPT = f"""
from tformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(KJV)!r}, dtype="float32", device_map="xla-cpu")
print(model.device)
"""


def make_env(folder: Path, with_plugin: bool, copy_package: bool = False) -> tuple[Path, Path]:
    """A bare virtual environment that imports numpy, and this tformers, through a .pth file (or
    holds a copy of tformers, `copy_package`), and holds the xla-cpu plugin package when
    `with_plugin`: (its python, its site-packages)."""
    venv.create(folder, with_pip=False, symlinks=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                        text=True).strip())
    packages = {Path(tformers.__file__).parent.parent, Path(numpy.__file__).parent.parent}
    if copy_package:
        shutil.copytree(Path(tformers.__file__).parent, site / "tformers")
    (site / "tformers_under_test.pth").write_text("".join(f"{p}\n" for p in sorted(packages)))
    if with_plugin:
        (site / "xla_plugins").symlink_to(PLUGINS[0], target_is_directory=True)
    return python, site


def unactivated() -> dict[str, str]:
    """This environment without an activated virtual environment or a plugin path."""
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TFORMERS_PJRT_PLUGIN_XLA_CPU")}


def run_unactivated(python: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=cwd,
                          env=unactivated())


@pytest.mark.skipif(not PLUGINS, reason="no xla-cpu plugin in .venv/ (scripts/setup.sh --tests installs it)")
def test_plugin_in_the_interpreters_own_environment_is_found(tmp_path):
    python, _ = make_env(tmp_path / "env", with_plugin=True)
    result = run_unactivated(python, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["xla-cpu"]


@pytest.mark.skipif(not PLUGINS, reason="no xla-cpu plugin in .venv/ (scripts/setup.sh --tests installs it)")
def test_console_script_finds_the_plugin_of_its_environment(tmp_path):
    """The `tformers` console script runs the command installed in the environment's
    site-packages, which looks for plugins there."""
    python, site = make_env(tmp_path / "env", with_plugin=True, copy_package=True)
    script = tmp_path / "env" / "bin" / "tformers"
    script.write_text(f"#!{python}\nfrom tformers._cli import main\nmain()\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    result = subprocess.run([script, "env"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=unactivated())
    assert result.returncode == 0, result.stderr
    assert f"backend xla-cpu: {site}/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so found" in result.stdout, result.stdout


@pytest.mark.skipif((Path(tformers.__file__).parent.parent / "xla_plugins").exists(),
                    reason="tformers is installed beside the xla-cpu plugin, which it then finds")
def test_missing_plugin_names_the_interpreters_environment(tmp_path):
    python, site = make_env(tmp_path / "env", with_plugin=False)
    result = run_unactivated(python, tmp_path)
    assert result.returncode != 0
    assert "No PJRT plugin was found" in result.stderr
    assert f"{site}/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so" in result.stderr, result.stderr
