"""ta.memory.plan: predictions checked against measured steps, choices against budgets.

(a) a chain of matmuls and gelus whose saved bytes are counted by hand; (b) a one-block GPT
(nn.memory_plan); (c) the plan as data, its text, and its argument errors. Every plan that
says it fits is run under ta.memory.limit(budget) (Plan.verify): an OutOfMemoryError there
fails the test.
"""

import itertools
import json
import os
import time

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn.memory_plan import apply, gpt_knobs, gpt_step
from tinygrad_attn.memory import planner

# The raw peaks these tests predict and check are tracemalloc's, which is process-wide: in
# the whole suite's process, objects other tests left behind (threads, caches) land in it
# and move the raw figures by tens of KB, as much as the chain's choices differ by. So the
# file runs in a fresh interpreter of its own: tests/test_memory_plan_fresh.py starts it
# with FRESH_ENV set; in any other process every test here skips, saying so.
FRESH_ENV = "TINYGRAD_ATTN_PLANNER_TESTS"
pytestmark = pytest.mark.skipif(
    os.environ.get(FRESH_ENV) != "1",
    reason="run in a fresh process by tests/test_memory_plan_fresh.py (tracemalloc is "
           "process-wide)")

# ----------------------------------------------------------------------------- (a) a chain
D = 64  # width: one activation row is D * 4 = 256 bytes
ACT = D * 4
CHAIN_KNOBS = {"checkpoint": [False, True], "gelu": ["save", "recompute"]}
# bytes: tracemalloc's peak is process-wide, so Python objects made by other threads and by
# earlier tests' leftovers land in it: alone, two runs of one step differ by tens of bytes;
# inside the whole suite (CI's first run) a verify measured 26.6 KB above the prediction
RAW_NOISE = 64 * 1024
MEASURE = (4, 8)  # larger than (1, 2): tracemalloc's Python-object noise is ~1 KB per event


class Clock:
    """A timer the chain's step advances by a known cost, so the choice of least time is
    deterministic: 1 per row, +0.25 for the checkpoint's recompute, +0.5 for rebuilding
    the gelu outputs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def chain_step(clock, device="cpu"):
    """x -> gelu(. @ W0) -> gelu(. @ W1) -> gelu(. @ W2) -> gelu(. @ W3) -> sum of squares,
    the second layer under ta.checkpoint or not, gelu's save policy as chosen; SGD step."""

    def step(batch, choice):
        ta.manual_seed(0)
        ws = [ta.randn(D, D, requires_grad=True, device=device) for _ in range(4)]
        for w in ws:
            ta.memory.tag(w, "parameter")
        opt = nn.optim.SGD(ws, lr=0.1)
        x = ta.randn(batch, D, device=device)
        with ta.memory.save_policies(gelu=choice["gelu"]):
            def layer(i):
                return lambda h: ta.functional.gelu(h @ ws[i])

            h = layer(0)(x)
            h = ta.checkpoint(layer(1), h) if choice["checkpoint"] else layer(1)(h)
            h = layer(3)(layer(2)(h))
            (h * h).sum().backward()
        opt.step()
        opt.zero_grad()
        clock.now += batch * (1 + 0.25 * choice["checkpoint"]
                              + 0.5 * (choice["gelu"] == "recompute"))

    return step


def chain_saved(choice, batch):
    """Saved for backward at its peak, by hand (pre_i = h @ W_i, g_i = gelu(pre_i); the
    weights are parameters, left out). Each matmul keeps its input, each gelu its input,
    the final square g3; "recompute" keeps gelu outputs as recipes (rebuilt from pre_i);
    the checkpoint keeps its input g0 (a recipe too under "recompute") and its output g1
    is a plain tensor (detached: no producer to rebuild it from), pre1 not at all."""
    act = batch * ACT
    table = {
        (False, "save"): 9,  # x, pre0..pre3, g0..g3
        (False, "recompute"): 5,  # x, pre0..pre3
        (True, "save"): 8,  # x, pre0, g0, g1, pre2, g2, pre3, g3
        (True, "recompute"): 5,  # x, pre0, g1, pre2, pre3
    }
    return table[(choice["checkpoint"], choice["gelu"])] * act


def measured(step, batch, choice):
    with ta.memory.profile(raw=True) as prof:
        step(batch, choice)
    s = prof.summary()
    return s["tensor_peak_above_start"], s["saved_peak"]["unique_bytes_without_parameters"]


