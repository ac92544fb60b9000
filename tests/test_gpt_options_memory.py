"""examples/gpt_options_memory.py: for every GPT option, the ledger's saved-for-backward
bytes equal the analytic floor of the example's docstring exactly (tiny config, views and
flash), the parameters equal the count derived there, and the floor of the default model
is attention_memory.py's."""

import importlib.util
import pathlib
from dataclasses import replace

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


go = _load("gpt_options_memory")
B = 2


@pytest.mark.parametrize("attn", ["views", "flash"])
def test_measured_equals_analytic_for_every_option(attn):
    out = go.main(["--quick", "--attn", attn, "--batch", str(B)])
    assert out["exact"]
    assert set(out["rows"]) == set(go.VARIANTS)
    for name, r in out["rows"].items():
        assert r["saved"] == r["floor"], name  # exact bytes
        assert r["params"] == r["params_floor"], name
        assert r["per_token_layer"] == r["per_token_layer_floor"], name
    assert "| RMSNorm |" in out["table"] and "NumPy" in out["table"]


def test_what_each_option_changes_per_token_layer():
    """The docstring's sentences, in numbers: f = 4, C = 32, nh = 4, hs = 8."""
    cfg = go.base_config(quick=True)
    C, f = cfg.n_embd, 4
    per = {name: go.floor_bytes(replace(cfg, **opts), B)["per_token_layer"]
           for name, opts in go.VARIANTS.items()}
    base = per["nanoGPT (LayerNorm, learned, GELU, MHA)"]
    assert per["RMSNorm"] == base
    assert per["rotary (no wpe)"] - base == 2 * C * f  # rotated q and k (KV = C)
    assert per["SwiGLU"] - base == (4 * go.swiglu_hidden(C) - 8 * C) * f
    assert base - per["GQA n_kv_head=2"] == 2 * (C - 16) * f  # qkv shrinks by 2 (C - KV)
    assert base - per["MQA n_kv_head=1"] == 2 * (C - 8) * f


def test_default_floor_is_attention_memorys():
    am = _load("attention_memory")
    for attn in ("views", "flash"):
        cfg = go.base_config(quick=True, attn=attn)
        assert go.floor_bytes(cfg, B)["saved"] == am.floor_bytes(cfg, B)["saved_activations"]
        assert go.param_count(cfg) * 4 == am.floor_bytes(cfg, B)["parameters"]
