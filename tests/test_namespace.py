"""The torch-shaped namespace: `import tinygrad_attn as torch` reaches what training scripts
use (torch.nn, torch.optim, torch.device, torch.cuda, torch.amp, torch.backends, ...), with
torch's behaviour on a machine without CUDA, and docs/torch-coverage.md says what is there."""

import pickle
import subprocess
import sys
import warnings

import pytest
from conftest import REAL_CUDA

import nn
import tinygrad_attn as ta
from tinygrad_attn import backends as ta_backends

no_gpu = pytest.mark.skipif(REAL_CUDA, reason="checks torch's behaviour without a GPU")


# ----------------------------------------------------------------------------- nn and optim
def test_nn_and_optim_are_the_nn_package_itself():
    assert ta.nn is nn
    assert ta.optim is nn.optim
    assert ta.nn.functional is nn.functional
    x = ta.tensor([[1.0, 2.0, 3.0]])
    assert ta.allclose(ta.nn.functional.softmax(x, dim=-1), ta.softmax(x, dim=-1))


def test_a_torch_style_training_step_through_the_namespace():
    torch = ta
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    torch.nn.init.normal_(model.weight, mean=0.0, std=0.02)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    loss = model(torch.ones(4, 3)).pow(2).sum()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    assert float(norm) > 0
    assert not torch.allclose(model.weight.detach(), before)


def test_a_missing_name_raises_attribute_error_naming_it_and_the_docs():
    with pytest.raises(AttributeError, match=r"no_such_thing.*torch-coverage\.md"):
        ta.no_such_thing  # noqa: B018
    assert not hasattr(ta, "no_such_thing")
    assert "nn" in dir(ta) and "optim" in dir(ta)


def test_lazy_modules_are_the_engine_modules():
    import tinygrad_attn.random as random_module

    assert ta.random is random_module
    assert ta.return_types is __import__("tinygrad_attn.return_types").return_types


