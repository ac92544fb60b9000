"""The memory ledger: exact bytes, categories, copies, frees, the limit, the report."""

import gc
import tracemalloc
import weakref

import numpy as np
import pytest

import tinygrad_attn as ta
from tinygrad_attn import memory


def test_scripted_sequence_is_exact_to_the_byte():
    ta.manual_seed(0)
    start = memory.live_bytes()
    with memory.profile(source_lines=True) as prof:
        a = ta.zeros(100, 50)                      # +20000
        v = a.transpose(0, 1)[::2]                 # a view: +0
        assert memory.live_bytes() - start == 20000
        c = v.contiguous()                         # a copy of 25 x 100 floats: +10000
        line = c_line = _line_of("c = v.contiguous()")
        b = ta.ones(10, 10, dtype=ta.float64)      # +800
        del a, v                                   # a's storage freed: -20000
        d = c * 2                                  # +10000
        del c, b                                   # -10800
        assert memory.live_bytes() - start == 10000
    s = prof.summary()
    assert s["tensor_peak_above_start"] == 20000 + 10000 + 800
    assert prof.peak_bytes == start + 30800
    assert s["end_bytes"] - s["baseline_bytes"] == 10000
    copies = s["copies"]
    assert len(copies) == 1
    assert copies[0]["reason"] == "contiguous" and copies[0]["bytes"] == 10000
    assert copies[0]["shape"] == [25, 100]
    assert copies[0]["source"] == f"test_memory.py:{c_line}"
    del d
    assert line == c_line


def _line_of(text: str) -> int:
    src = open(__file__).read().splitlines()
    return next(i + 1 for i, s in enumerate(src) if text in s and "_line_of" not in s)


def test_views_add_zero_bytes():
    x = ta.randn(4, 6, 8)
    before = memory.live_bytes()
    views = [x.transpose(0, 2), x[1:, ::2], x.view(24, 8), *x.split(3, dim=1), x.unsqueeze(0),
             x.expand(2, 4, 6, 8), x.permute(2, 0, 1), x.flatten(), x.narrow(2, 1, 3)]
    assert memory.live_bytes() == before
    assert all(v.shares_storage(x) for v in views)


def test_backward_frees_saved_tensors_and_retain_graph_keeps_them():
    x = ta.randn(16, 16, requires_grad=True)
    with memory.profile() as prof:
        y = (x @ x).softmax(-1).exp().sum()
        y.backward()
        tr = prof._tracker
        assert not tr.nodes, "no node may still hold saved tensors after backward"
        assert all(c == 0 for c in tr.saved_count.values())

    x.grad = None
    with memory.profile() as prof:
        y = (x @ x).softmax(-1).exp().sum()
        y.backward(retain_graph=True)
        held = sum(prof._tracker.info[s]["bytes"] for s, c in prof._tracker.saved_count.items()
                   if c > 0)
        # matmul keeps x (pre-existing, 1 KiB), softmax its output, exp its output
        assert held == 3 * 16 * 16 * 4
        y.backward()
        assert all(c == 0 for c in prof._tracker.saved_count.values())
    np.testing.assert_allclose(x.grad.numpy(), 2 * _grad_once(x), rtol=1e-5)


def _grad_once(x):
    z = x.detach().requires_grad_()
    (z @ z).softmax(-1).exp().sum().backward()
    return z.grad.numpy()


def test_saved_slice_pins_the_whole_storage_unique_vs_nominal():
    x = ta.randn(8, 30, requires_grad=True)
    w = ta.randn(30, 30)
    with memory.profile() as prof:
        qkv = x @ w                       # (8, 30) float32 = 960 bytes
        q, k, v = qkv.split(10, dim=1)    # three views
        loss = (q * k * v).sum()          # mul saves views of qkv
        saved = prof._tracker
        del saved
        loss.backward()
    sv = prof.summary()["saved_peak"]
    mul = sv["by_op"]["Mul"]
    # q*k saves q and k, (q*k)*v saves the product (320 B) and v: the views are
    # 3 x 320 B nominal but they all pin qkv's one 960-byte storage
    assert mul["nominal_bytes"] == 320 * 4
    assert mul["unique_bytes"] == 960 + 960 + 320
    # overall each storage once: qkv, the product, and w (matmul keeps w for x.grad)
    assert sv["unique_bytes"] == 960 + 320 + w.nbytes


