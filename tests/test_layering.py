"""The one-way flow of docs/design.md, checked: each module imports only from layers below it,
and only the backend package imports numpy or cupy."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENGINE = ROOT / "tinygrad_attn"

# lower number = lower layer; a module may import its own layer or any lower one. A package's
# modules share its layer unless listed by path: memory/state (the ledger's global state, which
# storage, autograd and ops write) and memory/scopes (the naming of module calls, which
# checkpoint reads) are pure Python at the bottom, below the rest of the memory package.
LAYERS = {
    "backend": 0, "errors": 0, "memory/state": 0, "memory/scopes": 0,
    "shape": 1, "backends": 1, "accelerator": 1,
    "storage": 2,
    "tensor": 3,
    "autograd": 4,
    "ops": 5, "creation": 5, "random": 5, "return_types": 5,
    "functional": 6, "gradcheck": 6, "checkpoint": 6, "linalg": 6, "amp": 6, "distributed": 6,
    "func": 6, "autograd/functional": 6,  # the transforms build tensors with the ops
    "cuda": 6,  # cuda.manual_seed reseeds creation's generator; cuda.amp is amp
    "memory": 7, "serialization": 7,
    "viz": 8, "utils": 8,
    "__init__": 9,
    # the compat runner maps `torch` onto the engine and nn: it imports both, so it is the top
    "compat": 10,
}
# Tensor's methods are its public face: `x.exp()` runs an op and `loss.backward()` runs the
# engine. tensor.py reaches those two layers at call time only (one import at its bottom,
# and function-local imports in backward/register_hook); nothing else may look upward.
ALLOWED_UPWARD = {("tensor", "ops"), ("tensor", "autograd")}


def _layer_key(parts) -> str:
    """The LAYERS key of a module given as path parts ("memory", "state"): the longest listed
    prefix of its path, so memory/state has its own entry and memory/ledger is "memory"."""
    parts = [p.removesuffix(".py") for p in parts]
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in LAYERS:
            return key
    return parts[0]


def _module_layer(path: pathlib.Path) -> tuple[str, int]:
    name = _layer_key(path.relative_to(ENGINE).parts)
    return name, LAYERS[name]


def _engine_imports(path: pathlib.Path):
    """The engine modules `path` imports, as LAYERS keys ("from .memory import state" names
    memory/state, "from . import ledger" inside memory/ names memory)."""
    tree = ast.parse(path.read_text())
    rel = path.relative_to(ENGINE).parts
    pkg_depth = len(rel) - 1
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if not (node.module and node.module.startswith("tinygrad_attn")):
                    continue
                parts = node.module.split(".")[1:]
            elif node.level - 1 > pkg_depth:  # levels above the package root
                continue
            else:
                parts = list(rel[:len(rel) - node.level]) + (
                    node.module.split(".") if node.module else [])
            for alias in node.names:  # an imported name may be a submodule (memory.state)
                yield _layer_key(parts + [alias.name])


def test_each_module_imports_only_lower_layers():
    problems = []
    for path in sorted(ENGINE.rglob("*.py")):
        name, layer = _module_layer(path)
        for target in _engine_imports(path):
            if target not in LAYERS:
                problems.append(f"{path.relative_to(ROOT)} imports unknown module {target}")
            elif LAYERS[target] > layer and (name, target) not in ALLOWED_UPWARD:
                problems.append(f"{path.relative_to(ROOT)} (layer {name}) imports {target}")
    assert not problems, "\n".join(problems)


def _absolute_imports():
    """(path, module name) for every absolute import in tinygrad_attn/ and nn/."""
    for path in sorted(ROOT.glob("tinygrad_attn/**/*.py")) + sorted(ROOT.glob("nn/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    yield path, a.name
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                yield path, node.module or ""


def test_only_backend_imports_numpy_or_cupy():
    offenders = [f"{path.relative_to(ROOT)}: import {n}" for path, n in _absolute_imports()
                 if n.split(".")[0] in ("numpy", "cupy", "cupyx")
                 and ENGINE / "backend" not in path.parents]
    assert not offenders, "\n".join(offenders)


def test_only_the_mpi_backend_imports_mpi4py():
    """mpi4py.MPI starts MPI when imported: one module imports it, lazily (backend/mpi.py)."""
    allowed = ENGINE / "backend" / "mpi.py"
    offenders = [f"{path.relative_to(ROOT)}: import {n}" for path, n in _absolute_imports()
                 if n.split(".")[0] == "mpi4py" and path != allowed]
    assert not offenders, "\n".join(offenders)


def test_the_ledger_state_and_scopes_import_nothing_from_the_engine():
    """memory/state and memory/scopes sit below storage: they may import each other, nothing
    else of the engine (so storage, autograd and checkpoint can import them without cycles)."""
    for name in ("state", "scopes"):
        path = ENGINE / "memory" / f"{name}.py"
        targets = set(_engine_imports(path))
        assert targets <= {"memory/state", "memory/scopes"}, (name, targets)


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