def test_constants_and_dtype_names():
    torch = pytest.importorskip("torch")
    assert (ta.e, ta.pi) == (torch.e, torch.pi)
    assert ta.inf == torch.inf and ta.nan != ta.nan and ta.newaxis is None
    assert isinstance(ta.float32, ta.dtype)
    x = ta.arange(3)
    assert x[:, ta.newaxis].shape == (3, 1)


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
def test_finfo_matches_torch(name):
    torch = pytest.importorskip("torch")
    ours, theirs = ta.finfo(getattr(ta, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution"):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.dtype == theirs.dtype
    assert ta.finfo().dtype == torch.finfo().dtype == "float32"


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32", "int64"])
def test_iinfo_matches_torch(name):
    torch = pytest.importorskip("torch")
    ours, theirs = ta.iinfo(getattr(ta, name)), torch.iinfo(getattr(torch, name))
    assert (ours.bits, ours.max, ours.min, ours.dtype) == (
        theirs.bits, theirs.max, theirs.min, theirs.dtype)


def test_finfo_and_iinfo_refuse_the_other_kind_as_torch():
    torch = pytest.importorskip("torch")
    for ours, theirs in ((lambda: ta.finfo(ta.int32), lambda: torch.finfo(torch.int32)),
                         (lambda: ta.iinfo(ta.float32), lambda: torch.iinfo(torch.float32)),
                         (lambda: ta.iinfo(ta.bool), lambda: torch.iinfo(torch.bool))):
        with pytest.raises(TypeError):
            theirs()
        with pytest.raises(TypeError):
            ours()


# ----------------------------------------------------------------------------- device
@pytest.mark.parametrize("args", [("cpu",), ("cuda",), ("cuda:1",), ("cuda", 2), (3,),
                                  ("cpu", 0)])
def test_device_type_index_and_repr_match_torch(args):
    torch = pytest.importorskip("torch")
    ours = ta.device(*args)
    try:
        theirs = torch.device(*args)
    except RuntimeError:  # torch refuses an integer device without an accelerator
        assert args == (3,)
        assert (ours.type, ours.index, repr(ours)) == ("cuda", 3, "device(type='cuda', "
                                                       "index=3)")
        return
    assert (ours.type, ours.index, repr(ours), str(ours)) == (
        theirs.type, theirs.index, repr(theirs), str(theirs))


@pytest.mark.parametrize("args", [("gpu",), ("cuda:x",), ("cuda:-1",), ("cpu", -1),
                                  ("cuda:1", 1)])
def test_bad_devices_raise_torchs_runtime_error(args):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError):
        torch.device(*args)
    with pytest.raises(RuntimeError, match="evice"):
        ta.device(*args)


def test_device_goes_wherever_a_device_string_goes():
    cpu = ta.device("cpu")
    x = ta.zeros(2, device=cpu)
    assert x.device == cpu == "cpu"
    assert x.to(cpu).device == "cpu"
    assert ta.device("cuda", 1) == ta.device("cuda:1") != ta.device("cuda")
    assert ta.device(cpu) is cpu
    assert {ta.device("cpu"): 1}["cpu"] == 1
    again = pickle.loads(pickle.dumps(ta.device("cuda", 1)))
    assert (again.type, again.index) == ("cuda", 1)


def test_device_as_a_default_device_block():
    with ta.device("cpu"):
        assert ta.zeros(2).device == "cpu"
    with pytest.raises(NotImplementedError, match="pass device="):
        with ta.device("cuda"):
            pass


def test_device_refuses_types_the_engine_lacks():
    with pytest.raises(RuntimeError, match="'mps'"):
        ta.device("mps")


# ----------------------------------------------------------------------------- grad modes
def test_inference_mode_as_context_manager_records_nothing():
    w = ta.ones(2, requires_grad=True)
    with ta.inference_mode():
        y = w * 2
        assert not ta.is_grad_enabled() and ta.is_inference_mode_enabled()
    assert not y.requires_grad and y.grad_fn is None
    assert ta.is_grad_enabled() and not ta.is_inference_mode_enabled()
    with ta.inference_mode(False):
        assert (w * 2).requires_grad and not ta.is_inference_mode_enabled()


@pytest.mark.parametrize("lib_name", ["torch", "tinygrad_attn"])
def test_inference_mode_as_decorator_with_and_without_call(lib_name):
    lib = pytest.importorskip(lib_name)

    @lib.inference_mode
    def bare():
        return lib.is_grad_enabled()

    @lib.inference_mode()
    def called():
        return lib.is_grad_enabled()

    @lib.inference_mode(mode=False)
    def off():
        return lib.is_grad_enabled()

    assert (bare(), called(), off()) == (False, False, True)


@pytest.mark.parametrize("lib_name", ["torch", "tinygrad_attn"])
def test_no_grad_and_enable_grad_as_bare_decorators(lib_name):
    lib = pytest.importorskip(lib_name)

    @lib.no_grad
    def off():
        return lib.is_grad_enabled()

    @lib.enable_grad
    def on():
        return lib.is_grad_enabled()

    with lib.no_grad():
        assert (off(), on(), lib.is_grad_enabled()) == (False, True, False)
    assert lib.is_grad_enabled()


def test_no_grad_refuses_an_argument_that_is_not_a_function():
    with pytest.raises(TypeError, match=r"no_grad\(\) takes no arguments"):
        ta.no_grad(1)  # torch returns a decorator that fails later, at the call


# ----------------------------------------------------------------------------- cuda
@no_gpu
def test_cuda_without_a_gpu_behaves_as_torchs():
    torch = pytest.importorskip("torch")
    for lib in (torch, ta):
        assert lib.cuda.is_available() is False
        assert lib.cuda.device_count() == 0
        assert lib.cuda.is_bf16_supported() is False
        assert lib.cuda.empty_cache() is None
        assert lib.cuda.manual_seed(1) is None and lib.cuda.manual_seed_all(1) is None
        assert lib.cuda.memory_allocated() == lib.cuda.max_memory_allocated() == 0
        assert lib.cuda.memory_reserved() == 0
        with pytest.raises(AssertionError):
            lib.cuda.current_device()
        with pytest.raises(AssertionError):
            lib.cuda.get_device_name()


@no_gpu
def test_cuda_manual_seed_without_a_gpu_leaves_the_cpu_stream_alone():
    ta.manual_seed(5)
    expected = ta.rand(4)
    ta.manual_seed(5)
    ta.cuda.manual_seed(123)
    ta.cuda.manual_seed_all(123)
    assert ta.rand(4).tolist() == expected.tolist()


def test_cuda_accelerator_and_amp_with_a_gpu(monkeypatch):
    """On tests/fake_cupy.py's GPU: the queries answer for it, and autocast and GradScaler,
    which would change results there, refuse instead of running uncast or unscaled."""
    from conftest import install_fake_cupy

    previous = install_fake_cupy(monkeypatch)
    try:
        assert ta.cuda.is_available() and ta.cuda.device_count() >= 1
        assert ta.cuda.current_device() == 0 and ta.accelerator.current_device_index() == 0
        assert ta.accelerator.current_accelerator() == ta.device("cuda")
        assert ta.cuda.empty_cache() is None and ta.cuda.is_bf16_supported() is False
        ta.cuda.set_device(0)
        ta.cuda.reset_peak_memory_stats()
        before = ta.cuda.memory_allocated()
        x = ta.zeros(256, device="cuda")
        assert ta.cuda.memory_allocated() - before == 256 * 4
        del x
        assert ta.cuda.max_memory_allocated() - before == 256 * 4
        assert ta.cuda.memory_allocated() == before
        assert ta.cuda.memory_reserved() >= 0
        ta.manual_seed(3)
        expected = ta.rand(3, device="cuda").cpu().tolist()
        ta.cuda.manual_seed_all(3)  # reseeds the default generator, GPU streams included
        assert ta.rand(3, device="cuda").cpu().tolist() == expected
        with pytest.raises(NotImplementedError, match="autocast"):
            ta.autocast("cuda")
        with pytest.raises(NotImplementedError, match="loss scaling"):
            ta.amp.GradScaler()
        with ta.autocast("cuda", enabled=False):
            pass
    finally:
        ta.backend._install_array_module(previous)


# ----------------------------------------------------------------------------- backends
def test_backend_flags_are_recorded():
    torch = pytest.importorskip("torch")
    for lib in (torch, ta):
        matmul, cudnn = lib.backends.cuda.matmul, lib.backends.cudnn
        saved = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic,
                 cudnn.enabled, lib.get_float32_matmul_precision())
        assert saved == (False, True, False, False, True, "highest"), lib.__name__
        try:
            matmul.allow_tf32 = cudnn.allow_tf32 = True
            cudnn.benchmark = cudnn.deterministic = True
            assert (matmul.allow_tf32, cudnn.benchmark, cudnn.deterministic) == (True,) * 3
            lib.set_float32_matmul_precision("high")
            assert lib.get_float32_matmul_precision() == "high"
            with pytest.warns(UserWarning):
                lib.set_float32_matmul_precision("fastest")
            assert lib.get_float32_matmul_precision() == "high"
            lib.set_float32_matmul_precision("highest")
            assert matmul.allow_tf32 is False  # the precision and the flag are one setting
        finally:
            (matmul.allow_tf32, cudnn.allow_tf32, cudnn.benchmark, cudnn.deterministic,
             cudnn.enabled) = saved[:5]
            lib.set_float32_matmul_precision(saved[5])
        assert lib.backends.mps.is_available() is False
        assert lib.backends.cudnn.is_available() is False


