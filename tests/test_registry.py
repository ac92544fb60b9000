"""The op registry, walked: an op is one Function class plus one registered function, and every
name the engine publishes for it (ta.ops.*, Tensor methods, ta.*, ta.functional.*,
nn.functional.*) comes from that registration. docs/adding-an-op.md is the recipe."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import pkgutil
import re
import textwrap

import pytest
import test_gradcheck_ops

import nn.functional
import tinygrad_attn as ta
import tinygrad_attn.functional
from tinygrad_attn.ops.registry import REGISTRY

ENTRIES = list(REGISTRY.values())

# Tensor's public attributes that are not ops: geometry, host values, autograd plumbing.
NOT_OPS = {
    "backward", "data", "data_ptr", "detach", "detach_", "dim", "element_size", "get_device",
    "grad", "grad_fn", "is_contiguous", "is_cpu", "is_cuda", "is_leaf", "item", "itemsize",
    "nbytes", "ndim", "ndimension", "nelement", "new_empty", "new_full", "new_ones",
    "new_tensor", "new_zeros", "numpy", "register_hook", "register_post_accumulate_grad_hook",
    "requires_grad", "requires_grad_",
    "retain_grad", "retains_grad", "shape", "shares_storage", "size", "storage",
    "storage_offset", "stride", "tolist", "untyped_storage",
}

# The op methods of torch.Tensor that ta.Tensor has; none may quietly disappear.
TORCH_METHODS = {
    "T", "abs", "absolute", "add", "add_", "addcdiv", "addcmul", "addmm", "all", "aminmax",
    "any", "argmax", "argmin", "baddbmm", "dot", "fliplr", "flipud", "mv", "nanmean",
    "nanmedian", "nansum", "outer", "ravel", "select",
    "as_strided", "bitwise_not", "bmm", "bool", "broadcast_to", "byte", "char", "chunk",
    "clamp", "clamp_", "clip", "clone", "contiguous", "copy_", "cpu", "cuda", "div", "div_",
    "divide", "double", "eq", "exp", "expand", "expand_as", "fill_", "flatten", "flip", "float",
    "floor_divide", "gather", "ge", "greater", "greater_equal", "gt", "half", "index_select",
    "int", "is_complex", "is_floating_point", "is_nonzero", "le", "less", "less_equal", "log",
    "log_softmax", "logsumexp", "long", "lt", "mT", "masked_fill", "masked_fill_", "matmul",
    "max", "maximum", "mean", "min", "minimum", "mm", "mul", "mul_", "multiply", "narrow", "ne",
    "neg", "negative", "not_equal", "numel", "permute", "pow", "relu", "remainder", "reshape",
    "reshape_as", "rsqrt", "short", "sigmoid", "softmax", "split", "sqrt", "squeeze", "std",
    "sub", "sub_", "subtract", "sum", "t", "tanh", "tile", "to", "transpose", "tril", "triu",
    "true_divide", "type", "type_as", "unbind", "unflatten", "unsqueeze", "var", "view",
    "view_as", "where", "zero_",
}

# Registered ops whose name (or a method name) is a torch function, but not ta.<name>: torch's
# function form takes other arguments than the engine's function of that name, so publishing
# it under ta would silently misread a caller (each is in docs/differences.md).
TA_SIGNATURE_DIFFERS = {
    "batch_norm": "torch.batch_norm(input, weight, bias, running_mean, running_var, ...)",
    "embedding": "torch.embedding(weight, indices): the functional form's arguments reversed",
    "kl_div": "torch.kl_div takes reduction as an int enum",
    "binary_cross_entropy_with_logits": "torch's function takes reduction as an int enum",
    "dropout": "torch.dropout(input, p, train): train has no default, and is named train",
}
# torch.exp_(x), torch.clamp_(x, ...), ...: torch's in-place function forms (undocumented) are
# the methods here (x.exp_()), all declared by the one registered function `inplace`.
IN_PLACE_METHODS = set(REGISTRY["inplace"].methods)
# ta names that are not torch functions (torch has them elsewhere).
TA_NOT_IN_TORCH = {"checkpoint"}  # torch.utils.checkpoint.checkpoint

# Names the functional modules have besides the registered functional ops.
FUNCTIONAL_EXTRAS = {"adamw_update_"}  # ta.functional: the fused optimizer step
NN_FUNCTIONAL_EXTRAS = {"linear", "multi_head_attention_forward"}  # compositions written in nn


def _op_modules():
    pkg = importlib.import_module("tinygrad_attn.ops")
    names = [f"tinygrad_attn.ops.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    return [importlib.import_module(n) for n in names] + [
        importlib.import_module("tinygrad_attn.checkpoint")]


def _op_classes():
    """Every concrete Function subclass defined in the op layer and in checkpoint.py
    (a class whose name starts with _ is a shared base, as _MinMax for Maximum/Minimum)."""
    found = []
    for module in _op_modules():
        for name, obj in vars(module).items():
            if (isinstance(obj, type) and issubclass(obj, ta.Function)
                    and obj.__module__ == module.__name__ and not name.startswith("_")):
                found.append(obj)
    return found


OP_CLASSES = _op_classes()


def _public_names(entry) -> list[str]:
    names = [f"Tensor.{m}" for m in entry.methods]
    names += [f"ta.{n}" for n in entry.ta]
    names += [f"ta.functional.{entry.name}"] * entry.functional
    return names


def _ops_calls(fn) -> set[str]:
    """The names X of every `_ops.X` that a method (or property) of tensor.py uses."""
    fn = fn.fget if isinstance(fn, property) else fn
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "_ops"}


def _classes_named_in(fn) -> set[type]:
    """The Function classes a function's code names directly (its globals, nested code too)."""
    found, codes = set(), [fn.__code__]
    while codes:
        code = codes.pop()
        for name in code.co_names:
            obj = fn.__globals__.get(name)
            if isinstance(obj, type) and issubclass(obj, ta.Function):
                found.add(obj)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return found