@pytest.fixture(scope="module")
def chain():
    clock = Clock()
    step = chain_step(clock)
    wide = ta.memory.plan(step, "1GiB", batch=64, knobs=CHAIN_KNOBS, measure_batches=MEASURE,
                          timer=clock)
    return clock, step, wide


def test_chain_predicted_saved_and_peak_bytes_are_exact(chain):
    clock, step, wide = chain
    assert [a["choice"] for a in wide.alternatives] == [
        dict(zip(CHAIN_KNOBS, v)) for v in itertools.product(*CHAIN_KNOBS.values())]
    for alt in wide.alternatives:
        assert alt["aligned"]
        assert alt["saved"] == chain_saved(alt["choice"], 64)
        peak, saved = measured(step, 64, alt["choice"])
        assert (alt["peak"], saved) == (peak, alt["saved"])
        assert alt["raw_peak"] >= alt["peak"]
        assert alt["seconds"] == 64 * (1 + 0.25 * alt["choice"]["checkpoint"]
                                       + 0.5 * (alt["choice"]["gelu"] == "recompute"))
    # and at a batch the fit never saw, through the fitted lines themselves
    model = planner.fit_lines([planner._measure(step, b, {"checkpoint": True, "gelu": "save"},
                                                "cpu") for b in MEASURE])
    assert planner.predict_peak(model, 40) == measured(step, 40, {"checkpoint": True,
                                                                 "gelu": "save"})[0]


def _cost(choice):
    return 1 + 0.25 * choice["checkpoint"] + 0.5 * (choice["gelu"] == "recompute")


def test_chain_budget_sweep_chooses_the_fastest_that_fits_and_runs_under_the_limit(chain):
    clock, step, wide = chain
    needs = sorted({max(a["raw_peak"], a["peak"]) for a in wide.alternatives}, reverse=True)
    budgets = [needs[0] + 10**6] + [b for n in needs for b in (n, n - 1)]
    raw_peaks, peaks, predicted_raw, chosen = [], [], [], []
    for budget in budgets:
        p = wide.replan(budget, batch=64)  # the same fits, another budget
        fitting = [a for a in p.alternatives if max(a["raw_peak"], a["peak"]) <= budget]
        assert p.fits == bool(fitting)
        if not fitting:
            assert budget == needs[-1] - 1  # only below the least need
            assert p.needs["budget"] == needs[-1] and p.needs["largest_batch"] < 64
            continue
        best = min(fitting, key=lambda a: (_cost(a["choice"]), p.alternatives.index(a)))
        assert p.choice == best["choice"]
        chosen.append(p.choice)
        v = p.verify(step, flops=True)  # under ta.memory.limit(budget): an OOM fails here
        assert v["peak"] == p.peak <= budget  # the tensor peak: exact, within the limit
        assert v["raw_peak"] <= budget + RAW_NOISE
        # the recomputed work: the checkpoint reruns layer 1's matmul (64, D) @ (D, D),
        # 2 FLOPs a multiply-add; gelu counts none (torch's FlopCounterMode convention)
        assert p.recompute_flops == 2 * 64 * D * D * p.choice["checkpoint"]
        assert (v["recompute_flops"], v["recomputed_ops"]) == (p.recompute_flops,
                                                                p.recomputed_ops)
        raw_peaks.append(v["raw_peak"])
        peaks.append(v["peak"])
        predicted_raw.append(p.raw_peak)
    assert chosen[0] == {"checkpoint": False, "gelu": "save"}  # all fit: the default, fastest
    assert len({json.dumps(c) for c in chosen}) >= 2
    assert predicted_raw == sorted(predicted_raw, reverse=True)
    # the measured peaks are monotone as the budget shrinks: the tensor peak exactly, the
    # raw peak up to tracemalloc's noise between two runs of one step (tens of bytes)
    assert peaks == sorted(peaks, reverse=True)
    assert all(b <= a + RAW_NOISE for a, b in zip(raw_peaks, raw_peaks[1:]))


