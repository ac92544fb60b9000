"""nn.MultiheadAttention and the nn.Transformer family against torch.

Each test builds torch's module, loads its state_dict into ours (float64) and compares the
outputs and the gradient of every input and parameter, in train mode with dropout=0 and in
eval mode: batch_first both ways, unbatched inputs, bool and float masks of each kind,
need_weights averaged or not, norm_first, the activations, and torch's errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import tinygrad_attn as ta
from nn.attention import MultiheadAttention
from nn.transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

E, NH, L, S, N = 8, 2, 5, 6, 3

# torch's own advice on its side of the comparison (mixed mask kinds, nested tensors)
pytestmark = [pytest.mark.filterwarnings("ignore:Support for mismatched"),
              pytest.mark.filterwarnings("ignore:enable_nested_tensor is True"),
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")]


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def _pair(torch, cls_name, *args, **kwargs):
    """(torch's module, ours with torch's weights), both float64, same arguments."""
    torch.manual_seed(0)
    theirs = getattr(torch.nn, cls_name)(*args, **kwargs).double()
    ours = _ours(cls_name)(*args, **kwargs).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    return theirs, ours


def _ours(cls_name):
    return {"MultiheadAttention": MultiheadAttention, "Transformer": Transformer,
            "TransformerEncoderLayer": TransformerEncoderLayer,
            "TransformerDecoderLayer": TransformerDecoderLayer}[cls_name]


DATA = {"query", "key", "value", "src", "tgt", "memory"}  # the inputs whose gradients count


def _to_lib(lib, value, grad):
    if not isinstance(value, np.ndarray):
        return value
    if lib is ta:
        return ta.tensor(value.copy(), requires_grad=grad)
    return lib.tensor(value.copy(), requires_grad=grad)


def _run(lib, module, inputs: dict, train: bool, grad: bool = True):
    """Outputs of module(**inputs), the gradients of a fixed weighted sum of them with
    respect to the float inputs and to every parameter, by name."""
    module.train(train)
    args = {k: _to_lib(lib, v, grad and k in DATA) for k, v in inputs.items()}
    out = module(**args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o is not None]
    if not grad:
        return [o.detach().numpy() for o in outs], {}
    total = 0
    for i, o in enumerate(outs):
        w = _to_lib(lib, _data(*o.shape, seed=100 + i), False)
        total = total + (o * w).sum()
    total.backward()
    grads = {k: a.grad.numpy() for k, a in args.items()
             if hasattr(a, "grad") and a.requires_grad}
    grads.update({k: p.grad.numpy() for k, p in module.named_parameters()})
    return [o.detach().numpy() for o in outs], grads


def _compare(torch, theirs, ours, inputs, train=True, atol=1e-10):
    t_out, t_grads = _run(torch, theirs, inputs, train)
    o_out, o_grads = _run(ta, ours, inputs, train)
    assert len(o_out) == len(t_out)
    for a, b in zip(o_out, t_out):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=atol, rtol=1e-9)
    assert set(o_grads) == set(t_grads)
    for name, g in t_grads.items():
        np.testing.assert_allclose(o_grads[name], g, atol=atol, rtol=1e-9, err_msg=name)


# ---------------------------------------------------------------------- MultiheadAttention
def _qkv(batch_first=False, kdim=E, vdim=E, batched=True):
    def shaped(T, d, seed):
        if not batched:
            return _data(T, d, seed=seed)
        return _data(N, T, d, seed=seed) if batch_first else _data(T, N, d, seed=seed)
    return shaped(L, E, 1), shaped(S, kdim, 2), shaped(S, vdim, 3)


def _bool_padding(batched=True):
    pad = np.zeros((N, S), dtype=bool)
    pad[0, -2:] = True
    pad[2, 0] = True
    return pad if batched else pad[0]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights, average", [(True, True), (True, False), (False, True)])
def test_mha_cross_attention_with_masks_matches_torch(torch, batch_first, need_weights,
                                                      average):
    theirs, ours = _pair(torch, "MultiheadAttention", E, NH, batch_first=batch_first)
    q, k, v = _qkv(batch_first)
    causal_ish = np.triu(np.ones((L, S), dtype=bool), 2)  # True: may not attend
    for masks in ({}, {"attn_mask": causal_ish}, {"key_padding_mask": _bool_padding()},
                  {"attn_mask": _data(N * NH, L, S, seed=4),
                   "key_padding_mask": _data(N, S, seed=5)}):
        inputs = dict(query=q, key=k, value=v, need_weights=need_weights,
                      average_attn_weights=average, **masks)
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, inputs)


def test_mha_self_attention_eval_and_unbatched_match_torch(torch):
    theirs, ours = _pair(torch, "MultiheadAttention", E, NH)
    x = _data(L, N, E, seed=1)
    for train in (True, False):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(query=x, key=x, value=x), train=train)
    q, k, v = _qkv(batched=False)
    for kw in ({"need_weights": True}, {"need_weights": True, "average_attn_weights": False},
               {"need_weights": False, "key_padding_mask": _bool_padding(batched=False)},
               {"attn_mask": _data(NH, L, S, seed=6)}):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(query=q, key=k, value=v, **kw))


@pytest.mark.parametrize("kwargs", [
    {"kdim": 3, "vdim": 5},
    {"bias": False},
    {"add_bias_kv": True},
    {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "kdim": 4, "vdim": 4},
], ids=["kdim-vdim", "no-bias", "bias-kv", "zero-attn", "all"])
def test_mha_options_match_torch_in_names_values_and_gradients(torch, kwargs):
    theirs, ours = _pair(torch, "MultiheadAttention", E, NH, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    q, k, v = _qkv(kdim=kwargs.get("kdim", E), vdim=kwargs.get("vdim", E))
    attn_mask = np.triu(np.ones((L, S), dtype=bool), 3)
    for need_weights in (True, False):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(query=q, key=k, value=v, attn_mask=attn_mask,
                                           key_padding_mask=_bool_padding(),
                                           need_weights=need_weights))


def test_mha_is_causal_hint_uses_the_mask_as_torch(torch):
    theirs, ours = _pair(torch, "MultiheadAttention", E, NH, batch_first=True)
    x = _data(N, L, E, seed=1)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L).double().numpy()
    for need_weights in (False, True):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(query=x, key=x, value=x, attn_mask=causal,
                                           is_causal=True, need_weights=need_weights))
    with pytest.raises(RuntimeError, match="need attn_mask"):
        ours(ta.tensor(x), ta.tensor(x), ta.tensor(x), is_causal=True)


def test_mha_init_is_torchs():
    mha = MultiheadAttention(16, 4, add_bias_kv=True)
    bound = (6 / (16 + 48)) ** 0.5  # xavier_uniform_ of the (3E, E) in_proj_weight
    w = mha.in_proj_weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not mha.in_proj_bias.detach().numpy().any()
    assert not mha.out_proj.bias.detach().numpy().any()
    assert mha.bias_k.shape == (1, 1, 16) and mha.bias_k.detach().numpy().any()
    assert mha.in_proj_weight.dtype == ta.float32
    separate = MultiheadAttention(16, 4, kdim=3, vdim=5, bias=False)
    assert separate.in_proj_weight is None and separate.in_proj_bias is None
    assert separate.k_proj_weight.shape == (16, 3) and separate.v_proj_weight.shape == (16, 5)
    assert list(separate.state_dict()) == ["q_proj_weight", "k_proj_weight", "v_proj_weight",
                                           "out_proj.weight"]


def test_mha_dropout_applies_only_while_training():
    mha = MultiheadAttention(E, NH, dropout=0.5).double()
    x = ta.tensor(_data(L, N, E, seed=1))
    for need_weights in (True, False):
        mha.eval()
        a = mha(x, x, x, need_weights=need_weights)[0].detach().numpy()
        b = mha(x, x, x, need_weights=need_weights)[0].detach().numpy()
        np.testing.assert_array_equal(a, b)
        mha.train()
        c = mha(x, x, x, need_weights=need_weights)[0].detach().numpy()
        assert np.abs(c - a).max() > 1e-3
    mha.train()
    _, w = mha(x, x, x, average_attn_weights=False)
    dropped = (w.detach().numpy() == 0).mean()
    assert 0.35 < dropped < 0.65  # 150 weights, p = 0.5


def test_mha_errors_are_torchs(torch):
    with pytest.raises(AssertionError, match="divisible"):
        MultiheadAttention(10, 3)
    with pytest.raises(AssertionError):
        torch.nn.MultiheadAttention(10, 3)
    mha = MultiheadAttention(E, NH)
    q, k, v = (ta.tensor(a) for a in _qkv())
    with pytest.raises(RuntimeError, match="2D attn_mask"):
        mha(q, k, v, attn_mask=ta.zeros(L, S + 1))
    with pytest.raises(RuntimeError, match="3D attn_mask"):
        mha(q, k, v, attn_mask=ta.zeros(N, L, S))
    with pytest.raises(AssertionError, match="batched"):
        mha(q, k[0], v)
    with pytest.raises(AssertionError, match="embedding dimension"):
        mha(q[..., :4], k, v)
    tm = torch.nn.MultiheadAttention(E, NH)
    tq, tk, tv = (torch.tensor(a).float() for a in _qkv())
    with pytest.raises(RuntimeError):
        tm(tq, tk, tv, attn_mask=torch.zeros(L, S + 1))
    with pytest.raises(RuntimeError):
        tm(tq, tk, tv, attn_mask=torch.zeros(N, L, S))
    with pytest.raises(AssertionError):
        tm(tq, tk[0], tv)


# ---------------------------------------------------------------------- the Transformer family
LAYER = dict(dim_feedforward=12, dropout=0.0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_layer_matches_torch(torch, norm_first, batch_first):
    theirs, ours = _pair(torch, "TransformerEncoderLayer", E, NH, norm_first=norm_first,
                         batch_first=batch_first, **LAYER)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    src = _data(N, L, E) if batch_first else _data(L, N, E)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L).double().numpy()
    pad = np.zeros((N, L), dtype=bool)
    pad[1, -2:] = True
    for masks in ({}, {"src_mask": causal, "is_causal": True}, {"src_key_padding_mask": pad},
                  {"src_mask": causal, "src_key_padding_mask": pad}):
        for train in (True, False):
            theirs.zero_grad()
            ours.zero_grad()
            _compare(torch, theirs, ours, dict(src=src, **masks), train=train)


@pytest.mark.parametrize("activation", ["gelu", "callable", "module"])
def test_encoder_layer_activations_and_no_bias_match_torch(torch, activation):
    import nn

    their_act = {"gelu": "gelu", "callable": torch.nn.functional.silu,
                 "module": torch.nn.GELU(approximate="tanh")}[activation]
    our_act = {"gelu": "gelu", "callable": ta.functional.silu,
               "module": nn.GELU(approximate="tanh")}[activation]
    torch.manual_seed(0)
    theirs = torch.nn.TransformerEncoderLayer(E, NH, activation=their_act, bias=False,
                                              layer_norm_eps=1e-3, **LAYER).double()
    ours = TransformerEncoderLayer(E, NH, activation=our_act, bias=False, layer_norm_eps=1e-3,
                                   **LAYER).double()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    assert list(ours.state_dict()) == list(theirs.state_dict())
    _compare(torch, theirs, ours, dict(src=_data(L, N, E)))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(torch, norm_first):
    theirs, ours = _pair(torch, "TransformerDecoderLayer", E, NH, norm_first=norm_first,
                         batch_first=True, **LAYER)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    tgt, memory = _data(N, L, E), _data(N, S, E, seed=1)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L).double().numpy()
    pad = np.zeros((N, S), dtype=bool)
    pad[0, -3:] = True
    for masks in ({}, {"tgt_mask": causal, "tgt_is_causal": True},
                  {"memory_mask": _data(L, S, seed=2), "memory_key_padding_mask": pad},
                  {"tgt_key_padding_mask": pad[:, :L], "tgt_mask": causal}):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(tgt=tgt, memory=memory, **masks))


def test_stacks_and_transformer_match_torch(torch):
    theirs, ours = _pair(torch, "Transformer", E, NH, num_encoder_layers=2,
                         num_decoder_layers=2, **LAYER)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert "encoder.layers.1.self_attn.in_proj_weight" in ours.state_dict()
    assert "decoder.layers.0.multihead_attn.out_proj.bias" in ours.state_dict()
    src, tgt = _data(S, N, E), _data(L, N, E, seed=1)
    tgt_mask = Transformer.generate_square_subsequent_mask(L).double().numpy()
    pad = np.zeros((N, S), dtype=bool)
    pad[2, -1] = True
    for train in (True, False):
        theirs.zero_grad()
        ours.zero_grad()
        _compare(torch, theirs, ours, dict(src=src, tgt=tgt, tgt_mask=tgt_mask,
                                           src_key_padding_mask=pad,
                                           memory_key_padding_mask=pad), train=train)
    # the stacks alone, with a final norm, taking the mask without the is_causal hint
    torch.manual_seed(1)
    t_layer = torch.nn.TransformerEncoderLayer(E, NH, **LAYER)
    t_enc = torch.nn.TransformerEncoder(t_layer, 2, norm=torch.nn.LayerNorm(E),
                                        enable_nested_tensor=False).double()
    import nn

    o_enc = TransformerEncoder(TransformerEncoderLayer(E, NH, **LAYER), 2,
                               norm=nn.LayerNorm(E)).double()
    o_enc.load_state_dict({k: v.detach().numpy() for k, v in t_enc.state_dict().items()})
    _compare(torch, t_enc, o_enc, dict(src=src, mask=_data(S, S, seed=3)))
    t_dec = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(E, NH, **LAYER),
                                        2).double()
    o_dec = TransformerDecoder(TransformerDecoderLayer(E, NH, **LAYER), 2).double()
    o_dec.load_state_dict({k: v.detach().numpy() for k, v in t_dec.state_dict().items()})
    _compare(torch, t_dec, o_dec, dict(tgt=tgt, memory=src, tgt_mask=tgt_mask))


def test_eval_without_grad_matches_torchs_fast_path(torch):
    theirs, ours = _pair(torch, "TransformerEncoderLayer", E, NH, batch_first=True, **LAYER)
    theirs.eval()
    ours.eval()
    src = _data(N, L, E)
    with torch.no_grad():
        want = theirs(torch.tensor(src)).numpy()
    with ta.no_grad():
        got = ours(ta.tensor(src)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-10)


def test_square_subsequent_mask_and_transformer_errors_are_torchs(torch):
    np.testing.assert_array_equal(Transformer.generate_square_subsequent_mask(4).numpy(),
                                  torch.nn.Transformer.generate_square_subsequent_mask(4))
    assert Transformer.generate_square_subsequent_mask(3).dtype == ta.float32
    model = Transformer(E, NH, 1, 1, 12, 0.0)
    with pytest.raises(RuntimeError, match="batch number"):
        model(ta.zeros(S, N, E), ta.zeros(L, N + 1, E))
    with pytest.raises(RuntimeError, match="feature number"):
        model(ta.zeros(S, N, E), ta.zeros(L, N, E + 1))
    with pytest.raises(RuntimeError, match="activation should be relu/gelu"):
        TransformerEncoderLayer(E, NH, activation="tanh")
    with pytest.raises(RuntimeError):
        torch.nn.TransformerEncoderLayer(E, NH, activation="tanh")
    for p in model.parameters():  # xavier_uniform_ over every matrix
        if p.ndim == 2:
            bound = (6 / sum(p.shape)) ** 0.5
            assert np.abs(p.detach().numpy()).max() <= bound


@pytest.mark.parametrize("batch_first", [False, True])
def test_mha_self_attention_merges_heads_without_a_copy(batch_first):
    mha = MultiheadAttention(16, 4, batch_first=batch_first)
    x = ta.randn(2, 10, 16, requires_grad=True)
    with ta.memory.profile() as prof:
        y, weights = mha(x, x, x, need_weights=False)
        y.sum().backward()
    assert weights is None and y.shape == (2, 10, 16)
    assert y.is_contiguous() is (not batch_first)  # as torch's: batch_first gives a view
    assert prof.summary()["copies"] == []  # q, k, v, heads, merge: views all the way
    saved = prof.summary()["saved_peak"]["by_op"]
    # the attention op keeps q, k, v (three views of one (2, 10, 48) projection, counted
    # once), its output (2 * 10 * 16) and a logsumexp per query row (2 * 4 * 10) in
    # float32: never the (10 x 10) weights of each head
    assert saved["ScaledDotProductAttention"]["unique_bytes"] == (960 + 320 + 80) * 4


def test_padded_positions_are_computed_where_torchs_nested_path_gives_zeros(torch):
    torch.manual_seed(0)
    t_enc = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(E, NH, batch_first=True, **LAYER), 2).double().eval()
    o_enc = TransformerEncoder(TransformerEncoderLayer(E, NH, batch_first=True, **LAYER),
                               2).double().eval()
    o_enc.load_state_dict({k: v.detach().numpy() for k, v in t_enc.state_dict().items()})
    src = _data(N, L, E)
    pad = np.zeros((N, L), dtype=bool)
    pad[1, -2:] = True
    with torch.no_grad():
        want = t_enc(torch.tensor(src), src_key_padding_mask=torch.tensor(pad)).numpy()
    with ta.no_grad():
        got = o_enc(ta.tensor(src), src_key_padding_mask=ta.tensor(pad)).numpy()
    np.testing.assert_allclose(got[~pad], want[~pad], atol=1e-10)
    assert not want[pad].any() and np.abs(got[pad]).min() > 0


def test_float32_transformer_matches_torch_and_trains_with_dropout(torch):
    torch.manual_seed(0)
    theirs = torch.nn.Transformer(E, NH, 1, 1, 12, dropout=0.2, batch_first=True).eval()
    ours = Transformer(E, NH, 1, 1, 12, dropout=0.2, batch_first=True).eval()
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    src, tgt = _data(N, S, E).astype(np.float32), _data(N, L, E, seed=1).astype(np.float32)
    mask = Transformer.generate_square_subsequent_mask(L)
    with torch.no_grad():
        want = theirs(torch.tensor(src), torch.tensor(tgt), tgt_mask=torch.tensor(
            mask.numpy()), tgt_is_causal=True).numpy()
    got = ours(ta.tensor(src), ta.tensor(tgt), tgt_mask=mask, tgt_is_causal=True)
    assert got.dtype == ta.float32
    np.testing.assert_allclose(got.detach().numpy(), want, atol=1e-5)
    ours.train()  # dropout on: two steps differ, and every parameter gets a gradient
    a = ours(ta.tensor(src), ta.tensor(tgt), tgt_mask=mask)
    b = ours(ta.tensor(src), ta.tensor(tgt), tgt_mask=mask)
    assert np.abs(a.detach().numpy() - b.detach().numpy()).max() > 1e-3
    (a * a).sum().backward()
    for name, p in ours.named_parameters():
        assert p.grad is not None and np.isfinite(p.grad.numpy()).all(), name


def test_functional_form_with_static_keys_matches_torch(torch):
    from nn.attention import multi_head_attention_forward

    rng = np.random.default_rng(7)
    w_in, b_in = rng.standard_normal((3 * E, E)), rng.standard_normal(3 * E)
    w_out, b_out = rng.standard_normal((E, E)), rng.standard_normal(E)
    q, k, v = _qkv()
    static_k, static_v = _data(N * NH, S + 1, E // NH, seed=8), _data(N * NH, S + 1, 4, seed=9)

    def run(lib, fn):
        t = {name: _to_lib(lib, a, True) for name, a in dict(
            q=q, k=k, v=v, w_in=w_in, b_in=b_in, w_out=w_out, b_out=b_out,
            sk=static_k, sv=static_v).items()}
        out, weights = fn(t["q"], t["k"], t["v"], E, NH, t["w_in"], t["b_in"], None, None,
                          False, 0.0, t["w_out"], t["b_out"], static_k=t["sk"],
                          static_v=t["sv"], average_attn_weights=False)
        ((out * out).sum() + (weights * weights).sum()).backward()
        return [out.detach().numpy(), weights.detach().numpy()] + [
            t[n].grad.numpy() for n in ("q", "w_in", "b_in", "w_out", "b_out", "sk", "sv")]

    ours = run(ta, multi_head_attention_forward)
    theirs = run(torch, torch.nn.functional.multi_head_attention_forward)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-9, rtol=1e-9)
