import sys

import fake_cupy
import pytest

import tinygrad_attn as ta

REAL_CUDA = ta.cuda.is_available()  # decided before any test can install the fake

# The tiny GPT the tests share where any small model will do: two layers, two heads, fast
# enough in float64 for value checks. Tests that need something else (more heads for the
# head split, a one-layer trainer, a gradcheck-sized one) keep their own config.
TINY_GPT = dict(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not REAL_CUDA,
                                                  reason="needs CuPy and a CUDA GPU")),
    "fake-cuda",
]


def install_fake_cupy(monkeypatch):
    """Make tests/fake_cupy.py the backend's CuPy until the test ends (device "cuda:0")."""
    previous = ta.backend._install_array_module(fake_cupy)
    for name, module in fake_cupy.MODULES.items():
        if name != "cupy":
            monkeypatch.setitem(sys.modules, name, module)
    return previous


def _device(request, monkeypatch):
    if request.param != "fake-cuda":
        yield request.param
        return
    previous = install_fake_cupy(monkeypatch)
    ta.manual_seed(0)  # fresh per-device RNG streams on the fake
    try:
        yield "cuda"
    finally:
        ta.backend._install_array_module(previous)
        ta.manual_seed(0)


@pytest.fixture(params=DEVICES)
def device(request, monkeypatch):
    """Run a test on every device: "cpu", "cuda" (a real GPU; skipped cleanly without one)
    and "fake-cuda" (the CuPy code paths on tests/fake_cupy.py, whose arrays refuse
    implicit host conversion as CuPy's do). The test sees the device name "cuda" for both.
    """
    yield from _device(request, monkeypatch)


@pytest.fixture(params=DEVICES[1:])
def gpu_device(request, monkeypatch):
    """As `device` without "cpu": for tests whose CPU run is already elsewhere."""
    yield from _device(request, monkeypatch)


@pytest.fixture(autouse=True)
def _seed():
    ta.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_compile_in_flight():
    """Each test starts with numba's background compiler idle: kernels an earlier test
    queued in "auto" mode would otherwise compile during this one, and its allocations
    and page faults would land in process-wide counts a test measures (host memory)."""
    from tinygrad_attn.backend import kernels

    assert kernels.wait_compiled(600), "the background compiler did not finish in 600 s"


# ----------------------------------------------------------------------------- kernel paths
# The kernel layer's modes (docs/kernels.md). Each fixture restores the mode it found, and
# numba is imported only inside them, never when a test module is collected.
@pytest.fixture
def compiled():
    """The compiled kernel package (skips without numba)."""
    pytest.importorskip("numba")
    return ta.backend.kernels._load_compiled()


@pytest.fixture(params=["numpy", "numba"])
def mode(request):
    """Each kernel path in turn: "numpy" (the reference) and "numba" (compiled, any size)."""
    if request.param == "numba":
        pytest.importorskip("numba")
    before = ta.backend.get_kernels()
    ta.backend.set_kernels(request.param)
    yield request.param
    ta.backend.set_kernels(before)


@pytest.fixture
def numba_mode():
    """The compiled kernels at every size, for the test's duration."""
    pytest.importorskip("numba")
    before = ta.backend.get_kernels()
    ta.backend.set_kernels("numba")
    yield
    ta.backend.set_kernels(before)


def load_example(name: str):
    """examples/<name>.py imported as a module (the examples are scripts, not a package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ----------------------------------------------------------------------------- gradgradcheck
# The gradgradcheck column of the op tables: every test of tests/test_gradcheck_*.py runs
# twice, as "d1" (its gradcheck as written) and as "d2", where ta.gradcheck is
# ta.gradgradcheck with the same inputs (the same contiguous, transposed, sliced and
# broadcast views) and tolerances. An op with a gradcheck row thus has a gradgradcheck row,
# and the registry test's row check covers both (tests/test_registry.py).
# The d2 column runs each row on a contiguous and a non-contiguous (transposed) input, and
# binary rows also on a broadcast layout (where a test has only broadcast layouts, on
# those): the views' own derivatives are linear maps,
# checked at first order on every view by d1, and the second derivative of each op through
# them is the same formula; the other views would double the column's time.
D2_VIEWS = {"contiguous", "transposed"}
D2_LAYOUTS = {"contiguous", "transposed", "rhs_row", "broadcast", "expand"}
_VIEW_WORDS = ("contiguous", "transposed", "sliced", "expand", "rhs_", "lhs_", "outer",
               "scalar_tensor", "broadcast")


def _in_d2_column(item) -> bool:
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    if params.get("derivative_order") != 2:
        return True
    view, layout = params.get("view"), params.get("layout")
    if isinstance(view, str) and view not in D2_VIEWS:
        return False
    if isinstance(layout, str) and layout not in D2_LAYOUTS:
        return False
    case = params.get("case")
    if isinstance(case, str) and "-" in case:  # an on-device row: "unary-exp-sliced"
        last = case.rsplit("-", 1)[1]
        if last.startswith(_VIEW_WORDS) and last not in D2_VIEWS | D2_LAYOUTS:
            return False
    return True


def pytest_collection_modifyitems(config, items):
    dropped = [item for item in items if not _in_d2_column(item)]
    if dropped:
        keep = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in keep]
        config.hook.pytest_deselected(items=dropped)


def pytest_generate_tests(metafunc):
    if metafunc.module.__name__.startswith("test_gradcheck_") \
            and "derivative_order" in metafunc.fixturenames:
        metafunc.parametrize("derivative_order", [1, 2], indirect=True, ids=["d1", "d2"])


@pytest.fixture(autouse=True)
def derivative_order(request, monkeypatch):
    order = getattr(request, "param", 1)
    if order == 2:
        def second_order(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, **kw):
            # the cotangents need no gradient here: the first gradient's derivative with
            # respect to them is the first-order Jacobian, which the d1 row checks; the d2
            # row checks the derivative with respect to the inputs
            inputs = (inputs,) if isinstance(inputs, ta.Tensor) else tuple(inputs)
            with ta.no_grad():
                outs = fn(*inputs)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            cotangents = [ta.randn(*o.shape, dtype=o.dtype, device=o.device) for o in outs
                          if isinstance(o, ta.Tensor) and o.dtype.is_floating_point]
            return ta.gradgradcheck(fn, inputs, cotangents, eps=eps, atol=atol, rtol=rtol,
                                    **kw)

        monkeypatch.setattr(ta, "gradcheck", second_order)
    return order