def test_chain_recompute_flops_and_ops_are_exact_at_every_batch(chain):
    clock, step, wide = chain
    for batch in (1, 3, 64, 1000):
        p = wide.replan("1TiB", batch=batch)
        for alt in p.alternatives:
            c = alt["choice"]
            assert alt["recompute_flops"] == 2 * batch * D * D * c["checkpoint"]
            # the rerun runs layer 1's matmul and gelu; "recompute" rebuilds each gelu
            # output kept as a recipe, once per node that needs it: g0, g1, g2 (the next
            # matmuls' inputs) and g3 twice (the square's Mul keeps both operands); under
            # the checkpoint g1 is its plain output (no recipe) and g0 its saved input
            assert alt["recomputed_ops"] == (2 * c["checkpoint"]
                                             + (c["gelu"] == "recompute") * (
                                                 5 - c["checkpoint"]))


def test_chain_reasons_name_the_tensors_each_knob_stops_saving(chain):
    clock, step, wide = chain
    p = ta.memory.Plan.from_dict(dict(wide.to_dict(), choice={"checkpoint": True,
                                                              "gelu": "save"}))
    p = p.replan("1GiB", batch=64, knobs={"checkpoint": [True], "gelu": ["save"]})
    assert p.reasons["checkpoint"]["option"] is True
    full = wide.replan("1GiB", batch=64)  # defaults chosen: nothing to explain
    assert all(r["no_longer_saved"] == [] for r in full.reasons.values())
    # against the default (no checkpoint): pre1 = g0 @ W1 is saved no more, 64 rows of D
    plain = planner._Model.from_data(wide.models[0])
    ckpt = planner._Model.from_data(wide.models[2])
    assert wide.alternatives[2]["choice"] == {"checkpoint": True, "gelu": "save"}
    freed, added = planner.tensor_changes(plain, ckpt, 64)
    assert sum(r["bytes"] for r in freed) - sum(r["bytes"] for r in added) == ACT * 64
    assert any("what" in r and r["what"].startswith("float32[64, 64] from Matmul")
               and "test_memory_plan.py:" in r["what"] for r in freed), freed
    # the tensors' shapes and bytes follow the batch: at 1000 rows, 1000 x D floats each
    freed_1000 = planner.tensor_changes(plain, ckpt, 1000)[0]
    assert all(r["bytes"] % (1000 * ACT) == 0 for r in freed_1000)
    assert all("float32[1000, 64]" in r["what"] for r in freed_1000 if "what" in r)
    need = max(wide.alternatives[2]["raw_peak"], wide.alternatives[2]["peak"])
    chosen = wide.replan(need, batch=64)
    assert chosen.choice == {"checkpoint": True, "gelu": "save"}
    text = str(chosen)
    assert "no longer saved:" in text and "from Matmul" in text


def test_chain_without_batch_finds_the_largest_batch(chain):
    clock, step, wide = chain
    budget = wide.alternatives[0]["raw_peak"]  # the default's need at 64
    p = ta.memory.plan(step, budget, knobs=CHAIN_KNOBS, measure_batches=MEASURE, timer=clock)
    assert p.fits and p.batch == max(a["largest_batch"] for a in p.alternatives) >= 64
    assert p.raw_peak <= budget
    assert p.choice == min((a for a in p.alternatives if a["fits"]),
                           key=lambda a: _cost(a["choice"]))["choice"]
    assert not p.replan(budget, batch=p.batch + 1).fits
    assert p.replan(budget) == p  # the same data, the same plan
    v = p.verify(step)
    assert v["peak"] == p.peak and v["raw_peak"] <= budget


def test_chain_nothing_fits_names_what_it_would_need(chain):
    clock, step, wide = chain
    p = wide.replan("1KiB", batch=64)
    least = min(wide.alternatives, key=lambda a: max(a["raw_peak"], a["peak"]))
    assert not p.fits and p.choice == least["choice"]
    assert p.needs["budget"] == max(least["raw_peak"], least["peak"])
    assert p.needs["largest_batch"] == 0
    assert "DOES NOT FIT" in str(p) and "not even batch 1" in str(p)


def test_chain_on_the_gpu_plans_against_the_pool_hooks_peak(gpu_device):
    """On a GPU (or the fake CuPy) the raw peak is the pool hook's, one number a run, fitted
    through the two peaks; the tensor peak is exact as on the CPU."""
    clock = Clock()
    step = chain_step(clock, gpu_device)
    wide = ta.memory.plan(step, "1GiB", batch=32, knobs=CHAIN_KNOBS, measure_batches=MEASURE,
                          timer=clock, device=gpu_device)
    assert wide.device == "cuda:0"
    for alt in wide.alternatives:
        assert alt["saved"] == chain_saved(alt["choice"], 32)
    budget = min(max(a["raw_peak"], a["peak"]) for a in wide.alternatives)
    p = wide.replan(budget, batch=32)
    assert p.fits
    v = p.verify(step)  # under ta.memory.limit(budget, "cuda:0")
    assert v["peak"] == p.peak and v["raw_peak"] <= budget