def test_float32_matmuls_are_unchanged_by_the_tf32_flags():
    a, b = ta.randn(8, 8), ta.randn(8, 8)
    before = a @ b
    ta.backends.cuda.matmul.allow_tf32 = True
    try:
        assert (a @ b).tolist() == before.tolist()
    finally:
        ta.backends.cuda.matmul.allow_tf32 = False


def test_compile_returns_the_model_and_says_so_once(capsys, monkeypatch):
    monkeypatch.setattr(ta_backends, "_said", [False])
    model = nn.Linear(2, 2)
    assert ta.compile(model) is model
    assert ta.compile(model, mode="max-autotune", fullgraph=True) is model

    @ta.compile(dynamic=True)
    def f(x):
        return x + 1

    assert f(1) == 2
    err = capsys.readouterr().err
    assert err.count("compile() returns the model unchanged") == 1


# ----------------------------------------------------------------------------- amp
@no_gpu
def test_autocast_for_cuda_without_a_gpu_warns_and_is_disabled():
    torch = pytest.importorskip("torch")
    for lib in (torch, ta):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            with lib.autocast(device_type="cuda", dtype=lib.float16):
                assert not lib.is_autocast_enabled()
        with pytest.warns(UserWarning):
            ctx = lib.amp.autocast("cuda")
        with ctx:
            y = lib.ones(2) * 2
        assert y.dtype == lib.float32
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with lib.cuda.amp.autocast():
                pass
        assert {w.category for w in seen} == {FutureWarning, UserWarning}


