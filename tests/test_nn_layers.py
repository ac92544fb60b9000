"""nn's layers and Module: every layer gradchecked in float64 (contiguous and non-contiguous
inputs, gradients w.r.t. the input and every parameter), and the Module machinery:
registration, state_dict / load_state_dict, modes, zero_grad, ties, moves, scopes."""

from __future__ import annotations

import numpy as np
import pytest

import nn
import tinygrad_attn as ta
from nn import functional as F

F64 = ta.float64


def noncontig(*shape):
    """A float64 leaf of `shape` that is a transposed (non-contiguous) view."""
    t = ta.randn(*shape[:-2], shape[-1], shape[-2], dtype=F64).transpose(-2, -1)
    assert not t.is_contiguous()
    return t.requires_grad_()


def contig(*shape):
    return ta.randn(*shape, dtype=F64).requires_grad_()


MAKERS = {"contiguous": contig, "non-contiguous": noncontig}


def check_layer(layer, x):
    """gradcheck of layer(x) w.r.t. x and every parameter of the layer."""
    params = list(layer.parameters())
    assert all(p.dtype is F64 for p in params)
    inputs = ([x] if x.requires_grad else []) + params
    assert ta.gradcheck(lambda *_: layer(x), inputs)


def tiny_config(**kw):
    base = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
    base.update(kw)
    return nn.GPTConfig(**base)


# ----------------------------------------------------------------------------- gradchecks
@pytest.mark.parametrize("view", MAKERS)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradcheck(view, bias):
    layer = nn.Linear(4, 3, bias=bias).double()
    assert layer.weight.shape == (3, 4)  # PyTorch's (out, in) layout
    check_layer(layer, MAKERS[view](2, 3, 4))


def test_linear_gradcheck_1d_and_2d_inputs():
    layer = nn.Linear(4, 3).double()
    check_layer(layer, contig(4))
    check_layer(layer, noncontig(5, 4))


