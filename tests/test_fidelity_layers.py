"""Upstream fidelity of refattn's full layers and upstream options (issue #20), in float64.

Each test builds a PyTorch module written from the official upstream file
(`tests/_upstream_layers.py`, which cites file@commit) or uses PyTorch's own module
(``torch.nn.MultiheadAttention``), copies its parameters into refattn through the builder's
state-dict map, and compares the output and every input and parameter gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _upstream_layers as U  # noqa: E402

TOL = 1e-12


def _assert_close(errs, tol=TOL):
    bad = {k: v for k, v in errs.items() if not v <= tol}
    assert not bad, f"max relative errors above {tol}: {bad} (all: {errs})"


# ------------------------------------------------------------------------------ issue item 11


@pytest.mark.parametrize("causal", [True, False])
def test_performer_pytorch_fast_attention(causal):
    rng = np.random.default_rng(11)
    layer = U.performer_fast_attention(rng, head_dim=4, nb_features=9, causal=causal)
    q, k, v = (0.7 * rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    _assert_close(U.compare_layer(layer, {"q": q, "k": k, "v": v}, rng))


def test_performer_key_sum_eps_matters_when_causal():
    from refattn.attention.linear import performer_forward

    rng = np.random.default_rng(12)
    layer = U.performer_fast_attention(rng, head_dim=4, nb_features=9, causal=True)
    q, k, v = (0.7 * rng.standard_normal((2, 3, 7, 4)) for _ in range(3))
    ref = layer.module.double()(*(torch.tensor(a) for a in (q, k, v))).numpy()
    without = performer_forward(q, k, v, **dict(layer.config, key_sum_eps=0.0))[0]
    assert np.abs(without - ref).max() > 1e-7


# ------------------------------------------------------------------------------ issue item 5


@pytest.mark.parametrize("act,norm,causal,urpe", [("elu", "simplermsnorm", True, True),
                                                  ("elu", "simplermsnorm", False, True),
                                                  ("gelu", "layernorm", True, False),
                                                  ("1+elu", "layernorm", False, True)])
def test_transnormer_norm_linear_attention(act, norm, causal, urpe):
    rng = np.random.default_rng(5)
    layer = U.transnormer_norm_linear_attention(rng, embed_dim=12, num_heads=3, act=act, norm=norm,
                                                causal=causal, urpe=urpe)
    x = rng.standard_normal((2, 6, 12))
    _assert_close(U.compare_layer(layer, {"x": x}, rng))


# ------------------------------------------------------------------------------ issue item 12


def _mha_masks(rng, kind_attn, kind_kpm, b, h, n, m):
    """Masks in refattn's convention; column 0 is never masked, so no row is fully masked."""
    am = kpm = None
    if kind_attn == "bool":
        am = rng.random((n, m)) < 0.7
        am[:, 0] = True
    elif kind_attn == "float":
        am = 0.5 * rng.standard_normal((n, m))
        am[rng.random((n, m)) < 0.2] = -np.inf
        am[:, 0] = 0.3
    elif kind_attn == "bool_per_head":
        am = rng.random((b, h, n, m)) < 0.7
        am[..., 0] = True
    if kind_kpm == "bool":
        kpm = rng.random((b, m)) < 0.7
        kpm[:, 0] = True
    elif kind_kpm == "float":
        kpm = np.where(rng.random((b, m)) < 0.3, -np.inf, 0.4 * rng.standard_normal((b, m)))
        kpm[:, 0] = 0.0
    return am, kpm


_MASKS = [("none", "none"), ("bool", "none"), ("none", "bool"), ("bool", "bool"), ("float", "float"),
          ("bool_per_head", "bool"), ("float", "none"), ("none", "float")]


def _check_mha(kdim, vdim, add_bias_kv, add_zero_attn, bias, masks, seed=12):
    rng = np.random.default_rng(seed)
    b, n, m, e, h = 2, 3, 4, 6, 2
    am, kpm = _mha_masks(rng, *masks, b, h, n, m)
    layer = U.torch_multihead_attention(rng, embed_dim=e, num_heads=h, kdim=kdim, vdim=vdim, bias=bias,
                                        add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, attn_mask=am,
                                        key_padding_mask=kpm)
    inputs = {"x": rng.standard_normal((b, n, e))}
    if kdim is not None:
        inputs.update(context=rng.standard_normal((b, m, kdim)), value=rng.standard_normal((b, m, vdim)))
    elif masks != ("none", "none") or add_bias_kv:
        inputs["context"] = rng.standard_normal((b, m, e))  # cross-attention with an equal width
    else:
        inputs = {"x": rng.standard_normal((b, m, e))}  # self-attention (N = M)
    _assert_close(U.compare_layer(layer, inputs, rng))


