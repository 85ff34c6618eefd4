"""Every place histate-vllm reads, overrides or patches something private of vLLM's, or
branches on what the installed vLLM offers: found from the source, on this interpreter's vLLM.

    .venv/bin/python scripts/vllm_contacts.py            # a table of them, and the count
    .venv/bin/python scripts/vllm_contacts.py --count    # the count alone

Rules, applied to every module of histate_vllm that imports vLLM:
- private: a `_name` (not a dunder) of a vLLM class HiState subclasses, read, written or
  overridden through `self`, `cls` or `super()`;
- reach-in: a `_name` read off any other object, where histate_vllm itself defines no such
  name (a namedtuple's `_replace` and `_fields` are public);
- assignment: an attribute set on an object that is not `self`, unless that object is one
  of HiState's own (an attribute HiState's own classes define, on something HiState built);
- bypass: a vLLM class's method run on `self` by name, past the subclass's parents;
- version branch: a `hasattr`/`getattr` with a default on a vLLM module or class, on
  torch's ops, on the KV cache manager, or on `self` for a name only vLLM's parents define;
  or a read of a capability flag of `seam.capabilities`.
tests/vllm_glue/test_seam.py holds every contact to the seam and to docs/vllm-seam.md.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "histate_vllm"
SEAM = "histate_vllm/vllm_glue/seam"
PUBLIC_UNDERSCORE = {"_replace", "_fields", "_asdict", "_make", "_field_defaults"}


@dataclass(frozen=True)
class Contact:
    path: str  # relative to the repository
    line: int
    function: str  # enclosing qualified name
    kind: str  # private, reach-in, assignment, version-branch
    what: str

    @property
    def in_seam(self) -> bool:
        return self.path.startswith(SEAM)


def _imports_vllm(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm"
                                                for a in node.names):
            return True
    return False


def _own_names(trees: dict[str, ast.AST]) -> set[str]:
    """Names histate_vllm defines: functions, class attributes, `self.x = ...` targets."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                pass
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name)
                            and sub.value.id == "self"):
                        names.add(sub.attr)
    return names


def _vllm_bases(tree: ast.AST) -> dict[str, list[type]]:
    """class name -> the vLLM classes it derives from (resolved through its imports)."""
    imported: dict[str, str] = {}
    for node in ast.walk(tree):
        # vLLM's classes, and HiState's own that derive from them (the seam's).
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("vllm", "histate_vllm")):
            for a in node.names:
                imported[a.asname or a.name] = f"{node.module}:{a.name}"
    local: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            local[node.name] = [ast.unparse(b) for b in node.bases]
    out: dict[str, list[type]] = {}

    def resolve(name: str, seen=()) -> list[type]:
        if name in imported:
            module, attr = imported[name].split(":")
            try:
                return [getattr(importlib.import_module(module), attr)]
            except Exception:  # not in this vLLM
                return []
        if name in local and name not in seen:
            return [c for b in local[name] for c in resolve(b, seen + (name,))]
        if "." in name:  # a seam class, say: resolve by import
            try:
                mod, _, attr = name.rpartition(".")
                return [getattr(importlib.import_module(mod), attr)]
            except Exception:
                return []
        return []

    for cls, bases in local.items():
        found = [c for b in bases for c in resolve(b)]
        found = [c for c in found if any(k.__module__.startswith("vllm") for k in c.__mro__)]
        if found:
            out[cls] = found
    return out


def _vllm_attrs(classes: list[type]) -> set[str]:
    """Every attribute name vLLM's classes in these MROs define (methods, class and
    instance attributes)."""
    names: set[str] = set()
    for cls in classes:
        for k in cls.__mro__:
            if not k.__module__.startswith("vllm"):
                continue
            names.update(vars(k))
            try:
                src = ast.parse(inspect.getsource(k).strip())
            except (OSError, TypeError, SyntaxError, IndentationError):
                continue
            for node in ast.walk(src):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                        and node.value.id == "self" and isinstance(node.ctx, ast.Store)):
                    names.add(node.attr)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE


