"""ops/conv.py and nn/conv.py against torch.

ROWS (run by tests/rows_vs_torch.py): conv1d/2d, conv_transpose1d/2d, max/avg pools and
adaptive average pools with their arguments, on transposed, sliced, unbatched and empty
inputs in float32 and float64 (pools also in int64), and the errors torch raises. Then the
ledger's record of the one im2col copy, and the modules' parameter names and default init.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from rows_vs_torch import Case, arr, case_ids, check_case, randn

import nn
import tinygrad_attn as ta

F32, I64 = np.float32, np.int64


def _f(lib):
    return lib.functional if lib is ta else lib.nn.functional


def _call(name, **kwargs):
    return lambda lib, *ts: getattr(_f(lib), name)(*ts, **kwargs)


X4 = randn(2, 4, 6, 5)
X3 = randn(2, 4, 7)
W2 = randn(3, 4, 3, 2, seed=1)
B3 = randn(3, seed=2)
INTS = np.random.default_rng(3).integers(-9, 9, (2, 3, 5, 5)).astype(I64)

ROWS = {
    "conv1d": [
        # integer convolutions run, bool ones raise (as torch's kernels)
        Case(_call("conv1d"), (INTS[:, :, 0], INTS[:3, :, 1, :3])),
        Case(_call("conv1d"), (INTS[:, :, 0] > 0, INTS[:3, :, 1, :3] > 0), raises=RuntimeError),
        Case(_call("conv1d"), (X3, randn(3, 4, 3, seed=1), B3)),
        Case(_call("conv1d", stride=2, padding=2, dilation=2), (X3, randn(3, 4, 3, seed=1)),
             layout="transposed"),
        Case(_call("conv1d", padding="same"), (X3, randn(4, 4, 4, seed=1)), layout="sliced"),
        Case(_call("conv1d", groups=2, padding="valid"), (X3, randn(4, 2, 4, seed=1))),
        Case(_call("conv1d"), (X3[0], randn(3, 4, 3, seed=1))),  # unbatched
        Case(_call("conv1d"), (X3[:, :, :2], randn(3, 4, 3, seed=1)), raises=RuntimeError),
    ],
    "conv2d": [
        Case(_call("conv2d"), (X4, W2, B3)),
        Case(_call("conv2d", stride=2, padding=1), (X4, W2, B3), layout="transposed"),
        Case(_call("conv2d", stride=(1, 2), padding=(2, 0), dilation=(2, 1)), (X4, W2),
             layout="sliced"),
        Case(_call("conv2d", groups=2, padding="same"), (X4, randn(4, 2, 2, 3, seed=1))),
        Case(_call("conv2d", padding=1), (X4.astype(F32), W2.astype(F32), B3.astype(F32))),
        Case(_call("conv2d"), (X4[0], W2, B3)),  # unbatched
        Case(_call("conv2d"), (randn(0, 4, 3, 3), W2)),  # empty batch
        Case(_call("conv_transpose2d"), (randn(0, 3, 3, 3), randn(3, 2, 2, 2))),
        Case(_call("conv2d"), (X4, randn(3, 3, 3, 2)), raises=RuntimeError),  # channels
        Case(_call("conv2d"), (X4[0, 0], W2), raises=RuntimeError),  # rank
        Case(_call("conv2d"), (X4, randn(3, 4, 7, 2)), raises=RuntimeError),  # kernel > input
        Case(_call("conv2d", groups=2), (X4, randn(3, 2, 3, 2)), raises=RuntimeError),
        Case(_call("conv2d"), (X4, W2, randn(4)), raises=RuntimeError),  # bias
        Case(_call("conv2d", padding="same", stride=2), (X4, W2), raises=RuntimeError),
        Case(_call("conv2d"), (X4, W2.astype(F32)), raises=RuntimeError),  # dtypes
    ],
    "conv_transpose1d": [
        Case(_call("conv_transpose1d"), (INTS[:, :, 0], INTS[:3, :, 1, :3]), raises=RuntimeError),
        Case(_call("conv_transpose1d", stride=3, padding=1, output_padding=2),
             (X3, randn(4, 2, 3, seed=1), randn(2))),
        Case(_call("conv_transpose1d", groups=2, dilation=2), (X3, randn(4, 1, 3, seed=1)),
             layout="transposed"),
    ],
    "conv_transpose2d": [
        Case(_call("conv_transpose2d"), (X4, randn(4, 3, 3, 2, seed=1), B3)),
        Case(_call("conv_transpose2d", stride=2, padding=1, output_padding=1),
             (X4, randn(4, 3, 3, 3, seed=1), B3), layout="sliced"),
        Case(_call("conv_transpose2d", stride=(2, 3), padding=(0, 1), output_padding=(0, 1),
                   groups=2, dilation=(2, 1)), (X4, randn(4, 2, 2, 3, seed=1)),
             layout="transposed"),
        Case(_call("conv_transpose2d", stride=2), (X4.astype(F32), randn(4, 3, 2, 2,
                                                                         dtype=F32))),
        Case(_call("conv_transpose2d"), (X4[1], randn(4, 3, 3, 2, seed=1))),  # unbatched
        Case(_call("conv_transpose2d", stride=2, output_padding=2),
             (X4, randn(4, 3, 3, 2, seed=1)), raises=RuntimeError),
        Case(_call("conv_transpose2d"), (X4, randn(3, 3, 3, 2, seed=1)), raises=RuntimeError),
    ],
    "max_pool1d": [
        Case(_call("max_pool1d", kernel_size=2), (INTS[:, :, 0],), raises=RuntimeError),
        Case(_call("max_pool1d", kernel_size=3, stride=2, padding=1), (X3,)),
        Case(_call("max_pool1d", kernel_size=2, ceil_mode=True, return_indices=True), (X3,),
             layout="transposed"),
    ],
    "max_pool2d": [
        Case(_call("max_pool2d", kernel_size=2), (X4,)),
        Case(_call("max_pool2d", kernel_size=3, stride=2, padding=1, return_indices=True),
             (X4,), layout="transposed"),
        Case(_call("max_pool2d", kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2),
                   ceil_mode=True), (X4,), layout="sliced"),
        Case(_call("max_pool2d", kernel_size=2, padding=1, return_indices=True), (INTS,)),
        Case(_call("max_pool2d", kernel_size=2), (X4.astype(F32)[0],)),  # unbatched
        Case(_call("max_pool2d", kernel_size=2),
             (arr([[[[1.0, np.nan], [3.0, 2.0]]]]),)),  # NaN wins
        Case(_call("max_pool2d", kernel_size=2, padding=2), (X4,), raises=RuntimeError),
        Case(_call("max_pool2d", kernel_size=7), (X4,), raises=RuntimeError),
    ],
    "avg_pool1d": [
        Case(_call("avg_pool1d", kernel_size=2), (INTS[:, :, 0],)),
        Case(_call("avg_pool1d", kernel_size=2), (INTS[:, :, 0].astype(np.int32),),
             raises=RuntimeError),
        Case(_call("avg_pool1d", kernel_size=3, stride=2, padding=1, ceil_mode=True,
                   count_include_pad=False), (X3,)),
        Case(_call("avg_pool1d", kernel_size=2), (X3,), layout="sliced"),
    ],
    "avg_pool2d": [
        Case(_call("avg_pool2d", kernel_size=2), (X4,)),
        Case(_call("avg_pool2d", kernel_size=3, stride=2, padding=1), (X4,),
             layout="transposed"),
        Case(_call("avg_pool2d", kernel_size=3, stride=2, padding=1, ceil_mode=True,
                   count_include_pad=False), (X4,), layout="sliced"),
        Case(_call("avg_pool2d", kernel_size=(2, 3), ceil_mode=True), (X4.astype(F32),)),
        Case(_call("avg_pool2d", kernel_size=2, divisor_override=3), (X4,)),
        Case(_call("avg_pool2d", kernel_size=2, padding=1), (INTS,)),
        Case(_call("avg_pool2d", kernel_size=2, padding=2), (X4,), raises=RuntimeError),
    ],
    "adaptive_avg_pool1d": [
        Case(_call("adaptive_avg_pool1d", output_size=3), (X3,), layout="transposed"),
    ],
    "adaptive_avg_pool2d": [
        Case(_call("adaptive_avg_pool2d", output_size=(4, 3)), (X4,)),
        Case(_call("adaptive_avg_pool2d", output_size=1), (X4,), layout="sliced"),
        Case(_call("adaptive_avg_pool2d", output_size=(None, 2)), (X4.astype(F32)[0],)),
        Case(_call("adaptive_avg_pool2d", output_size=(8, 7)), (X4,), layout="transposed"),
        Case(_call("adaptive_avg_pool2d", output_size=2), (INTS,), raises=NotImplementedError),
    ],
}
PARAMS, IDS = case_ids(ROWS)


@pytest.mark.parametrize("name,k", PARAMS, ids=IDS)
def test_matches_torch(name, k):
    torch = pytest.importorskip("torch")
    check_case(ROWS[name][k], torch)


def test_bad_shapes_name_the_op_and_the_shapes():
    x, w = ta.randn(2, 4, 6, 5), ta.randn(3, 3, 3, 2)
    with pytest.raises(ta.ShapeError, match=r"conv2d: the channels of input \(2, 4, 6, 5\), "
                                            r"weight \(3, 3, 3, 2\)"):
        ta.functional.conv2d(x, w)
    with pytest.raises(ta.ShapeError, match=r"max_pool2d: .*\(2, 4, 6, 5\)"):
        ta.functional.max_pool2d(x, 7)


def test_conv_copies_the_columns_once_and_records_why():
    x = ta.randn(2, 3, 8, 8, requires_grad=True)
    w = ta.randn(4, 3, 3, 3, requires_grad=True)
    with ta.memory.profile() as prof:
        y = ta.functional.conv2d(x, w)
    reasons = [c["reason"] for c in prof.summary()["copies"]]
    assert reasons == ["im2col"]
    cols = prof.summary()["copies"][0]
    assert cols["bytes"] == 2 * 3 * 9 * 6 * 6 * 4  # (N, C, kH, kW, oH, oW) float32
    node = y.grad_fn
    assert node.saved_tensors[0] is x and node.saved_tensors[1] is w  # no new saved bytes
    with ta.memory.profile() as prof:
        ta.functional.conv2d(x, w, padding=1)
    assert [c["reason"] for c in prof.summary()["copies"]] == ["window-pad", "im2col"]


def test_pools_read_the_input_through_views_without_copies():
    x = ta.randn(2, 3, 8, 8, requires_grad=True)
    with ta.memory.profile() as prof:
        ta.functional.max_pool2d(x, 2)
        ta.functional.avg_pool2d(x, 3, 1)
    assert prof.summary()["copies"] == []
    y = ta.functional.max_pool2d(x, 2)
    (arg,) = y.grad_fn.saved_tensors
    assert arg.dtype == ta.uint8 and arg.shape == (2, 3, 4, 4)  # 1 byte per output


# ----------------------------------------------------------------------------- modules
@pytest.mark.parametrize("make", [
    lambda m: m.Conv1d(4, 6, 3, stride=2, padding=1, groups=2),
    lambda m: m.Conv2d(4, 3, (3, 2), padding=1, dilation=(2, 1)),
    lambda m: m.Conv2d(4, 2, 2, bias=False),
    lambda m: m.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
    lambda m: m.ConvTranspose1d(4, 2, 3, stride=2),
])
def test_conv_modules_have_torchs_parameters_init_and_outputs(make):
    torch = pytest.importorskip("torch")
    ours, theirs = make(nn).double(), make(torch.nn).double()
    names = [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters()] == names
    for name, p in theirs.named_parameters():
        q = dict(ours.named_parameters())[name]
        assert q.shape == tuple(p.shape)
        fan_in = theirs.weight.shape[1] * math.prod(theirs.weight.shape[2:])
        bound = 1.0 / math.sqrt(fan_in)  # torch's kaiming_uniform_(a=sqrt(5)) and bias bound
        assert np.abs(q.detach().numpy()).max() <= bound
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(torch.tensor(dict(ours.named_parameters())[name].detach().numpy()))
    x = randn(2, 4, 5) if type(ours).__name__.endswith("1d") else randn(2, 4, 5, 6)
    np.testing.assert_allclose(ours(ta.tensor(x)).detach().numpy(),
                               theirs(torch.tensor(x)).detach().numpy(), atol=1e-12)


def test_conv_init_fills_the_whole_bound_range():
    w = nn.Conv2d(16, 32, 3).weight.detach().numpy()
    bound = 1.0 / math.sqrt(16 * 9)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert abs(w.std() / (bound / math.sqrt(3)) - 1) < 0.05  # uniform's std, 4608 samples


@pytest.mark.parametrize("make", [
    lambda m: m.MaxPool2d(3, 2, 1), lambda m: m.MaxPool2d(2, return_indices=True),
    lambda m: m.AvgPool2d(3, 2, 1, count_include_pad=False),
    lambda m: m.AvgPool2d(2, ceil_mode=True, divisor_override=2),
    lambda m: m.AdaptiveAvgPool2d((2, 3)), lambda m: m.MaxPool1d(2),
    lambda m: m.AvgPool1d(3, 1), lambda m: m.AdaptiveAvgPool1d(2),
])
def test_pool_modules_match_torch(make):
    torch = pytest.importorskip("torch")
    ours, theirs = make(nn), make(torch.nn)
    x = randn(2, 3, 7) if "1d" in type(ours).__name__ else randn(2, 3, 7, 5)
    out, ref = ours(ta.tensor(x)), theirs(torch.tensor(x))
    for a, b in zip(out if isinstance(out, tuple) else (out,),
                    ref if isinstance(ref, tuple) else (ref,)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-12)