# ----------------------------------------------------------------------------- (b) a GPT
GPT_CFG = nn.GPTConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16,
                       attn_block_size=8)


def gpt_cost(choice):
    """The test's clock for the GPT step (real step times at this size are noise): flash a
    little cheaper than views, rebuilding the outputs and recomputing blocks dearer."""
    return (1 + 0.125 * (choice["attn"] == "views") + 0.5 * (choice["policy"] == "recompute")
            + 0.25 * len(choice["checkpoint"]))


@pytest.fixture(scope="module")
def gpt():
    clock, run = Clock(), gpt_step(GPT_CFG)

    def step(batch, choice):
        run(batch, choice)
        clock.now += batch * gpt_cost(choice)

    knobs = gpt_knobs(GPT_CFG)
    wide = ta.memory.plan(step, "1GiB", batch=4, knobs=knobs, timer=clock)
    return step, knobs, wide


def test_gpt_knobs():
    assert gpt_knobs(GPT_CFG) == {"attn": ["views", "flash"], "policy": ["save", "recompute"],
                                  "checkpoint": [[], [0]]}
    three = gpt_knobs(nn.GPTConfig(vocab_size=65, block_size=8, n_layer=3, n_head=2,
                                   n_embd=8), attention=("flash",))
    # equal blocks save equal bytes: the earliest first (their recompute comes last)
    assert three["checkpoint"] == [[], [0], [0, 1], [0, 1, 2]]
    with pytest.raises(ValueError, match="unknown attention 'fast'"):
        gpt_knobs(GPT_CFG, attention=("fast",))