def test_linear_matches_formula_and_allocates_only_its_output():
    layer = nn.Linear(5, 7)
    x = ta.randn(3, 4, 5)
    expected = x.numpy() @ layer.weight.detach().numpy().T + layer.bias.detach().numpy()
    ta.memory.reset_peak()
    before = ta.memory.live_bytes()
    y = layer(x)
    # the weight's transpose is a view and the bias is added in place: one allocation
    assert ta.memory.max_live_bytes() - before == y.nbytes
    np.testing.assert_allclose(y.detach().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("view", MAKERS)
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_gradcheck(view, bias):
    layer = nn.LayerNorm(5, bias=bias).double()
    with ta.no_grad():  # off the default ones/zeros, so the parameter gradients matter
        layer.weight.copy_(ta.randn(5, dtype=F64))
        if bias:
            layer.bias.copy_(ta.randn(5, dtype=F64))
    check_layer(layer, MAKERS[view](2, 3, 5))


def test_layernorm_is_one_fused_node():
    layer = nn.LayerNorm(6)
    y = layer(ta.randn(2, 6, requires_grad=True))
    assert y.grad_fn.name == "LayerNormBackward"


def test_embedding_gradcheck_with_repeated_indices():
    layer = nn.Embedding(6, 3).double()
    idx = ta.tensor([[0, 2, 2], [5, 0, 2]])
    check_layer(layer, idx)
    out = layer(idx)
    assert out.shape == (2, 3, 3)
    np.testing.assert_array_equal(out.detach().numpy()[1, 0], layer.weight.detach().numpy()[5])


@pytest.mark.parametrize("view", MAKERS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradcheck(view, approximate):
    check_layer(nn.GELU(approximate), MAKERS[view](3, 4))


@pytest.mark.parametrize("view", MAKERS)
def test_relu_gradcheck(view):
    check_layer(nn.ReLU(), MAKERS[view](3, 4))


@pytest.mark.parametrize("view", MAKERS)
def test_dropout_gradcheck_with_a_fixed_mask(view):
    drop = nn.Dropout(0.4)
    x = MAKERS[view](4, 5)

    def fn(x):
        ta.manual_seed(3)  # the same mask on every call, so finite differences make sense
        return drop(x)

    assert ta.gradcheck(fn, [x])
    y = fn(x).detach().numpy()
    kept = y != 0
    assert 0 < kept.sum() < kept.size
    np.testing.assert_allclose(y[kept], x.detach().numpy()[kept] / 0.6)


def test_dropout_is_identity_in_eval_and_at_p0():
    x = ta.randn(3, 4)
    drop = nn.Dropout(0.5).eval()
    assert drop(x) is x
    assert nn.Dropout(0.0)(x) is x
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(1.5)


@pytest.mark.parametrize("view", MAKERS)
def test_sequential_gradcheck(view):
    model = nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.LayerNorm(6), nn.Linear(6, 2)).double()
    check_layer(model, MAKERS[view](2, 3, 4))


@pytest.mark.parametrize("view", MAKERS)
def test_attention_mlp_block_gradcheck(view):
    cfg = tiny_config(n_embd=4, n_head=2, block_size=5)
    for layer in (nn.CausalSelfAttention(cfg), nn.MLP(cfg), nn.Block(cfg)):
        layer.double()
        check_layer(layer, MAKERS[view](2, 3, 4))


def test_attention_is_causal():
    cfg = tiny_config(n_embd=8, n_head=2)
    attn = nn.CausalSelfAttention(cfg)
    x = ta.randn(1, 5, 8)
    y = attn(x).detach().numpy().copy()
    x2 = x.detach().clone()
    with ta.no_grad():
        x2[:, 3:] = ta.randn(1, 2, 8)  # change the future: positions 0..2 must not move
    y2 = attn(x2).detach().numpy()
    np.testing.assert_allclose(y[:, :3], y2[:, :3], rtol=1e-6)
    assert not np.allclose(y[:, 3:], y2[:, 3:])


def test_functional_mirrors_the_engine():
    for name in F.__all__:
        assert callable(getattr(F, name))
        if name not in ("linear", "multi_head_attention_forward"):  # written in nn
            assert getattr(F, name) is getattr(ta.functional, name)
    x, w, b = contig(2, 4), contig(3, 4), contig(3)
    assert ta.gradcheck(F.linear, [x, w, b])
    assert ta.gradcheck(lambda x, w: F.linear(x, w), [noncontig(2, 4), w])


# ----------------------------------------------------------------------------- registration
class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(3, 4)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4, 2, bias=False)
        self.scale = nn.Parameter(ta.ones(2))
        self.register_buffer("running", ta.zeros(2))
        self.register_buffer("scratch", ta.zeros(5), persistent=False)
        self.plain = ta.zeros(3)  # a plain tensor attribute: not registered

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) * self.scale


def test_parameter_is_a_plain_tagged_leaf():
    p = nn.Parameter(ta.randn(2, 3) * 2)
    assert type(p) is ta.Tensor and p.is_leaf and p.requires_grad
    assert p.untyped_storage().category == "parameter"
    with pytest.raises(TypeError):
        nn.Parameter(np.zeros(3))