def test_raw_peak_at_least_tensor_peak_and_close_to_tracemalloc():
    ta.manual_seed(0)

    def work():
        a = ta.randn(256, 256)
        b = (a @ a).exp()
        c = b.softmax(-1) + a
        return c.sum().item()

    # once before measuring: a first call may load compiled kernels (numba's objects, tens
    # of MB that tracemalloc would count outside the profile, which holds loading back)
    work()
    with memory.profile(raw=True) as prof:
        work()
    s = prof.summary()
    assert s["raw_peak_bytes"] >= s["tensor_peak_above_start"] > 0
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    work()
    independent = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    assert abs(s["raw_peak_bytes"] - independent) <= 0.05 * independent


def test_limit_raises_with_summary_and_leaks_nothing():
    x = ta.randn(64, 64, requires_grad=True)
    gc.collect()
    before = memory.live_bytes()

    def step(batch):
        h = ta.randn(batch, 64) @ x
        return h.relu().sum()

    try:
        memory.set_limit(before + 200_000)
        with pytest.raises(ta.OutOfMemoryError, match=r"(?s)emulated limit .*live by category"):
            step(4096).backward()
        assert memory.live_bytes() == before
        loss = step(16)           # a smaller batch fits
        loss.backward()
    finally:
        memory.set_limit(None)
    del loss
    x.grad = None
    assert memory.live_bytes() == before


def test_limit_message_names_the_op_and_the_size():
    with memory.limit("1KiB"):
        with pytest.raises(ta.OutOfMemoryError, match=r"tried to allocate 4000 bytes"):
            ta.zeros(1000)
    assert memory.get_limit() is None


def test_parse_bytes():
    assert memory.parse_bytes("6GiB") == 6 * 2**30
    assert memory.parse_bytes("512MB") == 512 * 10**6
    assert memory.parse_bytes(100) == 100
    with pytest.raises(ValueError, match="cannot parse"):
        memory.parse_bytes("lots")


def _mlp_step():
    gc.collect()  # an earlier test's model in a reference cycle would count as live here
    ta.manual_seed(1)
    w1 = ta.randn(32, 64, requires_grad=True)
    w2 = ta.randn(64, 10, requires_grad=True)
    memory.tag(w1, "parameter")
    memory.tag(w2, "parameter")
    x, t = ta.randn(128, 32), ta.randint(0, 10, (128,))
    prof = memory.profile(source_lines=True)
    with prof:
        with memory.phase("forward"):
            with memory.scope("mlp.fc1"):
                h = (x @ w1).relu()
            with memory.scope("mlp.fc2"):
                logits = h @ w2
            loss = ta.functional.cross_entropy(logits, t)
        loss.backward()
        with memory.phase("optimizer"), ta.no_grad():
            for w in (w1, w2):
                w.sub_(w.grad * 0.1)
    return prof, (w1, w2)


def test_report_summary_and_categories_for_an_mlp_step():
    prof, (w1, w2) = _mlp_step()
    report = prof.report()
    for text in ("peak live", "Bytes at peak by category", "Saved for backward",
                 "by module", "mlp.fc1", "Copies", "Top holders at peak", "Backward peak"):
        assert text in report
    s = prof.summary()
    assert s["peak"]["bytes"] == prof.peak_bytes
    by_cat = s["peak"]["by_category"]
    assert by_cat["parameter"] == w1.nbytes + w2.nbytes
    assert set(by_cat) == set(memory.CATEGORIES)
    assert sum(by_cat.values()) == s["peak"]["bytes"]
    assert "mlp.fc1" in s["saved_peak"]["by_module"]
    assert {"forward", "backward", "optimizer"} <= {e["phase"] for e in prof.events}