def test_autocast_disabled_is_a_no_op_and_enabled_on_cpu_refuses():
    with ta.autocast("cpu", enabled=False):
        assert ta.ones(2).dtype == ta.float32
    with pytest.raises(NotImplementedError, match="bfloat16"):
        ta.autocast("cpu", dtype=ta.bfloat16)
    with pytest.raises(NotImplementedError, match="autocast"):
        ta.amp.autocast("cpu", dtype=ta.float16)
    with pytest.raises(RuntimeError, match="device_type"):
        ta.autocast("tpu")


@no_gpu
def test_gradscaler_without_a_gpu_is_torchs_pass_through():
    torch = pytest.importorskip("torch")
    results = []
    for lib in (torch, ta):
        with pytest.warns(UserWarning, match="CUDA is not available"):
            scaler = lib.amp.GradScaler()
        w = lib.tensor([1.0, 2.0], requires_grad=True)
        opt = lib.optim.SGD([w], lr=0.5)
        loss = (w * w).sum()
        assert scaler.scale(loss) is loss
        scaler.scale(loss).backward()
        assert scaler.unscale_(opt) is None
        assert scaler.step(opt) is None
        assert scaler.update() is None
        assert (scaler.is_enabled(), scaler.get_scale(), scaler.state_dict()) == (
            False, 1.0, {})
        assert scaler.load_state_dict({}) is None
        results.append(w.detach().tolist())
        with pytest.warns(FutureWarning), pytest.warns(UserWarning):
            lib.cuda.amp.GradScaler()
    assert results[0] == results[1] == [0.0, 0.0]


def test_gradscaler_disabled_and_enabled_on_cpu():
    assert not ta.amp.GradScaler("cpu", enabled=False).is_enabled()
    with pytest.raises(NotImplementedError, match="loss scaling"):
        ta.amp.GradScaler("cpu")


# ----------------------------------------------------------------------------- bfloat16
def test_bfloat16_is_a_name_whose_tensors_are_refused():
    assert repr(ta.bfloat16) == "tinygrad_attn.bfloat16"
    assert ta.bfloat16.is_floating_point and ta.bfloat16.itemsize == 2
    assert pickle.loads(pickle.dumps(ta.bfloat16)) is ta.bfloat16
    assert ta.bfloat16 != ta.float16
    for make in (lambda: ta.zeros(2, dtype=ta.bfloat16), lambda: ta.ones(2).to(ta.bfloat16),
                 lambda: ta.tensor([1.0], dtype="bfloat16"),
                 lambda: ta.randn(2, dtype=ta.bfloat16)):
        with pytest.raises(TypeError, match="bfloat16 is not supported"):
            make()