def test_module_registers_parameters_buffers_and_submodules():
    m = TwoLayer()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "fc1.weight", "fc1.bias", "fc2.weight"]
    assert [n for n, _ in m.named_buffers()] == ["running", "scratch"]
    assert [n for n, _ in m.named_children()] == ["fc1", "act", "fc2"]
    assert [n for n, _ in m.named_modules()] == ["", "fc1", "act", "fc2"]
    assert list(m.children()) == [m.fc1, m.act, m.fc2]
    assert m.fc2.bias is None
    assert list(m.state_dict()) == ["scale", "running", "fc1.weight", "fc1.bias", "fc2.weight"]
    # reassigning a name to something else moves it between registries
    m.act = None
    assert [n for n, _ in m.named_children()] == ["fc1", "fc2"]
    m.fc2.bias = nn.Parameter(ta.zeros(2))
    assert "fc2.bias" in dict(m.named_parameters())
    m.fc1.weight = nn.Parameter(ta.zeros(4, 3))  # replaced in place: the order is kept
    assert [n for n, _ in m.fc1.named_parameters()] == ["weight", "bias"]
    with pytest.raises(TypeError, match="nn.Parameter"):
        m.scale = m.scale * 2  # a computed tensor would silently stop being trained
    del m.scale
    m.scale = 3.0
    assert "scale" not in dict(m.named_parameters()) and m.scale == 3.0
    del m.fc1
    assert not hasattr(m, "fc1") and "fc1.weight" not in m.state_dict()


def test_a_module_at_two_places():
    shared = nn.Linear(2, 2)
    seq = nn.Sequential(shared, nn.ReLU(), shared)
    assert [n for n, _ in seq.named_modules()] == ["", "0", "1"]
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    assert len(list(seq.named_parameters(remove_duplicate=False))) == 4
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]  # as torch
    seq.load_state_dict(seq.state_dict())


def test_frozen_parameter_is_still_registered():
    m = nn.Module()
    m.w = nn.Parameter(ta.ones(2), requires_grad=False)
    assert dict(m.named_parameters())["w"] is m.w


def test_assigning_before_init_is_a_clear_error():
    class Bad(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match="super\\(\\).__init__"):
        Bad()


def test_containers():
    layers = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert len(layers) == 3 and layers[-1] is layers[2]
    layers.append(nn.ReLU())
    assert [n for n, _ in layers.named_children()] == ["0", "1", "2", "3"]
    assert isinstance(layers[1:3], nn.ModuleList) and len(layers[1:3]) == 2
    with pytest.raises(IndexError):
        layers[4]
    layers[0] = nn.GELU()  # replaced in place: the order is kept
    assert [type(m).__name__ for m in layers] == ["GELU", "Linear", "Linear", "ReLU"]
    d = nn.ModuleDict(dict(a=nn.Linear(2, 3), b=nn.ReLU()))
    assert list(d) == ["a", "b"] and "a" in d and len(d) == 2
    assert [n for n, _ in d.named_parameters()] == ["a.weight", "a.bias"]
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]
    assert seq(ta.randn(4, 2)).shape == (4, 3)
    assert "Linear(in_features=2, out_features=3, bias=True)" in repr(seq)


def test_apply_visits_every_module():
    m = TwoLayer()
    seen = []
    m.apply(lambda mod: seen.append(type(mod).__name__))
    assert seen == ["Linear", "ReLU", "Linear", "TwoLayer"]


# ----------------------------------------------------------------------------- state dicts
def test_state_dict_round_trip():
    a, b = TwoLayer(), TwoLayer()
    sd = a.state_dict()
    assert sd["fc1.weight"].shares_storage(a.fc1.weight) and not sd["fc1.weight"].requires_grad
    w = b.fc1.weight
    result = b.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert b.fc1.weight is w  # copied in place: the same tensor, the same storage
    for k, v in b.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), sd[k].numpy())
    x = ta.randn(5, 3)
    np.testing.assert_array_equal(a(x).detach().numpy(), b(x).detach().numpy())
    # NumPy arrays load too (cast to the parameter's dtype)
    b.load_state_dict({k: v.numpy().astype(np.float64) for k, v in sd.items()})
    assert b.fc1.weight.dtype is ta.float32