def test_plot_writes_a_real_png_and_html(tmp_path):
    pytest.importorskip("matplotlib")
    prof, _ = _mlp_step()
    png = prof.plot(str(tmp_path / "memory.png"))
    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    html = open(prof.plot_html(str(tmp_path / "memory.html"))).read()
    assert "<svg" in html and '"allocations"' in html and "peak" in html


def test_fan_in_is_reported_and_summed_in_place():
    x = ta.randn(32, 32, requires_grad=True)
    with memory.profile() as prof:
        h = x * 2                          # h has three consumers
        loss = ((h * h).sum() + h.exp().sum() + h.tanh().sum())
        loss.backward()
    fan = [f for f in prof.summary()["fanout"] if f["node"] == "MulBackward"]
    assert fan and fan[0]["partials"] == 4  # h*h feeds h twice, exp and tanh once each
    assert fan[0]["in_place"] + fan[0]["new_buffer"] == 3
    assert fan[0]["in_place"] >= 2


def test_memcheck_budgets():
    x = ta.randn(16, 8, requires_grad=True)
    w = ta.randn(8, 24, requires_grad=True)

    def views_attention(x, w):
        q, k, v = (x @ w).split(8, dim=1)
        return ((q @ k.mT).softmax(-1) @ v).sum()

    prof = memory.memcheck(views_attention, x, w, max_copies=0)
    assert prof.summary()["copies"] == []

    def copying(x, w):
        return (x @ w).T.contiguous().sum()

    with pytest.raises(memory.MemoryBudgetError, match=r"1 copies > budget 0"):
        memory.memcheck(copying, x, w, max_copies=0)
    with pytest.raises(memory.MemoryBudgetError, match="saved for backward"):
        memory.memcheck(views_attention, x, w, max_saved_bytes=100)


def test_counters_outside_a_profile():
    memory.reset_peak()
    base = memory.live_bytes()
    a = ta.zeros(1000)
    b = ta.zeros(1000)
    del a, b
    assert memory.max_live_bytes() == base + 8000
    assert memory.live_bytes() == base


def test_emulated_permute_copies():
    x = ta.randn(4, 6, 8)
    with memory.emulate(permute_copies=True):
        with memory.profile() as prof:
            y = x.permute(2, 0, 1)
            z = x.transpose(0, 1)
    assert not y.shares_storage(x) and not z.shares_storage(x)
    assert [c["reason"] for c in prof.summary()["copies"]] == ["permute-copy"] * 2
    np.testing.assert_array_equal(y.numpy(), x.numpy().transpose(2, 0, 1))
    assert x.permute(2, 0, 1).shares_storage(x)  # the habit ends with the block


def _three_slices_step():
    x = ta.randn(4, 6, requires_grad=True)
    w = ta.randn(6, 18)
    qkv = x @ w                                   # (4, 18) float32: 288 bytes
    q, k, v = qkv[:, :6], qkv[:, 6:12], qkv[:, 12:]
    return (q * k + v).sum(), qkv.nbytes


def test_emulated_slice_grad_full_allocates_a_base_per_slice():
    for full, expected in ((False, 1), (True, 3)):
        loss, base_bytes = _three_slices_step()
        with memory.emulate(slice_grad_full=full), memory.profile() as prof:
            loss.backward()
        slice_grads = [c for c in prof.summary()["copies"] if c["reason"] == "slice-grad"]
        assert len(slice_grads) == expected
        assert all(c["bytes"] == base_bytes for c in slice_grads)


def test_emulated_out_of_place_grad_accumulation():
    x = ta.randn(32, 32, requires_grad=True)
    with memory.emulate(inplace_grad_accumulation=False), memory.profile() as prof:
        h = x * 2
        (h.exp().sum() + h.tanh().sum() + (h * 3).sum()).backward()
    fan = [f for f in prof.summary()["fanout"] if f["node"] == "MulBackward"][0]
    assert fan["in_place"] == 0 and fan["new_buffer"] == 2
    reasons = [c["reason"] for c in prof.summary()["copies"]]
    assert reasons.count("grad-accumulate") == 2