class _Scan(ast.NodeVisitor):
    def __init__(self, path: str, own: set[str], bases: dict[str, list[type]],
                 vllm_names: set[str]):
        self.path, self.own, self.bases = path, own, bases
        self.vllm_names = vllm_names  # names imported from vllm in this module
        self.stack: list[str] = []
        self.cls_stack: list[str] = []
        self.base_attrs: dict[str, set[str]] = {c: _vllm_attrs(b) for c, b in bases.items()}
        self.found: list[Contact] = []
        self.seen: set[tuple] = set()

    def add(self, node: ast.AST, kind: str, what: str) -> None:
        key = (node.lineno, kind, what)
        if key not in self.seen:
            self.seen.add(key)
            self.found.append(Contact(self.path, node.lineno, ".".join(self.stack) or
                                      "<module>", kind, what))

    def _cls_attrs(self) -> set[str]:
        return self.base_attrs.get(self.cls_stack[-1], set()) if self.cls_stack else set()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.stack.append(node.name)
        self.cls_stack.append(node.name)
        self.generic_visit(node)
        self.cls_stack.pop()
        self.stack.pop()

    def visit_FunctionDef(self, node) -> None:
        if self.cls_stack and self.stack[-1] == self.cls_stack[-1]:
            if _private(node.name) and node.name in self._cls_attrs():
                self.stack.append(node.name)
                self.add(node, "private", f"overrides {node.name}")
                self.stack.pop()
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Attribute(self, node: ast.Attribute) -> None:
        base = node.value
        through_self = (isinstance(base, ast.Name) and base.id in ("self", "cls")) or (
            isinstance(base, ast.Call) and isinstance(base.func, ast.Name)
            and base.func.id == "super")
        if _private(node.attr):
            if through_self:
                if node.attr in self._cls_attrs():
                    verb = "writes" if isinstance(node.ctx, ast.Store) else "reads"
                    self.add(node, "private", f"{verb} {ast.unparse(node)}")
            elif node.attr not in self.own:
                self.add(node, "reach-in", ast.unparse(node))
        self.generic_visit(node)

    def _assigned(self, target: ast.AST) -> None:
        for sub in ast.walk(target):
            if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)):
                continue
            obj = sub.value
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                continue
            # An attribute of HiState's own on something HiState's own code holds (the
            # worker's store, a view's field): not vLLM's.
            root = obj
            while isinstance(root, ast.Attribute):
                root = root.value
            if (sub.attr in self.own and sub.attr not in self._cls_attrs()
                    and not (isinstance(root, ast.Name) and root.id in self.vllm_names)
                    and not self._vllm_object(obj)):
                continue
            self.add(sub, "assignment", ast.unparse(sub))

    def _vllm_object(self, obj: ast.AST) -> bool:
        """An object that is plainly vLLM's: a config, a request, vLLM's own class."""
        text = ast.unparse(obj)
        return any(w in text for w in ("config", "request", "Manager", "kv_cache_manager"))

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._assigned(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node) -> None:
        self._assigned(node.target)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        if (isinstance(f, ast.Name) and f.id in ("hasattr", "getattr", "setattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            name = node.args[1].value
            obj = node.args[0]
            is_branch = (f.id == "hasattr" or len(node.args) == 3) and f.id != "setattr"
            if f.id == "setattr" and not (isinstance(obj, ast.Name) and obj.id == "self"):
                self.add(node, "assignment", f"setattr({ast.unparse(obj)}, {name!r})")
            elif is_branch and not name.startswith("__") and self._vllm_side(obj, name):
                self.add(node, "version-branch",
                         f"{f.id}({ast.unparse(obj)}, {name!r})")
        # A vLLM class's method run on self past the subclass's parents (a constructor
        # skipped, say).
        if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and f.value.id in self.vllm_names and node.args
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
            self.add(node, "bypass", f"{ast.unparse(f)}(self, ...)")
        self.generic_visit(node)

    def _vllm_side(self, obj: ast.AST, name: str) -> bool:
        """Whether a hasattr/getattr asks what vLLM offers: of a vLLM module or class, of
        torch's ops (vLLM registers its kernels there), of a vLLM object HiState reaches
        into (the KV cache manager), or of self for a name only vLLM's parents define."""
        root = obj
        while isinstance(root, ast.Attribute):
            root = root.value
        rootname = root.id if isinstance(root, ast.Name) else ""
        if rootname in self.vllm_names or rootname == "torch":
            return True
        if rootname in ("self", "cls") and isinstance(obj, ast.Name):
            return name in self._cls_attrs() and name not in self.own
        return "kv_cache_manager" in ast.unparse(obj)


def _imported_vllm_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vllm"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names
                         if a.name.startswith("vllm"))
    return names


def _capability_reads(tree: ast.AST, path: str) -> list[Contact]:
    """Reads of the seam's capability flags (upper-case names of seam.capabilities or
    the old contracts module) outside the module that detects them."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in ("capabilities", "contracts", "caps")
                and node.attr.isupper()):
            out.append(Contact(path, node.lineno, "<flag>", "version-branch",
                               f"{node.value.id}.{node.attr}"))
    return out


VERSION_BRANCH = "version-branch"


def scan(root: Path = ROOT) -> list[Contact]:
    files = sorted((root / "histate_vllm").rglob("*.py"))
    trees = {str(p.relative_to(root)): ast.parse(p.read_text(), str(p)) for p in files}
    own = _own_names(trees)
    found: list[Contact] = []
    for path, tree in trees.items():
        if not _imports_vllm(tree) and "torch.ops" not in ast.unparse(tree):
            continue
        s = _Scan(path, own, _vllm_bases(tree), _imported_vllm_names(tree))
        s.visit(tree)
        found.extend(s.found)
        if not path.endswith("capabilities.py"):
            found.extend(_capability_reads(tree, path))
    return sorted(set(found), key=lambda c: (c.path, c.line, c.what))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", action="store_true", help="print the counts alone")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="a checkout to scan (another commit's worktree, say)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(args.root))
    import vllm

    contacts = scan(args.root)
    touches = [c for c in contacts if c.kind != VERSION_BRANCH]
    summary = (f"{len(touches)} contacts (private, reach-in, assignment, bypass) and "
               f"{len(contacts) - len(touches)} version branches in "
               f"{len({c.path for c in contacts})} files on vLLM {vllm.__version__}")
    if args.count:
        print(summary)
        return 0
    print("| file | line | in | kind | what |\n| --- | --- | --- | --- | --- |")
    for c in contacts:
        print(f"| {c.path} | {c.line} | {c.function} | {c.kind} | `{c.what}` |")
    print(f"\n{summary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