def test_the_registry_holds_the_ops():
    assert len(OP_CLASSES) > 50 and len(ENTRIES) > 60  # the walk below walks something
    assert REGISTRY["exp"].classes == (ta.ops.elementwise.Exp,)
    assert REGISTRY["exp"].methods == ("exp",) and REGISTRY["exp"].ta == ("exp",)
    assert REGISTRY["clamp"].ta == ("clamp", "clip") and REGISTRY["view"].ta == ()
    assert REGISTRY["gelu"].functional and not REGISTRY["gelu"].ta


def test_every_op_class_is_reachable_from_a_public_name():
    unreachable = [cls.__qualname__ for cls in OP_CLASSES
                   if not any(cls in e.classes and _public_names(e) for e in ENTRIES)]
    assert not unreachable, (
        f"Function classes no public name applies: {unreachable}; register the function that "
        "applies each with @op(TheClass, method=..., ta=..., functional=...)")


def test_each_entry_declares_the_classes_its_code_applies():
    missing = {e.name: sorted(c.__name__ for c in _classes_named_in(e.fn) - set(e.classes))
               for e in ENTRIES}
    assert not {k: v for k, v in missing.items() if v}, missing


def test_op_classes_say_what_they_save():
    silent = [cls.__qualname__ for cls in OP_CLASSES
              if not re.search(r"\bsaves\b", inspect.getdoc(cls) or "", re.IGNORECASE)]
    assert not silent, f"docstrings without a 'Saves ...' line: {silent}"


def test_declared_names_exist_and_are_the_registered_function():
    wrong = []
    for e in ENTRIES:
        in_op_layer = e.fn.__module__.startswith("tinygrad_attn.ops.")  # not checkpoint
        if in_op_layer and getattr(ta.ops, e.name, None) is not e.fn:
            wrong.append(f"ta.ops.{e.name}")
        wrong += [f"ta.{n}" for n in e.ta if getattr(ta, n, None) is not e.fn]
        if e.functional:
            for mod in (tinygrad_attn.functional, nn.functional):
                if getattr(mod, e.name, None) is not e.fn:
                    wrong.append(f"{mod.__name__}.{e.name}")
    assert not wrong, f"declared but missing or not the registered function: {wrong}"


def test_functional_modules_hold_exactly_the_registered_names():
    def functions(mod):
        return {n for n, v in vars(mod).items()
                if not n.startswith("_") and inspect.isfunction(v)}

    declared = {e.name for e in ENTRIES if e.functional}
    assert functions(tinygrad_attn.functional) == declared | FUNCTIONAL_EXTRAS
    assert functions(nn.functional) == declared | NN_FUNCTIONAL_EXTRAS
    assert set(nn.functional.__all__) == declared | NN_FUNCTIONAL_EXTRAS


def test_ta_op_names_all_come_from_the_registry():
    declared = {n for e in ENTRIES for n in e.ta}
    registered = {e.fn for e in ENTRIES}
    ops_in_ta = {n for n, v in vars(ta).items() if inspect.isfunction(v) and v in registered}
    assert ops_in_ta == declared
    assert {"exp", "softmax", "where", "checkpoint", "maximum", "clip", "sum"} <= declared