# ----------------------------------------------------------------------------- accelerator
@no_gpu
def test_accelerator_without_a_gpu_matches_torch():
    torch = pytest.importorskip("torch")
    for lib in (torch, ta):
        assert lib.accelerator.is_available() is False
        assert lib.accelerator.current_accelerator() is None
        assert lib.accelerator.device_count() == 0
        with pytest.raises(RuntimeError):
            lib.accelerator.current_device_index()


# ----------------------------------------------------------------------------- distributed
def test_distributed_names_before_init_behave_as_torchs():
    import importlib.util

    from tinygrad_attn.distributed import destroy_process_group, get_rank

    # mpi4py is the distributed extra; asking does not start MPI
    assert ta.distributed.is_available() is (importlib.util.find_spec("mpi4py") is not None)
    assert ta.distributed.is_initialized() is False
    assert ta.distributed.ReduceOp.SUM == 0 and ta.distributed.group.WORLD is None
    assert ta.distributed.Backend("GLOO") == ta.distributed.Backend.GLOO == "gloo"
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        get_rank()
    with pytest.raises(AssertionError, match="Process group cannot be None"):
        destroy_process_group()
    with pytest.raises(RuntimeError, match="NCCL backend is not built"):
        ta.distributed.init_process_group(backend="nccl")
    with pytest.raises(RuntimeError, match="all_to_all: not implemented in tinygrad_attn"):
        ta.distributed.all_to_all([], [])


def test_nn_parallel_wrappers_raise_on_use():
    from nn.parallel import DataParallel

    assert nn.DataParallel is DataParallel
    model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="DataParallel: "):
        DataParallel(model, device_ids=[0])


# ----------------------------------------------------------------------------- nn.modules
def test_nn_modules_paths_give_the_nn_classes():
    from nn.modules.activation import ReLU
    from nn.modules.container import Sequential
    from nn.modules.linear import Linear
    from nn.modules.module import Module

    assert (Linear, ReLU, Sequential, Module) == (nn.Linear, nn.ReLU, nn.Sequential,
                                                  nn.Module)
    assert nn.modules.LayerNorm is nn.LayerNorm
    assert "Linear" in dir(nn.modules.linear)


def test_nn_modules_missing_class_names_it():
    with pytest.raises(AttributeError, match=r"nn\.modules\.linear\.Bilinear: the engine has "
                                             r"no nn\.Bilinear"):
        nn.modules.linear.Bilinear  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'Conv2d'"):
        nn.modules.linear.Conv2d  # noqa: B018 - torch has it in conv, not linear


def test_nn_modules_files_hold_torchs_names_and_every_nn_class_torch_places_there():
    torch = pytest.importorskip("torch")
    import importlib

    for short in nn.modules._FILES:
        file = short.__name__.rsplit(".", 1)[-1]
        theirs = importlib.import_module(f"torch.nn.modules.{file}")
        assert set(short.NAMES) <= set(dir(theirs)), file
        for name in short.NAMES:
            if hasattr(nn, name):
                assert getattr(short, name) is getattr(nn, name)
    for name in dir(torch.nn):
        cls = getattr(torch.nn, name)
        where = getattr(cls, "__module__", "") or ""
        if isinstance(cls, type) and where.startswith("torch.nn.modules.") and hasattr(nn,
                                                                                      name):
            file = where.split(".")[3]
            if hasattr(nn.modules, file):
                assert getattr(getattr(nn.modules, file), name) is getattr(nn, name), name


# ----------------------------------------------------------------------------- coverage
@pytest.fixture(scope="module")
def coverage_check():
    pytest.importorskip("torch")
    # a fresh interpreter: dir(torch) grows as the suite imports torch's submodules
    run = subprocess.run([sys.executable, "tests/torch_coverage.py", "--check"],
                         capture_output=True, text=True, cwd=nn.__file__.rsplit("/", 2)[0],
                         timeout=300)
    return run.stdout + run.stderr


def test_every_torch_name_is_provided_or_placed(coverage_check):
    assert "in no group and not in GAPS" not in coverage_check, coverage_check


def test_the_coverage_page_is_what_the_script_generates(coverage_check):
    assert "every name placed, page current" in coverage_check, coverage_check