def test_emulated_late_free_keeps_saved_tensors_to_the_end_of_backward():
    def peak(late):
        x = ta.randn(64, 64, requires_grad=True)
        loss = x.exp().tanh().exp().tanh().sum()   # each op saves a (64, 64) output
        with memory.emulate(late_free=late), memory.profile() as prof:
            loss.backward()
        return prof.summary()["tensor_peak_above_start"]

    assert peak(True) > peak(False)


def test_head_views_backward_writes_into_the_split_buffer_without_reshape_copies():
    """q.view(B, T, nh, hs).transpose(1, 2): the gradient reaching the view is transposed,
    so reshaping it back to (B, T, C) would copy; it is written straight into the one
    buffer the split assembles instead."""
    B, T, nh, hs = 2, 5, 3, 4
    C = nh * hs
    x = ta.randn(B, T, C, dtype=ta.float64, requires_grad=True)
    w = ta.randn(C, 3 * C, dtype=ta.float64, requires_grad=True)

    def attention(x, w):
        q, k, v = (x @ w).split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hs).transpose(1, 2) for t in (q, k, v))
        y = (q @ k.mT).softmax(-1) @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)

    prof = memory.memcheck(lambda x, w: attention(x, w).sum(), x, w)
    reasons = [c["reason"] for c in prof.summary()["copies"]]
    assert reasons == ["contiguous"]  # the documented merge of the heads, nothing else
    assert ta.gradcheck(attention, [x, w])


def test_logsumexp_output_and_saved_value_are_one_storage():
    x = ta.randn(64, 32, requires_grad=True)
    before = memory.live_bytes()
    y = x.logsumexp(1)                     # (64,) output; backward keeps it as (64, 1)
    assert memory.live_bytes() - before == 64 * 4
    (kept_x, kept_y) = y.grad_fn.saved_tensor_list()
    assert kept_y.shares_storage(y) and kept_x.shares_storage(x)
    y.sum().backward()
    np.testing.assert_allclose(
        x.grad.numpy(), np.exp(x.detach().numpy() - y.detach().numpy()[:, None]), rtol=1e-5)


def test_live_bytes_and_profile_are_exact_on_the_device(device):
    """The ledger counts device allocations to the byte, per device, views add nothing,
    and backward frees what forward saved."""
    start, cpu_start = memory.live_bytes(device), memory.live_bytes("cpu")
    with memory.profile(device=device) as prof:
        a = ta.zeros(100, 50, device=device)                  # +20000
        v = a.transpose(0, 1)[::2]                            # a view: +0
        assert memory.live_bytes(device) - start == 20000
        c = v.contiguous()                                    # +10000
        b = ta.ones(10, 10, dtype=ta.float64, device=device)  # +800
        del a, v                                              # -20000
        assert memory.live_bytes(device) - start == 10800
        x = ta.randn(16, 16, device=device, requires_grad=True)
        (x @ x).softmax(-1).sum().backward()
        assert not prof._tracker.nodes
        del x, b
        assert memory.live_bytes(device) - start == 10000
    assert memory.live_bytes("cpu") == cpu_start or device == "cpu"
    s = prof.summary()
    assert s["tensor_peak_above_start"] >= 30800
    assert [(c["reason"], c["bytes"]) for c in s["copies"]] == [("contiguous", 10000)]
    del c
    assert memory.live_bytes(device) == start


def test_raw_peak_and_reserved_on_the_gpu(gpu_device):
    """On a GPU the raw peak comes from a hook on CuPy's pool: it sees temporaries inside
    ops that never become tensors, so it is at least the tensor-level peak; the pool's
    reserved bytes are reported beside the live ones."""
    device = gpu_device
    x = ta.randn(256, 256, device=device)  # 256 KiB, made before the profile
    with memory.profile(device=device, raw=True) as prof:
        y = (x * 2 + 1).exp()  # the temporary (x * 2) is freed inside the expression
        z = y.softmax(-1)
        del y
    s = prof.summary()
    assert s["tensor_peak_above_start"] == 2 * 256 * 256 * 4  # two (256, 256) at a time
    # softmax's row max / row sum live beside y and its output: the hook sees them
    assert s["raw_peak_bytes"] > s["tensor_peak_above_start"]
    assert s["reserved_end_bytes"] >= memory.live_bytes(device) >= z.nbytes + x.nbytes
    assert "CuPy pool hook" in prof.report() and "CuPy memory pool" in prof.report()


