"""The package's layers, by what each folder may import (docs/design.md, "What is where").

- policy/ and store/ import neither vllm nor torch, nor anything else of the package;
- bookkeeping/ (the books the connector and the trace simulator share) imports neither vllm
  nor torch, and of the package only itself, policy/ and store/;
- datapath/ (page views, copies, streams, host rows, the SSD read pipeline) imports and runs
  with vllm absent, and names vllm nowhere, not even in a function's lazy import;
- vllm_glue/ and the entry points at the top (connector, plugin, config) may import anything.

Every module of a folder is imported in a fresh interpreter and the modules each brought in
are checked; the modules are found on disk, so a new file is covered without listing it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = "histate_vllm"

# Imports each module of args["modules"] in order, with the top-level packages of
# args["block"] made unimportable (as if not installed), and prints, per module, the modules
# its import added to sys.modules (or the ImportError it raised); then runs args["run"] and
# reports what that added as "(run)".
CHECKER = r"""
import importlib, json, sys
args = json.loads(sys.argv[1])
sys.path[:0] = args["path"]
for name in args["block"]:
    sys.modules[name] = None  # `import name` now raises ImportError
loaded = lambda: {k for k, v in sys.modules.items() if v is not None}
report = {}
for mod in args["modules"]:
    before = loaded()
    try:
        importlib.import_module(mod)
    except ImportError as e:
        report[mod] = {"error": repr(e)}
        continue
    report[mod] = {"new": sorted(loaded() - before)}
if args["run"] and not any("error" in got for got in report.values()):
    before = loaded()
    exec(args["run"])
    report["(run)"] = {"new": sorted(loaded() - before)}
print(json.dumps(report))
"""

# folder -> (top-level packages it must not import, folders of the package it may import)
LAYERS = {
    "policy": ({"vllm", "torch"}, {"policy"}),
    "store": ({"vllm", "torch"}, {"store"}),
    "bookkeeping": ({"vllm", "torch"}, {"bookkeeping", "policy", "store"}),
    "datapath": ({"vllm"}, {"datapath", "store", "kernels"}),
}
FREE = {"vllm_glue"}  # vLLM's contracts: may import anything
TOP = {"__init__", "__main__", "config", "connector", "plugin"}

# Each layer is run, not only imported, where a call may import more: the policies are
# built; the data path copies pages to host rows and back.
POLICY_RUN = """
import histate_vllm.policy as p
p.make_policy("histate")
p.make_policy("lru")
"""
DATAPATH_RUN = """
import torch
from histate_vllm.datapath.copier import PageCopier
from histate_vllm.datapath.hostmem import HostRows
from histate_vllm.datapath.streams import transfer_stream

cache = torch.arange(32, dtype=torch.int8).reshape(4, 8)
rows = HostRows(2, 8, pin=False)
copier = PageCopier([[(cache, 8, 0)]])
assert copier.backend == "kernels", copier.backend
stream = transfer_stream(torch.device("cpu"))
done = stream.launch(copier.batch([(0, [2, 3], [1, 0])], rows.tensor, to_host=True),
                     stream.mark_compute())
assert done.query()
assert rows.tensor[1].tolist() == cache[2].tolist()
assert rows.tensor[0].tolist() == cache[3].tolist()
back = torch.zeros_like(cache)
PageCopier([[(back, 8, 0)]]).batch([(0, [0, 1], [1, 0])], rows.tensor, to_host=False)()
assert back[0].tolist() == cache[2].tolist() and back[1].tolist() == cache[3].tolist()
rows.close()
"""


def modules_of(root: Path, package: str) -> list[str]:
    """Dotted names of every module in the folder `root` (package `package`), sorted."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names.append(".".join([package, *parts]))
    return names


def imported(modules: list[str], *, block=(), run: str = "", path=()) -> dict:
    args = {"modules": modules, "block": sorted(block), "run": run, "path": [str(p) for p in path]}
    out = subprocess.run([sys.executable, "-c", CHECKER, json.dumps(args)], check=True,
                         capture_output=True, text=True, cwd=REPO)
    return json.loads(out.stdout.splitlines()[-1])