def test_every_op_torch_has_as_a_function_is_one_under_ta():
    """The walk of dir(torch) against the registry: an op the engine implements whose name
    (or a method name of it) torch has as torch.<name> is ta.<name>, unless torch's function
    takes other arguments (TA_SIGNATURE_DIFFERS, each with its reason)."""
    torch = pytest.importorskip("torch")
    missing = sorted({n for e in ENTRIES for n in (e.name, *e.methods)
                      if not n.startswith("_") and callable(getattr(torch, n, None))
                      and n not in e.ta and n not in TA_SIGNATURE_DIFFERS
                      and n not in IN_PLACE_METHODS})
    assert not missing, (f"torch has these as torch.<name>; declare @op(..., ta=True) (or "
                         f"ta=(names...)): {missing}")
    invented = sorted({n for e in ENTRIES for n in e.ta if not hasattr(torch, n)})
    assert invented == sorted(TA_NOT_IN_TORCH), invented
    assert all(callable(getattr(torch, n)) for n in TA_SIGNATURE_DIFFERS)
    assert not any(n in e.ta for e in ENTRIES for n in TA_SIGNATURE_DIFFERS)


def test_tensor_methods_trace_back_to_the_registry():
    declared = {m: e for e in ENTRIES for m in e.methods}
    public = {n for n in dir(ta.Tensor) if not n.startswith("_")}
    assert public - NOT_OPS == {m for m in declared if not m.startswith("_")}, (
        "a public Tensor attribute is neither an op method declared by @op(method=...) nor "
        "in NOT_OPS")
    wrong = []
    for name, e in declared.items():
        attr = inspect.getattr_static(ta.Tensor, name, None)
        if attr is e.fn:
            continue  # the registered function itself, attached by tensor.py
        if attr is None or name not in vars(ta.Tensor):
            wrong.append(f"Tensor.{name}: missing")
        elif e.name not in _ops_calls(attr):
            wrong.append(f"Tensor.{name}: written out in tensor.py but does not call "
                         f"_ops.{e.name}")
    assert not wrong, wrong


def test_tensor_py_calls_only_registered_functions():
    tree = ast.parse(inspect.getsource(importlib.import_module("tinygrad_attn.tensor")))
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id == "_ops"}
    assert used - set(REGISTRY) == {"names"}  # the attaching loop reads the registry


def test_expected_torch_methods_are_there():
    declared = {m for e in ENTRIES for m in e.methods}
    assert TORCH_METHODS <= declared, sorted(TORCH_METHODS - declared)
    assert all(hasattr(ta.Tensor, m) for m in TORCH_METHODS)
    x = ta.tensor([[1.0, -2.0], [3.0, 0.5]])
    assert x.exp()[0].tolist() == pytest.approx([2.718281828, 0.135335283])
    assert x.clip(min=0.0).tolist() == [[1.0, 0.0], [3.0, 0.5]]
    assert x.std(dim=1, keepdim=True).shape == (2, 1)
    assert x.floor_divide(2).tolist() == [[0.0, -1.0], [1.0, 0.0]]
    assert ta.tensor([5, 0]).bitwise_not().tolist() == [-6, -1]
    assert (~ta.tensor([True, False])).tolist() == [False, True]


def test_torch_has_the_methods_and_ours_has_torchs():
    torch = pytest.importorskip("torch")
    assert not {m for m in TORCH_METHODS if not hasattr(torch.Tensor, m)}
    invented = [f"{e.name}: Tensor.{m}" for e in ENTRIES for m in e.methods
                if not hasattr(torch.Tensor, m)]
    assert not invented, f"Tensor methods torch does not have: {invented}"
    missing = [e.name for e in ENTRIES
               if callable(getattr(torch.Tensor, e.name, None)) and e.name not in e.methods]
    assert not missing, f"torch.Tensor has these methods; declare @op(..., method=True): {missing}"


def _gradcheck_modules() -> list:
    """tests/test_gradcheck_ops.py and the files of further op families beside it
    (tests/test_gradcheck_<family>.py), each with its COVERED rows and TESTS_OF."""
    here = pathlib.Path(__file__).parent
    return [test_gradcheck_ops] + [importlib.import_module(p.stem)
                                   for p in sorted(here.glob("test_gradcheck_*.py"))
                                   if p.stem != "test_gradcheck_ops"]