@pytest.mark.parametrize("kdim,vdim", [(None, None), (5, 3)])
@pytest.mark.parametrize("add_bias_kv", [False, True])
@pytest.mark.parametrize("add_zero_attn", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_torch_multihead_attention_options(kdim, vdim, add_bias_kv, add_zero_attn, bias):
    """Every combination of kdim/vdim (separate key and value inputs), add_bias_kv, add_zero_attn
    and bias, with boolean attn_mask and key_padding_mask."""
    _check_mha(kdim, vdim, add_bias_kv, add_zero_attn, bias, ("bool", "bool"))
    if kdim is None and not (add_bias_kv or add_zero_attn):
        _check_mha(kdim, vdim, add_bias_kv, add_zero_attn, bias, ("none", "none"))  # self-attention


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("add_bias_kv,add_zero_attn", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("masks", _MASKS, ids=["-".join(m) for m in _MASKS])
def test_torch_multihead_attention_masks_with_appended_rows(masks, add_bias_kv, add_zero_attn):
    """attn_mask (boolean, float, per head) and key_padding_mask (boolean, float) together with the
    appended bias and zero rows (which every mask leaves attended)."""
    _check_mha(5, 3, add_bias_kv, add_zero_attn, True, masks, seed=21)


def test_torch_multihead_attention_zero_attn_rescues_fully_masked_rows():
    # a fully masked row is NaN in PyTorch and 0 in refattn; with add_zero_attn both attend only
    # to the zero row and give the output bias
    rng = np.random.default_rng(13)
    b, n, m, e, h = 2, 3, 4, 6, 2
    kpm = np.ones((b, m), bool)
    kpm[1] = False  # every key of sequence 1 is padding
    layer = U.torch_multihead_attention(rng, embed_dim=e, num_heads=h, add_zero_attn=True, key_padding_mask=kpm)
    errs = U.compare_layer(layer, {"x": rng.standard_normal((b, n, e)), "context": rng.standard_normal((b, m, e))}, rng)
    _assert_close(errs)


# ------------------------------------------------------------------------------ full layers


@pytest.mark.parametrize("hkv,pad_key,head_kernel,gate_1d,lnr", [(2, "both", 2, True, True),
                                                                 (1, "left", None, False, False),
                                                                 (4, "right", 2, False, True)])
def test_mta_layer(hkv, pad_key, head_kernel, gate_1d, lnr):
    rng = np.random.default_rng(20)
    layer = U.mta_attention(rng, dim=6, head_dim=2, n_heads=4, n_kv_heads=hkv, rope_theta=100.0, pad_key=pad_key,
                            head_kernel_size=head_kernel, gate_1d=gate_1d, layer_norm_rescale=lnr, layer_id=2)
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 5, 6))}, rng))


@pytest.mark.parametrize("hw", [(3, 4), (4, 4)])
def test_mala_layer(hw):
    rng = np.random.default_rng(21)
    layer = U.mala_attention(rng, dim=16, num_heads=2)
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 16, *hw))}, rng))


@pytest.mark.parametrize("is_decoder,has_bias,causal,cross", [(False, True, False, False),
                                                              (True, True, True, False),
                                                              (True, False, False, True),
                                                              (False, True, False, True)])
def test_t5_attention_layer(is_decoder, has_bias, causal, cross):
    rng = np.random.default_rng(22)
    layer = U.t5_attention(rng, d_model=6, d_kv=3, n_heads=2, is_decoder=is_decoder, has_bias=has_bias,
                           num_buckets=8, max_distance=16, cross_dim=5 if cross else None, causal=causal)
    inputs = {"x": rng.standard_normal((2, 11, 6))}
    if cross:
        inputs["key_value_states"] = rng.standard_normal((2, 13, 5))
    _assert_close(U.compare_layer(layer, inputs, rng))


def test_t5_record_default_is_unscaled():
    from refattn.attention.softmax.relative import relative_position_attention_forward

    rng = np.random.default_rng(23)
    layer = U.t5_attention(rng, d_model=6, d_kv=3, n_heads=2, num_buckets=8, max_distance=16)
    sd = {k: v.detach().numpy() for k, v in layer.module.double().state_dict().items()}
    x = rng.standard_normal((1, 5, 6))
    q, k, v = ((x @ sd[f"{n}.weight"].T).reshape(1, 5, 2, 3).transpose(0, 2, 1, 3) for n in "qkv")
    o = relative_position_attention_forward(q, k, v, {"relative_attention_bias": sd["relative_attention_bias.weight"]},
                                            kind="t5", num_buckets=8, max_distance=16)[0]
    y = o.transpose(0, 2, 1, 3).reshape(1, 5, 6) @ sd["o.weight"].T
    ref = layer.module(torch.tensor(x)).detach().numpy()
    assert np.abs(y - ref).max() < 1e-12