def test_load_state_dict_errors_name_the_keys_and_write_nothing():
    m = TwoLayer()
    before = m.fc1.weight.detach().numpy().copy()
    sd = {k: v.clone() + 1 for k, v in TwoLayer().state_dict().items()}
    bad = dict(sd)
    del bad["fc2.weight"]
    with pytest.raises(RuntimeError, match="missing keys: fc2.weight"):
        m.load_state_dict(bad)
    bad = dict(sd, extra=ta.zeros(1))
    with pytest.raises(RuntimeError, match="unexpected keys: extra"):
        m.load_state_dict(bad)
    bad = dict(sd, **{"fc1.bias": ta.zeros(5)})
    with pytest.raises(RuntimeError, match=r"size mismatch for fc1\.bias.*\(5,\).*\(4,\)"):
        m.load_state_dict(bad)
    np.testing.assert_array_equal(m.fc1.weight.detach().numpy(), before)
    # strict=False reports instead of raising, and loads what matches
    partial = {"fc1.weight": sd["fc1.weight"], "extra": ta.zeros(1)}
    missing, unexpected = m.load_state_dict(partial, strict=False)
    assert unexpected == ["extra"] and "fc2.weight" in missing
    np.testing.assert_array_equal(m.fc1.weight.detach().numpy(), sd["fc1.weight"].numpy())
    with pytest.raises(RuntimeError, match="size mismatch"):
        m.load_state_dict({"fc1.weight": ta.zeros(2, 2)}, strict=False)


# ----------------------------------------------------------------------------- modes, grads
def test_train_eval_propagates():
    model = nn.GPT(tiny_config(dropout=0.5))
    assert all(m.training for m in model.modules())
    assert model.eval() is model
    assert not any(m.training for m in model.modules())
    idx = ta.randint(0, 11, (2, 6))
    a, _ = model(idx)
    b, _ = model(idx)
    np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())  # no dropout
    model.train()
    assert all(m.training for m in model.modules())


def test_zero_grad():
    m = TwoLayer()
    m(ta.randn(4, 3)).sum().backward()
    grad = m.fc1.weight.grad
    assert grad is not None
    m.zero_grad(set_to_none=False)
    assert m.fc1.weight.grad is grad and not grad.numpy().any()
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_tied_weights_listed_once_and_share_one_gradient():
    model = nn.GPT(tiny_config())
    wte, head = model.transformer.wte.weight, model.lm_head.weight
    assert wte is head
    names = [n for n, _ in model.named_parameters()]
    assert "transformer.wte.weight" in names and "lm_head.weight" not in names
    assert len(names) == len({id(p) for p in model.parameters()})
    all_names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert "lm_head.weight" in all_names
    sd = model.state_dict()  # as torch: both names, one storage
    assert sd["lm_head.weight"].shares_storage(sd["transformer.wte.weight"])
    _, loss = model(ta.randint(0, 11, (2, 5)), ta.randint(0, 11, (2, 5)))
    loss.backward()
    assert head.grad is not None and wte.grad is head.grad


def test_to_casts_moves_and_keeps_ties():
    model = nn.GPT(tiny_config())
    _, loss = model(ta.randint(0, 11, (2, 5)), ta.randint(0, 11, (2, 5)))
    loss.backward()
    assert model.double() is model
    assert all(p.dtype is F64 and p.is_leaf and p.requires_grad for p in model.parameters())
    assert all(p.untyped_storage().category == "parameter" for p in model.parameters())
    assert model.transformer.wte.weight is model.lm_head.weight
    assert model.lm_head.weight.grad.dtype is F64
    mask = model.transformer.h[0].attn.mask
    assert mask.dtype is ta.bool  # non-float buffers keep their dtype
    assert model.to("cpu") is model and model.transformer.h[0].attn.mask is mask
    logits, _ = model(ta.randint(0, 11, (1, 4)))
    assert logits.dtype is F64


# ----------------------------------------------------------------------------- memory scopes
def spy_on(module, record):
    """Replace module.forward with one that records the scope of its input's storage and of
    the gradient that flows back into that input."""
    original = module.forward

    def forward(x):
        record["input"] = x.untyped_storage().scope
        if x.requires_grad:
            x.register_hook(lambda g: record.__setitem__("grad", g.untyped_storage().scope))
        record["probe"] = ta.zeros(1).untyped_storage().scope  # allocated right here
        return original(x)

    module.forward = forward