def test_gpt_predictions_and_budget_sweep(gpt):
    step, knobs, wide = gpt
    assert len(wide.alternatives) == 8 and all(a["aligned"] for a in wide.alternatives)
    needs = sorted({max(a["raw_peak"], a["peak"]) for a in wide.alternatives}, reverse=True)
    budgets = [needs[0], needs[len(needs) // 2], needs[-1], needs[-1] - 1]
    raw_peaks, peaks = [], []
    for budget in budgets:
        p = wide.replan(budget, batch=4)
        assert p.fits == (budget >= needs[-1])
        if not p.fits:
            assert p.needs["budget"] == needs[-1]
            continue
        fitting = [a for a in p.alternatives if max(a["raw_peak"], a["peak"]) <= budget]
        assert p.choice == min(fitting, key=lambda a: gpt_cost(a["choice"]))["choice"]
        assert p.seconds == 4 * gpt_cost(p.choice)
        v = p.verify(step)  # an OutOfMemoryError here fails the test
        assert v["peak"] == p.peak and v["saved"] == p.saved  # exact
        assert v["raw_peak"] <= budget
        raw_peaks.append(v["raw_peak"])
        peaks.append(v["peak"])
    assert peaks == sorted(peaks, reverse=True)
    assert all(b <= a + RAW_NOISE for a, b in zip(raw_peaks, raw_peaks[1:]))


def block_flops(batch, cfg=GPT_CFG):
    """A block's forward FLOPs, torch's count: the qkv, output and two MLP projections
    (2 per multiply-add) and attention's two products over the whole T x T (as torch counts
    scaled_dot_product_attention, causal or not)."""
    rows, c, t = batch * cfg.block_size, cfg.n_embd, cfg.block_size
    return (2 * rows * c * 3 * c + 2 * rows * c * c + 2 * 2 * rows * c * 4 * c
            + 2 * batch * t * t * 2 * c)


def test_gpt_recompute_flops_sweep_exact(gpt):
    step, knobs, wide = gpt
    for batch in (1, 4, 64):
        p = wide.replan("1TiB", batch=batch)
        for alt in p.alternatives:
            assert alt["recompute_flops"] == block_flops(batch) * len(alt["choice"]["checkpoint"])
    # a sweep of budgets: what each plan recomputes, predicted and measured, op for op
    needs = sorted({max(a["raw_peak"], a["peak"]) for a in wide.alternatives}, reverse=True)
    for budget in needs:
        p = wide.replan(budget, batch=4)
        v = p.verify(step, flops=True)
        assert v["recompute_flops"] == p.recompute_flops == block_flops(4) * len(
            p.choice["checkpoint"])
        assert v["recomputed_ops"] == p.recomputed_ops
        assert v["saved"] == p.saved


def test_gpt_reasons_name_op_scope_and_line(gpt):
    step, knobs, wide = gpt
    i = next(i for i, a in enumerate(wide.alternatives)
             if a["choice"] == {"attn": "views", "policy": "save", "checkpoint": [0]})
    freed, _ = planner.tensor_changes(planner._Model.from_data(wide.models[0]),
                                      planner._Model.from_data(wide.models[i]), 4)
    c, t = GPT_CFG.n_embd, GPT_CFG.block_size
    freed = [r for r in freed if "what" in r]  # (a last row may count the rest)
    mlp = next(r for r in freed if "from Matmul in transformer.h.0.mlp.c_fc" in r["what"])
    assert mlp["what"].startswith(f"float32[4, {t}, {4 * c}]") and " via gpt.py:" in mlp["what"]
    assert mlp["bytes"] == 4 * t * 4 * c * 4
    # flash against views: the (B, H, T, T) probabilities are saved no more
    j = next(i for i, a in enumerate(wide.alternatives)
             if a["choice"] == {"attn": "flash", "policy": "save", "checkpoint": []})
    freed, added = planner.tensor_changes(planner._Model.from_data(wide.models[0]),
                                          planner._Model.from_data(wide.models[j]), 4)
    freed, added = [r for r in freed if "what" in r], [r for r in added if "what" in r]
    probs = next(r for r in freed if r["what"].startswith("float32[4, 2, 16, 16] from "
                                                          "CausalAttention"))
    assert probs["bytes"] == 4 * 2 * t * t * 4
    assert any("ScaledDotProductAttention" in r["what"] for r in added)


def test_time_knobs_cost_recompute_settings_from_their_own_recomputed_ops(gpt):
    calls = []
    run = gpt_step(GPT_CFG)

    def step(batch, choice):
        calls.append((batch, json.dumps(choice, sort_keys=True)))
        run(batch, choice)
        return 0.001 * batch  # every setting's whole step reports the same seconds

    knobs = gpt_knobs(GPT_CFG)
    p = ta.memory.plan(step, "1GiB", batch=4, knobs=knobs, time_knobs=("attn",), repeats=3,
                       time_batches=(2, 4))
    assert p.time_knobs == ["attn"] and p.repeats == 3
    timed = calls[8 * 5:]  # after the five memory runs of each of the 8 settings
    bases = [json.dumps({"attn": a, "checkpoint": [], "policy": "save"}, sort_keys=True)
             for a in knobs["attn"]]
    # the two attentions' steps warmed at 4 (not a measure batch), then timed round-robin:
    # 3 rounds of (views at 2 and 4, flash at 2 and 4)
    assert timed[:2 + 12] == [(4, bases[0]), (4, bases[1])] + [
        (b, base) for _ in range(3) for base in bases for b in (2, 4)]
    others = [c for _, c in timed if c not in bases]
    assert len(others) == 6 * 2 * 2  # each recomputing setting warmed, then timed, at 2 and 4
    for alt, model in zip(p.alternatives, p.models):
        base = {"attn": alt["choice"]["attn"], "policy": "save", "checkpoint": []}
        assert model["attribution"]["time_from"]["timed"] == base
        extra = model["attribution"]["time_from"]["recompute_seconds"]
        if alt["choice"] == base:
            assert extra == [0.0, 0.0] and alt["seconds"] == pytest.approx(0.004)
        else:
            assert alt["recomputed_ops"] > 0
            assert alt["seconds"] > 0.004  # the base's plus its recomputed ops' own time
    # with equal whole steps, the defaults win: recomputing only costs
    assert p.choice["policy"] == "save" and p.choice["checkpoint"] == []
    back = ta.memory.Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p and back.replan("1GiB", batch=8).time_knobs == ["attn"]
    with pytest.raises(ValueError, match="time_knobs"):
        ta.memory.plan(step, "1GiB", batch=4, knobs=knobs, time_knobs=("heads",))
    with pytest.raises(ValueError, match="recompute_batches needs time_knobs"):
        ta.memory.plan(step, "1GiB", batch=4, knobs=knobs, recompute_batches=(2, 4))
    # the recomputing settings read at other batches than the timed ones
    calls.clear()
    q = ta.memory.plan(step, "1GiB", batch=4, knobs={"attn": ["flash"], "policy": [
        "save", "recompute"], "checkpoint": [[]]}, time_knobs=("attn",), time_batches=(2, 4),
        recompute_batches=(3, 5))
    assert q.recompute_batches == [3, 5]
    recompute = json.dumps({"attn": "flash", "checkpoint": [], "policy": "recompute"},
                           sort_keys=True)
    assert [b for b, c in calls[2 * 5:] if c == recompute] == [3, 5, 3, 5]  # warm, timed


def test_gpt_gradients_under_every_plan_equal_the_unplanned_step(gpt):
    _, knobs, _ = gpt

    def grads(choice):
        out = {}

        def grab(model):
            out.update({n: p.grad.numpy().copy() for n, p in model.named_parameters()})

        gpt_step(GPT_CFG, dtype=ta.float64, after_backward=grab)(3, choice)
        return out

    plain = grads({})  # the config as it is: views, save, no checkpoint
    flash = grads({"attn": "flash"})
    for values in itertools.product(*knobs.values()):
        choice = dict(zip(knobs, values))
        got = grads(choice)
        # save policies and checkpointing recompute the same ops: bit for bit
        ref = plain if choice["attn"] == "views" else flash
        for name in ref:
            np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{choice} {name}")
            np.testing.assert_allclose(got[name], plain[name], rtol=0, atol=1e-12)


def test_apply_gives_the_config_and_the_policies(gpt):
    step, knobs, wide = gpt
    p = ta.memory.Plan.from_dict(dict(wide.to_dict(), choice={
        "attn": "flash", "policy": "recompute", "checkpoint": [0]}))
    config, policies = apply(p, nn.GPT(GPT_CFG))
    assert config.attn == "flash" and config.checkpoint == (0,)
    with policies:
        assert ta.memory.save_policy("gelu") == ta.memory.save_policy("layer_norm") \
            == "recompute"
    assert ta.memory.save_policy("gelu") == "save"
    with pytest.raises(TypeError, match="GPTConfig or a GPT"):
        apply(p, "config")


# ----------------------------------------------------------------------------- GPTConfig
def test_gpt_config_checkpoint_takes_block_indices():
    assert nn.GPTConfig(n_layer=4, checkpoint=[2, 0]).checkpoint == (0, 2)
    assert nn.GPTConfig(n_layer=4, checkpoint=True).checkpointed_blocks() == (0, 1, 2, 3)
    assert nn.GPTConfig(n_layer=4, checkpoint=()).checkpointed_blocks() == ()
    import dataclasses

    c = nn.GPTConfig(n_layer=4, checkpoint=(1, 3))
    back = nn.GPTConfig(**json.loads(json.dumps(dataclasses.asdict(c))))
    assert back == c and back.checkpoint == (1, 3)
    for bad, msg in [((0, 0), "twice"), ((4,), "out of range"), ((True,), "ints"),
                     ((1.0,), "ints"), (1, "bool or a tuple"), ("0", "bool or a tuple")]:
        with pytest.raises(ValueError, match="GPTConfig.checkpoint"):
            nn.GPTConfig(n_layer=4, checkpoint=bad)
        with pytest.raises(ValueError, match=msg):
            nn.GPTConfig(n_layer=4, checkpoint=bad)


def test_partial_checkpoint_saves_less_and_gives_the_same_gradients():
    cfg = nn.GPTConfig(vocab_size=65, block_size=8, n_layer=2, n_head=2, n_embd=8)
    saved, grads = {}, {}
    for blocks in ((), (0,), (0, 1)):
        ta.manual_seed(0)
        model = nn.GPT(nn.GPTConfig(**{**cfg.__dict__, "checkpoint": blocks}))
        idx = ta.randint(0, 65, (2, 8))
        with ta.memory.profile() as prof:
            loss = model(idx, idx)[1]
            loss.backward()
        saved[blocks] = prof.summary()["saved_peak"]["unique_bytes_without_parameters"]
        grads[blocks] = [p.grad.numpy() for p in model.parameters()]
    assert saved[()] > saved[(0,)] > saved[(0, 1)]
    for blocks in ((0,), (0, 1)):
        for a, b in zip(grads[()], grads[blocks]):
            np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- (c) data
def test_plan_round_trips_through_json_and_prints_every_reason(gpt):
    _, knobs, wide = gpt
    p = wide.replan(wide.alternatives[-1]["raw_peak"], batch=4)
    back = ta.memory.Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p and str(back) == str(p)
    text = str(p)
    for knob, r in p.reasons.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{knob} ="))
        assert repr(r["option"]) in line
        if r["option"] != r["default"]:
            assert "frees" in line and "costs" in line
        else:
            assert "the default" in line
    # the reasons are differences of the alternatives' predictions
    for knob, r in p.reasons.items():
        other = next(a for a in p.alternatives
                     if a["choice"] == dict(p.choice, **{knob: r["default"]}))
        assert r["frees_raw_bytes"] == other["raw_peak"] - p.raw_peak
        assert r["frees_bytes"] == other["peak"] - p.peak
        assert r["costs_seconds"] == pytest.approx(p.seconds - other["seconds"])
    with pytest.raises(ValueError, match="unknown fields"):
        ta.memory.Plan.from_dict(dict(p.to_dict(), extra=1))
    # narrowed to some options: only those combinations, reasons against the first kept
    flash = wide.replan("1GiB", batch=4, knobs={"attn": ["flash"]})
    assert len(flash.alternatives) == 4 and flash.choice["attn"] == "flash"
    assert flash.reasons["attn"] == {"option": "flash", "default": "flash", "frees_bytes": 0,
                                     "frees_raw_bytes": 0, "costs_seconds": 0.0,
                                     "recompute_flops": 0, "recomputed_ops": 0,
                                     "no_longer_saved": [], "newly_saved": []}
    with pytest.raises(ValueError, match="unknown knob 'heads'"):
        wide.replan("1GiB", batch=4, knobs={"heads": [1]})
    with pytest.raises(ValueError, match="not measured with"):
        wide.replan("1GiB", batch=4, knobs={"attn": ["naive"]})


def test_plan_argument_errors():
    step = chain_step(Clock())
    with pytest.raises(TypeError, match="step_fn must be callable"):
        ta.memory.plan(None, "1MiB", batch=2)
    with pytest.raises(ValueError, match="plan: budget"):
        ta.memory.plan(step, "six gigs", batch=2)
    with pytest.raises(ValueError, match="plan: budget"):
        ta.memory.plan(step, -1, batch=2)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        ta.memory.plan(step, "1MiB", batch=0, knobs=CHAIN_KNOBS)
    with pytest.raises(TypeError, match="batch must be an int"):
        ta.memory.plan(step, "1MiB", batch=2.0, knobs=CHAIN_KNOBS)
    with pytest.raises(ValueError, match="knobs is empty"):
        ta.memory.plan(step, "1MiB", batch=2, knobs={})
    with pytest.raises(TypeError, match="knobs must be a dict"):
        ta.memory.plan(step, "1MiB", batch=2, knobs=[("gelu", ["save"])])
    with pytest.raises(ValueError, match="knob 'gelu' has no options"):
        ta.memory.plan(step, "1MiB", batch=2, knobs={"gelu": []})
    with pytest.raises(ValueError, match="lists an option twice"):
        ta.memory.plan(step, "1MiB", batch=2, knobs={"gelu": ["save", "save"]})
    with pytest.raises(TypeError, match="not JSON-able"):
        ta.memory.plan(step, "1MiB", batch=2, knobs={"gelu": [object()]})
    with pytest.raises(ValueError, match="measure_batches must differ"):
        ta.memory.plan(step, "1MiB", batch=2, knobs=CHAIN_KNOBS, measure_batches=(2, 2))
    with pytest.raises(ValueError, match="max_combinations"):
        ta.memory.plan(step, "1MiB", batch=2, knobs={"a": list(range(20)),
                                                     "b": list(range(20))})
    with pytest.raises(ValueError, match="time_batches must differ"):
        ta.memory.plan(step, "1MiB", batch=2, knobs=CHAIN_KNOBS, time_batches=(4, 4))
    with pytest.raises(ValueError, match="time_batches needs two"):
        ta.memory.plan(step, "1MiB", batch=2, knobs=CHAIN_KNOBS, time_batches=(4,))
    with pytest.raises(ValueError, match="time batch must be >= 1"):
        ta.memory.plan(step, "1MiB", batch=2, knobs=CHAIN_KNOBS, time_batches=(0, 4))


# ----------------------------------------------------------------------------- the time model
def reporting_step(calls):
    """The chain's step that returns its own seconds, a known cost (2 per row, 3 more for
    the checkpoint), and records the batches it ran at."""
    chain = chain_step(Clock())

    def step(batch, choice):
        calls.append(batch)
        chain(batch, choice)
        return 2.0 * batch + 3.0 * choice["checkpoint"]

    return step


def test_plan_takes_the_seconds_a_step_returns():
    calls = []
    knobs = {"checkpoint": [False, True], "gelu": ["save"]}
    p = ta.memory.plan(reporting_step(calls), "1GiB", batch=64, knobs=knobs,
                       measure_batches=MEASURE)
    # the fitted line goes exactly through the reported seconds, not the call's wall time
    for alt in p.alternatives:
        assert alt["seconds"] == 2.0 * 64 + 3.0 * alt["choice"]["checkpoint"]
    assert p.choice == {"checkpoint": False, "gelu": "save"} and p.seconds == 128.0
    assert p.time_batches is None
    assert p.models[0]["measured"][0]["seconds"] == 2.0 * MEASURE[0]
    # 7 runs a combination at the measure batches: the attribution runs (also the warm-ups)
    # and the measures of every combination first, then the timed runs
    assert calls == [4, 8, 4, 8, 4] * 2 + [4, 8] * 2
    # a timer given: its reading around the call, whatever the step returns
    clock = Clock()
    chain = chain_step(clock)

    def both(batch, choice):
        chain(batch, choice)
        return 1e9  # ignored under a timer

    q = ta.memory.plan(both, "1GiB", batch=64, knobs=knobs, measure_batches=MEASURE,
                       timer=clock)
    assert [a["seconds"] for a in q.alternatives] == [64.0, 64 * 1.25]
    # a bool or anything but a number is no report: perf_counter's reading is taken
    assert planner.step_seconds(True) is None and planner.step_seconds(0.5) == 0.5
    assert planner.step_seconds(None) is None and planner.step_seconds(3) == 3.0


def test_time_batches_time_at_other_sizes_than_the_profile():
    calls = []
    knobs = {"checkpoint": [False, True], "gelu": ["save"]}
    p = ta.memory.plan(reporting_step(calls), "1GiB", batch=64, knobs=knobs,
                       measure_batches=MEASURE, time_batches=(16, 32))
    # attribution runs and measures at 4 and 8; 16 and 32 warmed once then timed
    assert calls == [4, 8, 4, 8, 4] * 2 + [16, 32, 16, 32] * 2
    assert p.time_batches == [16, 32]
    assert [a["seconds"] for a in p.alternatives] == [128.0, 131.0]
    assert p.models[1]["measured"][-1] == {"timed": [[16, 35.0], [32, 67.0]]}
    assert "timed at 16 and 32" in str(p)
    # the memory fits are the measure batches' as without time_batches
    plain = ta.memory.plan(reporting_step([]), "1GiB", batch=64, knobs=knobs,
                           measure_batches=MEASURE)
    assert [a["peak"] for a in p.alternatives] == [a["peak"] for a in plain.alternatives]
    back = ta.memory.Plan.from_dict(json.loads(json.dumps(p.to_dict())))
    assert back == p and back.replan("1GiB", batch=8).time_batches == [16, 32]
    # a time batch that is a measure batch is not warmed again
    calls.clear()
    ta.memory.plan(reporting_step(calls), "1GiB", batch=64, knobs={"checkpoint": [False],
                   "gelu": ["save"]}, measure_batches=MEASURE, time_batches=(8, 16))
    assert calls == [4, 8, 4, 8, 4, 16, 8, 16]


def test_gpt_step_returns_the_seconds_of_the_step_proper():
    step = gpt_step(GPT_CFG)
    assert step.loss is None
    t0 = time.perf_counter()
    seconds = step(2, {})
    total = time.perf_counter() - t0
    assert isinstance(seconds, float) and 0 < seconds < total
    # the loss of a fresh model on random tokens: about log(vocab)
    assert abs(step.loss - np.log(GPT_CFG.vocab_size)) < 0.5
