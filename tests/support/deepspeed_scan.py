"""Uses of DeepSpeed's internals in Python source, found by reading its syntax tree (not by grepping known names).

What counts as an internal (each finding says which kind):
- `private`: a name with a leading underscore reached through DeepSpeed (`from deepspeed.x import _y`,
  `groups._EXPERT_PARALLEL_GROUP`, `zero_to_fp32._zero2_merge_trainable_params`, `deepspeed.ops.__compatible_ops__`),
  or a private method or attribute of DeepSpeed's engine or ZeRO optimizers on any object
  (`zero._lazy_init_hp_params_optimizer_state()`);
- `writes`: DeepSpeed's module state assigned or deleted (`groups._X[name] = g`, `ds_comm.cdb.new_group = f`,
  `setattr(deepspeed.x, ...)`), or an attribute of DeepSpeed's engine or ZeRO optimizers assigned on an object other
  than `self` (`engine.has_moe_layers = False`, `engine.load_checkpoint = wrapped`);
- `subclass`: a DeepSpeed class subclassed by a class whose `__init__` does not run the base's (`class M(MoE)`
  calling only nn.Module.__init__).

A name is "reached through DeepSpeed" when the expression starts at a name bound by an import from the deepspeed
package in that scope (module level, or the function it is used in). The engine's and optimizers' attribute names are
read from DeepSpeed's own classes (their methods, and what their code assigns to `self.X`), less those that
torch.nn.Module, torch.optim.Optimizer and object have (DeepSpeed inherits them; they are torch's public API) and less
plain words without an underscore (`module`, `monitor`, `optimizer`: too common to say that the object is DeepSpeed's;
`has_moe_layers`, `load_checkpoint`, `global_steps`, `checkpoint_engine` do).
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

SELF_ASSIGNED = re.compile(r"\bself\.(\w+)\s*(?:[-+*/|&]?=(?!=)|:[^=\n]*=)")  # self.x = / += / : T =
PUBLIC_DUNDERS = {"__version__", "__file__", "__name__", "__path__", "__doc__", "__class__", "__dict__", "__init__"}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str  # private | writes | subclass
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.what}"


@functools.lru_cache(maxsize=1)
def deepspeed_object_attributes() -> frozenset[str]:
    """Attribute names of DeepSpeed's engine and ZeRO optimizers that torch's base classes do not have."""
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    names: set[str] = set()
    for cls in (DeepSpeedEngine, DeepSpeedZeroOptimizer, DeepSpeedZeroOptimizer_Stage3):
        names.update(vars(cls))
        # what its module's code assigns to self.X (read as text: parsing these 4,000-line modules takes seconds)
        names.update(SELF_ASSIGNED.findall(Path(inspect.getsourcefile(cls)).read_text()))
    inherited = set(dir(torch.nn.Module)) | set(dir(torch.optim.Optimizer)) | set(dir(object))
    inherited |= set(vars(torch.nn.Module())) | {"defaults", "state", "param_groups"}  # an Optimizer's own (building
    # one to read them would import torch's compiler: seconds)
    return frozenset(n for n in names - inherited if "_" in n)  # a plain word (module, monitor) says nothing


def _root(node: ast.AST) -> ast.AST:
    """The start of an attribute / subscript / call chain: `a` of `a.b[0].c()`."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call, ast.Starred)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def _deepspeed_imports(body) -> set[str]:
    """Names that imports from the deepspeed package bind in these statements (nested functions included)."""
    names = set()
    for node in (n for stmt in body for n in ast.walk(stmt)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "deepspeed":
                    names.add(a.asname or "deepspeed")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "deepspeed" and not node.level:
            names.update(a.asname or a.name for a in node.names)
    return names


def _is_private(name: str) -> bool:
    return name.startswith("_") and name not in PUBLIC_DUNDERS


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str, object_attributes: frozenset[str]):
        self.path, self.object_attributes = path, object_attributes
        self.scopes: list[set[str]] = []
        self.findings: list[Finding] = []

    def found(self, node: ast.AST, kind: str, what: str) -> None:
        self.findings.append(Finding(self.path, node.lineno, kind, what))

    def from_deepspeed(self, node: ast.AST) -> bool:
        root = _root(node)
        return isinstance(root, ast.Name) and root.id in self.scopes[-1]

    # scopes: module-level imports everywhere; a function's own imports inside it; its parameters shadow them
    def visit_Module(self, node: ast.Module) -> None:
        top = [s for s in node.body if isinstance(s, (ast.Import, ast.ImportFrom, ast.If, ast.Try))]
        self.scopes.append(_deepspeed_imports(top))
        self.generic_visit(node)

    def visit_FunctionDef(self, node) -> None:
        a = node.args
        params = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None}
        self.scopes.append((self.scopes[-1] - params) | _deepspeed_imports(node.body))
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module.split(".")[0] == "deepspeed" and not node.level:
            for part in module.split(".")[1:]:
                if _is_private(part):
                    self.found(node, "private", f"imports from DeepSpeed's private module {module}")
            for a in node.names:
                if _is_private(a.name):
                    self.found(node, "private", f"imports {module}.{a.name}")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            parts = a.name.split(".")
            if parts[0] == "deepspeed" and any(_is_private(p) for p in parts[1:]):
                self.found(node, "private", f"imports DeepSpeed's private module {a.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _is_private(node.attr):
            if self.from_deepspeed(node.value):
                self.found(node, "private", f"{ast.unparse(node)}")
            elif node.attr in self.object_attributes and not _is_self(node.value):
                self.found(node, "private", f"DeepSpeed engine/optimizer internal {ast.unparse(node)}")
        self.generic_visit(node)

    def _check_target(self, target: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._check_target(t)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            if self.from_deepspeed(target):
                self.found(target, "writes", f"DeepSpeed's state: {ast.unparse(target)}")
            elif (isinstance(target, ast.Attribute) and target.attr in self.object_attributes
                  and not _is_self(target.value)):
                self.found(target, "writes", f"a DeepSpeed engine/optimizer attribute: {ast.unparse(target)}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_AugAssign(self, node) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Delete(self, node: ast.Delete) -> None:
        for t in node.targets:
            self._check_target(t)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if (isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args
                and self.from_deepspeed(node.args[0])):
            self.found(node, "writes", f"DeepSpeed's state: {ast.unparse(node)}")
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [b for b in node.bases if self.from_deepspeed(b)]
        init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
        if bases and init is not None and not _runs_base_init(init, bases):
            self.found(node, "subclass", f"class {node.name}({', '.join(ast.unparse(b) for b in bases)}) skips "
                                         "its base's __init__")
        self.generic_visit(node)


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _runs_base_init(init: ast.FunctionDef, bases: list[ast.AST]) -> bool:
    """`super().__init__(...)` or `Base.__init__(self, ...)` for one of `bases` in the body of `init`."""
    names = {ast.unparse(b) for b in bases}
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__":
            owner = node.func.value
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                return True
            if ast.unparse(owner) in names:
                return True
    return False


def scan_source(text: str, path: str = "<source>") -> list[Finding]:
    scanner = _Scanner(path, deepspeed_object_attributes())
    scanner.visit(ast.parse(text))
    return scanner.findings


def scan_tree(root: Path, skip: set[Path] = frozenset()) -> list[Finding]:
    """Every finding in the .py files under `root`, but for the files in `skip`."""
    return [f for p in sorted(root.rglob("*.py")) if p not in skip
            for f in scan_source(p.read_text(), str(p.relative_to(root.parent)))]
