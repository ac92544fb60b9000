"""The one-way flow of DESIGN.md, checked: each module imports only from layers below it,
and only the backend imports numpy or cupy."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tinygrad_attn"

# lower number = lower layer; a module may import its own layer or any lower one
LAYERS = {
    "backend": 0, "errors": 0,
    "shape": 1, "cuda": 1,
    "storage": 2,
    "tensor": 3,
    "autograd": 4,
    "ops": 5, "creation": 5,
    "functional": 6, "gradcheck": 6, "checkpoint": 6, "linalg": 6,
    "memory": 7,
    "__init__": 9,
}
# Tensor's methods are its public face: `x.exp()` runs an op and `loss.backward()` runs the
# engine. tensor.py reaches those two layers at call time only (one import at its bottom,
# and function-local imports in backward/register_hook); nothing else may look upward.
ALLOWED_UPWARD = {("tensor", "ops"), ("tensor", "autograd")}


def _module_layer(path: pathlib.Path) -> tuple[str, int]:
    rel = path.relative_to(ENGINE)
    name = rel.parts[0].removesuffix(".py")
    return name, LAYERS[name]


def _engine_imports(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    pkg_depth = len(path.relative_to(ENGINE).parts) - 1
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("tinygrad_attn"):
                    parts = node.module.split(".")[1:]
                    yield from (parts[:1] or [a.name for a in node.names])
                continue
            up = node.level - 1 - pkg_depth  # levels above the package root
            if up > 0:
                continue
            base = list(path.relative_to(ENGINE).parts[:-1])[: len(
                path.relative_to(ENGINE).parts) - node.level]
            parts = base + (node.module.split(".") if node.module else [])
            if parts:
                yield parts[0]
            else:
                yield from (a.name for a in node.names)


def test_each_module_imports_only_lower_layers():
    problems = []
    for path in sorted(ENGINE.rglob("*.py")):
        name, layer = _module_layer(path)
        for target in _engine_imports(path):
            target = target.removesuffix(".py")
            if target not in LAYERS:
                problems.append(f"{path.relative_to(ROOT)} imports unknown module {target}")
            elif LAYERS[target] > layer and (name, target) not in ALLOWED_UPWARD:
                problems.append(f"{path.relative_to(ROOT)} (layer {name}) imports {target}")
    assert not problems, "\n".join(problems)


def test_only_backend_imports_numpy_or_cupy():
    offenders = []
    for path in sorted(ROOT.glob("tinygrad_attn/**/*.py")) + sorted(ROOT.glob("nn/**/*.py")):
        if path.name == "backend.py" and path.parent == ENGINE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for n in names:
                if n.split(".")[0] in ("numpy", "cupy", "cupyx"):
                    offenders.append(f"{path.relative_to(ROOT)}: import {n}")
    assert not offenders, "\n".join(offenders)


def test_nn_uses_only_the_public_engine_api():
    offenders = []
    for path in sorted(ROOT.glob("nn/**/*.py")):
        src = path.read_text()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "tinygrad_attn."
            ):
                mod = node.module.split(".")
                if any(p.startswith("_") for p in mod):
                    offenders.append(f"{path.relative_to(ROOT)}: from {node.module}")
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
                node.attr.startswith("__")
            ):
                if isinstance(node.value, ast.Name) and node.value.id in ("ta", "tinygrad_attn"):
                    offenders.append(f"{path.relative_to(ROOT)}: ta.{node.attr}")
    assert not offenders, "\n".join(offenders)