def test_limit_is_per_device(gpu_device):
    """A limit on the GPU caps the GPU's live bytes only; the CPU is not capped by it."""
    device = gpu_device
    gpu_before = memory.live_bytes(device)
    with memory.limit(gpu_before + 64 * 1024, device):
        assert memory.get_limit(device) == gpu_before + 64 * 1024
        assert memory.get_limit("cpu") is None
        big_cpu = ta.zeros(64 * 1024)  # 256 KiB on the CPU: not capped
        ok = ta.zeros(8 * 1024, device=device)  # 32 KiB fits
        with pytest.raises(ta.OutOfMemoryError,
                           match=r"(?s)out of memory on cuda:0 .*tried to allocate 65536 bytes"):
            ta.zeros(16 * 1024, device=device)
        assert memory.live_bytes(device) == gpu_before + ok.nbytes
    assert memory.get_limit(device) is None
    del big_cpu, ok


def _exps_then_tanhs():
    """20 Exp nodes save 16 KiB each and are freed; then 40 Tanh nodes save 8 bytes each."""
    x = ta.randn(64, 64, requires_grad=True)
    small = ta.randn(2, requires_grad=True)
    with memory.profile() as prof:
        exps = [(x * 1.0).exp() for _ in range(20)]  # each Exp node saves its output
        del exps
        tanhs = [(small * 1.0).tanh() for _ in range(40)]
        del tanhs
    assert sum(e["kind"] == "save" for e in prof.events) == 60
    saved = prof.summary()["saved_peak"]
    assert saved["by_op"] == {"Exp": {"unique_bytes": 20 * 64 * 64 * 4,
                                      "nominal_bytes": 20 * 64 * 64 * 4, "nodes": 20}}
    assert {n["node"] for n in saved["nodes"]} == {"ExpBackward"}


def test_nodes_are_told_apart_when_python_reuses_their_ids(monkeypatch):
    """The ledger names a node by id(node), which Python reuses once the node dies; each
    saved tensor must still be attributed to the node that saved it. Python reuses ids as
    its allocator pleases, so the run is made twice: as it comes, and with ids handed out
    the way a reusing allocator would (the next free number: the Tanh nodes get the ids of
    the dead Exp nodes)."""
    _exps_then_tanhs()
    from tinygrad_attn.memory import tracker

    live_ids = weakref.WeakKeyDictionary()  # node -> its id while it lives

    def reusing_id(node):
        if node not in live_ids:
            live_ids[node] = len(live_ids)  # safe here: nodes die in batches, never mid-run
        return live_ids[node]

    monkeypatch.setattr(tracker, "id", reusing_id, raising=False)
    _exps_then_tanhs()


def test_labelled_sets_the_labels_and_restores_them():
    from tinygrad_attn.memory import state

    before = dict(state.current)
    with state.labelled(scope="a.b", phase="optimizer"):
        st = ta.zeros(1).untyped_storage()
        assert (st.scope, st.phase) == ("a.b", "optimizer")
        with pytest.raises(RuntimeError), state.labelled(scope="inner"):
            assert memory.current_scope() == "inner"
            raise RuntimeError("restored on the way out")
        assert memory.current_scope() == "a.b"
    assert state.current == before
    with pytest.raises(KeyError, match="colour"):
        state.labelled(colour="red")

    @memory.phase("optimizer")
    def step():
        return memory.current_phase()

    assert step() == "optimizer" and memory.current_phase() == before["phase"]
    with memory.emulate(late_free=True):
        assert state.habits["late_free"] is True
    assert state.habits["late_free"] is False