@pytest.mark.parametrize("heads", [4, 6])
def test_alibi_layer(heads):
    rng = np.random.default_rng(24)
    layer = U.alibi_self_attention(rng, embed_dim=12, num_heads=heads)
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 7, 12))}, rng))


@pytest.mark.parametrize("ck,cv,heads", [(8, 6, 2), (6, 12, 3)])
def test_efficient_attention_layer(ck, cv, heads):
    rng = np.random.default_rng(25)
    layer = U.efficient_attention_shen(rng, in_channels=5, key_channels=ck, head_count=heads, value_channels=cv)
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 5, 3, 4))}, rng))


@pytest.mark.parametrize("heads,dim_head,max_iter,eps", [(2, 3, 3, 1.0), (3, 2, 4, 0.7), (1, 6, 1, 1.0),
                                                         (1, 4, 5, 1.3)])
def test_sinkformer_layer(heads, dim_head, max_iter, eps):
    rng = np.random.default_rng(26)
    dim = 6
    layer = U.sinkformer_attention_layer(rng, dim=dim, heads=heads, dim_head=dim_head, max_iter=max_iter, eps=eps)
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 5, dim))}, rng))


_SHAPED_CASES = {
    "sas": dict(centre_attn=True),
    "plain_v_proj": dict(centre_attn=False, value={"bias": False}, proj={"bias": False}),
    "reparam_id_qknorm": dict(centre_attn=True, value={"resid_gain": 0.7, "skip_gain": 1.2, "init_type": "id"},
                              proj={"resid_gain": 0.4, "skip_gain": 0.9, "init_type": "normal", "bias": False},
                              qk_norm=True),
}


@pytest.mark.parametrize("case", sorted(_SHAPED_CASES))
def test_shaped_attention_layer(case):
    rng = np.random.default_rng(27)
    layer = U.shaped_gpt2_attention(rng, dim=6, heads=2, **_SHAPED_CASES[case])
    _assert_close(U.compare_layer(layer, {"x": rng.standard_normal((2, 5, 6))}, rng))


# ------------------------------------------------------------------------------ layer input errors


def test_full_layers_reject_untransposed_or_misnamed_weights():
    from refattn.attention.differential.shaped import shaped_attention_layer_forward
    from refattn.attention.linear.efficient import efficient_attention_layer_forward
    from refattn.attention.linear.sinkformer import sinkformer_layer_forward
    from refattn.attention.softmax.alibi import alibi_layer_forward
    from refattn.attention.softmax.relative import t5_attention_layer_forward

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 4))
    sq = {f"{n}.weight": rng.standard_normal((4, 4)) for n in ("q", "k", "v", "o")}
    with pytest.raises(ValueError, match="relative_attention_bias.weight must have shape"):
        t5_attention_layer_forward(x, {**sq, "relative_attention_bias.weight": np.zeros((2, 8))}, num_heads=2,
                                   num_buckets=8)
    with pytest.raises(ValueError, match="unknown keys"):
        t5_attention_layer_forward(x, {**sq, "q_proj.weight": sq["q.weight"]}, num_heads=2)
    with pytest.raises(ValueError, match="q.weight must have shape"):
        t5_attention_layer_forward(x, {**sq, "q.weight": np.zeros((6, 4))}, num_heads=2)
    ap = {f"{n}.weight": np.zeros((4, 4)) for n in ("q_proj", "k_proj", "v_proj", "out_proj")}
    with pytest.raises(ValueError, match="must divide"):
        alibi_layer_forward(x, ap, num_heads=3)
    with pytest.raises(ValueError, match="to_qkv.weight must have shape"):
        sinkformer_layer_forward(x, {"to_qkv.weight": np.zeros((12, 4))}, heads=2)
    with pytest.raises(ValueError, match="head_count=3 must divide"):
        efficient_attention_layer_forward(rng.standard_normal((1, 2, 3, 3)),
                                          {"keys.weight": np.zeros((4, 2, 1, 1)), "values.weight": np.zeros((4, 2, 1, 1))},
                                          head_count=3)
    gains = {g: np.ones(2) for g in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    with pytest.raises(ValueError, match="come together"):
        shaped_attention_layer_forward(x, {"qk_attn.weight": np.zeros((4, 8)), **gains, "v_attn.weight": np.eye(4),
                                           "v_attn.skip_gain": np.ones(1)}, num_heads=2)