def test_storages_carry_the_qualified_module_name():
    model = nn.GPT(tiny_config())
    attn = model.transformer.h[0].attn
    record = {}
    spy_on(attn.c_proj, record)
    idx = ta.randint(0, 11, (2, 6))
    _, loss = model(idx, idx)
    # the merged heads c_proj takes are made inside attn's forward
    assert record["input"] == "transformer.h.0.attn"
    assert record["probe"] == "transformer.h.0.attn.c_proj"
    loss.backward()
    # backward runs under the node's scope: c_proj's own node makes its input's gradient
    assert record["grad"] == "transformer.h.0.attn.c_proj"
    logits, _ = model(idx)
    assert logits.untyped_storage().scope == "lm_head"


def test_scope_names_follow_the_root_of_the_call_and_the_tree():
    model = nn.GPT(tiny_config())
    block = model.transformer.h[1]
    record = {}
    spy_on(block.attn.c_proj, record)
    block(ta.randn(1, 3, 8))  # called on its own, the block is the root
    assert record["input"] == "attn"
    idx = ta.randint(0, 11, (1, 3))
    model(idx)
    assert record["input"] == "transformer.h.1.attn"
    model.transformer.h[0] = block  # the tree changed: names are recomputed
    assert list(model.transformer.h) == [block, block]
    model(idx)  # a module at two places is named after the first (as named_modules)
    assert record["input"] == "transformer.h.0.attn"


def test_unregistered_module_called_in_forward_gets_a_fallback_name():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.hidden = [nn.Linear(2, 2)]  # a plain list: not registered

        def forward(self, x):
            return self.hidden[0](self.inner(x))

    y = Outer()(ta.randn(1, 2))
    assert y.untyped_storage().scope == "Linear"


def test_checkpoint_recompute_is_named_as_its_forward():
    """ta.checkpoint carries the scope of its call: a checkpointed function that calls
    submodules reruns them in backward under the names they had in forward."""

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(4, 4), nn.GELU())

        def forward(self, x):
            return ta.checkpoint(lambda t: self.body(t) * 2, x)

    x = ta.randn(2, 4, requires_grad=True)
    with ta.memory.profile() as prof:
        Outer()(x).sum().backward()

    def scopes(phase):
        return {e["scope"] for e in prof.events if e["kind"] == "alloc" and e["phase"] == phase}

    assert {"body.0", "body.1"} <= scopes("forward")
    assert {"body.0", "body.1"} <= scopes("backward")
    assert not any(s.startswith(("0", "1")) for s in scopes("backward"))


def test_scope_name_and_scope_of_call_agree_with_the_running_scope():
    model = nn.GPT(tiny_config())
    block = model.transformer.h[1]
    seen = {}
    original = block.forward

    def forward(x):
        seen["running"] = ta.memory.current_scope()
        seen["own"] = block.scope_name()
        seen["child"] = ta.memory.scope_of_call(block.mlp)
        return original(x)

    block.forward = forward
    model(ta.randint(0, 11, (1, 3)))
    assert seen == {"running": "transformer.h.1", "own": "transformer.h.1",
                    "child": "transformer.h.1.mlp"}
    assert ta.memory.scope_of_call(block) == ""  # nothing running: a root call's scope
    with ta.memory.scope("outer"):
        assert ta.memory.scope_of_call(block) == "outer"


def test_a_called_module_class_does_not_stay_alive():
    """nn's per-class caches hold classes weakly: a user's model class, and through its
    methods its module's globals (where the model lives), is freed once the user drops it."""
    import gc
    import weakref

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 2)

        def forward(self, x):
            return self.fc(x)

    model = Tiny()
    model(ta.randn(1, 2)).sum().backward()
    dead_class, dead_model = weakref.ref(Tiny), weakref.ref(model)
    del Tiny, model
    gc.collect()
    assert dead_class() is None and dead_model() is None