def _has_gradcheck_row(entry) -> bool:
    covered = set().union(*(m.COVERED for m in _gradcheck_modules()))
    return any(n in covered or any(k.startswith(n + "_") for k in covered)
               for n in (entry.name, *entry.methods))


def test_every_differentiable_op_has_a_gradcheck_row():
    assert all(callable(t) and t.__name__.startswith("test_")
               for m in _gradcheck_modules() for t in m.TESTS_OF.values())
    missing = [e.name for e in ENTRIES if e.classes and not _has_gradcheck_row(e)]
    assert not missing, (
        f"differentiable ops without a gradcheck row in tests/test_gradcheck_ops.py: {missing}")


def test_every_gradcheck_row_is_also_a_gradgradcheck_row():
    """conftest.py runs each test of the gradcheck files as [d1-...] (gradcheck) and [d2-...]
    (gradgradcheck on the same inputs): collected, every d1 test has its d2 twin, in every
    gradcheck file, and the d2 column holds nothing else."""
    import subprocess
    import sys

    files = [pathlib.Path(m.__file__).name for m in _gradcheck_modules()]
    here = pathlib.Path(__file__).parent
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider",
                          *files], cwd=here, capture_output=True, text=True, timeout=300)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert ids, out.stdout + out.stderr
    import re

    order = re.compile(r"(?<=[\[-])d([12])(?:-|(?=\]))")
    columns: dict = {"1": set(), "2": set()}
    for i in ids:
        found = order.search(i)
        assert found, f"{i}: a gradcheck test without its d1/d2 parameter"
        columns[found.group(1)].add(order.sub("", i, count=1))
    d1, d2 = columns["1"], columns["2"]
    assert len(d1) + len(d2) == len(ids)
    assert d2 <= d1 and d2
    # every test function of every file has its d2 rows; and among the rows (ops) that d1
    # runs on a contiguous input, each has its d2 twin there and on a transposed input
    # where d1 has one (conftest's D2_VIEWS: the column's contiguous and non-contiguous)
    functions = {i.split("[")[0] for i in d1}
    assert functions == {i.split("[")[0] for i in d2}
    other_views = ("sliced", "expand", "transposed_sliced", "rhs_vector", "rhs_column",
                   "lhs_", "outer", "rhs_expand", "rhs_lead_dims", "scalar_tensor")
    for row in d1:
        tokens = row.split("[", 1)[1].rstrip("]").split("-") if "[" in row else []
        if not any(t.startswith(other_views) for t in tokens):
            assert row in d2, f"{row}: no gradgradcheck (d2) twin"
    assert {pathlib.Path(i.split("::")[0]).name for i in d1} == set(files)


def test_the_helpers_above_can_fail():
    def squarish(x):
        return x * x

    exp_class = ta.ops.elementwise.Exp
    entry = type(REGISTRY["exp"])(squarish, (exp_class,), ("squarish",), ("squarish",), True)
    assert not _has_gradcheck_row(entry)
    assert _has_gradcheck_row(REGISTRY["clamp"])  # through its row `clamp_min`
    assert _ops_calls(inspect.getattr_static(ta.Tensor, "view")) == {"view"}
    assert _ops_calls(inspect.getattr_static(ta.Tensor, "T")) == {"permute"}
    assert _classes_named_in(ta.ops.exp) == {exp_class}
    assert _classes_named_in(squarish) == set()


def _conformance_rows() -> dict:
    """{op name: rows} from every tests/test_*.py whose ROWS table runs against torch
    (through tests/rows_vs_torch.py)."""
    here = pathlib.Path(__file__).parent
    rows: dict = {}
    for path in sorted(here.glob("test_*.py")):
        source = path.read_text()
        if re.search(r"^ROWS\b", source, re.M) and re.search(
                r"^from rows_vs_torch import", source, re.M):
            for name, cases in importlib.import_module(path.stem).ROWS.items():
                rows.setdefault(name, []).extend(cases)
    return rows


def test_every_registered_op_has_conformance_rows():
    rows = _conformance_rows()
    assert "add" in rows and "cumsum" in rows and "gelu" in rows  # each runner is read
    missing = sorted(name for name in REGISTRY if not rows.get(name))
    assert not missing, (
        f"registered ops without conformance rows against torch: {missing}; add them to "
        "tests/test_conformance.py (or the family's table)")
    unknown = sorted(set(rows) - set(REGISTRY))
    assert not unknown, f"conformance rows for names the registry does not hold: {unknown}"