def violations(report: dict, forbid: set[str], package: str, allowed: set[str]) -> list[str]:
    """What broke the layer: a forbidden top-level package, a module of `package` outside the
    `allowed` folders, or an import that failed."""
    bad = []
    for mod, got in report.items():
        if "error" in got:
            bad.append(f"{mod}: {got['error']}")
            continue
        culprits = set()
        for name in got["new"]:
            parts = name.split(".")
            if parts[0] in forbid:
                culprits.add(parts[0])
            elif parts[0] == package and len(parts) > 1 and parts[1] not in allowed:
                culprits.add(".".join(parts[:2]))
        bad += [f"{mod} imports {c}" for c in sorted(culprits)]
    return bad


def test_every_module_has_a_layer():
    """A new folder (or a new module at the top) must be given a rule here."""
    root = REPO / PKG
    folders = {p.parent.relative_to(root).parts[0] for p in root.glob("*/__init__.py")}
    assert folders == set(LAYERS) | FREE, folders
    assert {p.stem for p in root.glob("*.py")} == TOP


def test_no_top_module_is_named_after_the_standard_library():
    """A Python started in histate_vllm/ would import it in place of the standard one."""
    root = REPO / PKG
    names = {p.stem for p in root.glob("*.py")}
    names |= {p.parent.name for p in root.glob("*/__init__.py")}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_layer_imports(folder):
    forbid, allowed = LAYERS[folder]
    modules = modules_of(REPO / PKG / folder, f"{PKG}.{folder}")
    assert len(modules) > 1, modules
    # vllm is made unimportable for every layer that must not need it.
    block = {"vllm"}
    run = {"datapath": DATAPATH_RUN, "policy": POLICY_RUN}.get(folder, "")
    report = imported(modules, block=block, run=run)
    assert violations(report, forbid, PKG, allowed) == []
    assert report.keys() == set(modules) | ({"(run)"} if run else set())


def vllm_imports(root: Path) -> list[str]:
    """Every `import vllm...` / `from vllm... import` in the files under `root`, at any depth
    of the code (inside functions too, where running on a CPU never reaches)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] == "vllm"]
    return found


def test_datapath_never_imports_vllm_even_lazily(tmp_path):
    """The data path runs on a GPU machine with torch and Triton alone (no vLLM there):
    vLLM's swap op and host registration are not reached for from inside it; the worker
    passes the op in, and pinning goes through torch."""
    assert vllm_imports(REPO / PKG / "datapath") == []
    (tmp_path / "lazy.py").write_text("def f():\n    from vllm import _custom_ops\n")
    assert vllm_imports(tmp_path) == ["lazy.py:2 vllm"]


def test_the_checker_catches_a_broken_layer(tmp_path):
    """The check above cannot pass by not looking: a synthetic layer that imports torch,
    imports vllm, or imports a folder of its package it may not, is caught module by module."""
    inner = tmp_path / "layerprobe" / "inner"
    inner.mkdir(parents=True)
    (tmp_path / "layerprobe" / "__init__.py").write_text("")
    (tmp_path / "layerprobe" / "outer.py").write_text("")
    (inner / "__init__.py").write_text("")
    (inner / "ok.py").write_text("import json\nfrom layerprobe.inner import helper\n")
    (inner / "helper.py").write_text("")
    (inner / "uses_torch.py").write_text("import torch\n")
    (inner / "uses_vllm.py").write_text("import vllm\n")
    (inner / "uses_outer.py").write_text("from layerprobe import outer\n")
    modules = modules_of(inner, "layerprobe.inner")
    report = imported(modules, block={"vllm"}, path=[tmp_path])
    bad = violations(report, {"vllm", "torch"}, "layerprobe", {"inner"})
    culprits = {line.split(":")[0].split(" ")[0] for line in bad}
    assert culprits == {"layerprobe.inner.uses_torch", "layerprobe.inner.uses_vllm",
                        "layerprobe.inner.uses_outer"}, bad
    assert violations(report, {"vllm"}, "layerprobe", {"inner", "outer"}) == [
        f"layerprobe.inner.uses_vllm: {report['layerprobe.inner.uses_vllm']['error']}"]
