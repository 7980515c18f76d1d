"""Low-rank, compressed and structured members of the linear family (issue 15, slice l3): Linformer,
Combiner, Fourier Transformer DCT, U-DiT, WavSpA, MRA-2 and VCC.

What the generated registry tests cannot express:

* every fast form against its explicit dense form **in the gradients** — PyTorch autograd applied to
  the explicit form (sequence projections as matrices, the DCT truncation as a matrix, masked global
  attention, dense wavelet matrices built from the filter, the dense $\\hat A$ of MRA, the dense
  $p(j|i)$ of Combiner, VCC's $X + D(f(CX) - CX)$) versus refattn's hand-derived backward;
* selections (MRA's refined block pairs, VCC's block ranking) against Python sorts over many draws;
* argument errors.

Upstream parity runs (official code, or its math transcribed to torch) are quoted in the docs; they
are not committed here.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from refattn.attention.linear import combiner as cb_mod
from refattn.attention.linear import (
    combiner_attention_backward,
    combiner_attention_forward,
    fourier_dct_attention_backward,
    fourier_dct_attention_forward,
    linformer_attention_backward,
    linformer_attention_forward,
    mra_attention,
    mra_attention_backward,
    mra_attention_forward,
    mra_block_scores,
    mra_block_selection,
    udit_attention_backward,
    udit_attention_forward,
    vcc_block_relevance,
    vcc_layer,
    vcc_layer_backward,
    vcc_layer_forward,
    vcc_sort_tokens,
    wavspa_attention,
    wavspa_attention_backward,
    wavspa_attention_forward,
)
from refattn.attention.linear import fourier_dct as ft_mod
from refattn.attention.linear import linformer as lf_mod
from refattn.attention.linear import mra as mra_mod
from refattn.attention.linear import udit as ud_mod
from refattn.attention.linear import vcc as vcc_mod
from refattn.attention.linear import wavspa as ws_mod
from refattn.registry import call_forward

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _compare_grads(forward, backward, sample, torch_fn, rng, tol=1e-12):
    """refattn's backward vs torch autograd of an explicit form, on every input and parameter."""
    arrays = {**sample.inputs, **(sample.params or {})}
    out, cache = call_forward(SimpleNamespace(forward=forward), sample.inputs, sample.params, sample.config)
    g = rng.standard_normal(out.shape)
    grads = backward(g, cache)
    tens = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    y = torch_fn(tens, sample.config)
    assert y.shape == out.shape
    fwd = float(np.max(np.abs(y.detach().numpy() - out)))
    y.backward(torch.tensor(g))
    worst = {}
    for k, t in tens.items():
        ref = t.grad.numpy()
        worst[k] = float(np.max(np.abs(grads[k] - ref)) / max(np.max(np.abs(ref)), 1.0))
    assert fwd < tol and max(worst.values()) < tol, (fwd, worst)
    return fwd, worst


def _lin(t, name, a):
    y = a @ t[f"{name}.weight"]
    return y + t[f"{name}.bias"] if f"{name}.bias" in t else y


def _mha(q, k, v, heads, bias=None):
    d = q.shape[-1] // heads
    outs = []
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        sc = q[..., sl] @ k[..., sl].transpose(-1, -2) / math.sqrt(d)
        if bias is not None:
            sc = sc + bias
        outs.append(torch.softmax(sc, -1) @ v[..., sl])
    return torch.cat(outs, -1)


# --------------------------------------------------------------------------------------------
# Fast forms vs explicit forms, gradients included


def _t_linformer(t, cfg):
    x, h = t["x"], cfg["num_heads"]
    n, c = x.shape[1], x.shape[2]
    d = c // h
    vkey = "compress_v" if "compress_v.weight" in t else "compress_k"
    heads = []
    for hh in range(h):
        cols = slice(hh * d, (hh + 1) * d)
        e = (t["compress_k.weight"][hh] if t["compress_k.weight"].ndim == 3 else t["compress_k.weight"])[:n].T
        f = (t[f"{vkey}.weight"][hh] if t[f"{vkey}.weight"].ndim == 3 else t[f"{vkey}.weight"])[:n].T
        q = _lin(t, "q_proj", x)[..., cols]
        if cfg["compress_input"]:
            k, v = _lin(t, "k_proj", e @ x)[..., cols], _lin(t, "v_proj", f @ x)[..., cols]
        else:
            k, v = e @ _lin(t, "k_proj", x)[..., cols], f @ _lin(t, "v_proj", x)[..., cols]
        heads.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v)
    return _lin(t, "out_proj", torch.cat(heads, -1))


@pytest.mark.parametrize("sharing", lf_mod.LINFORMER_SHARING)
@pytest.mark.parametrize("compress_input", [True, False])
def test_linformer_gradients_vs_explicit_projections(sharing, compress_input):
    rng = np.random.default_rng(0)
    s = lf_mod._draw(rng, "small", sharing=sharing, compress_input=compress_input)
    _compare_grads(linformer_attention_forward, linformer_attention_backward, s, _t_linformer, rng)


def _t_fourier(t, cfg):
    x = t["x"]
    tlen = x.shape[1]
    cls = cfg["pooling_mode"] == "CLS"
    body = x[:, 1:] if cls else x
    length = body.shape[1]
    keep = min(math.ceil(tlen * cfg["dct_percentage"]), length)
    m = torch.tensor(ft_mod._dct_matrix(keep).T @ ft_mod._dct_matrix(length)[:keep])
    xs = m @ body
    if cls:
        xs = torch.cat([x[:, :1], xs], 1)
    q, k, v = (_lin(t, nm, xs) for nm in ("W_q", "W_k", "W_v"))
    out = _lin(t, "ff", _mha(q, k, v, cfg["num_heads"]))
    return out + xs if cfg["residual"] else out


@pytest.mark.parametrize("pooling_mode", ["CLS", "MEAN"])
@pytest.mark.parametrize("ratio", [0.2, 0.5, 1.0])
def test_fourier_dct_gradients_vs_explicit_matrix(pooling_mode, ratio):
    rng = np.random.default_rng(1)
    s = ft_mod._draw(rng, "small", pooling_mode=pooling_mode, ratio=ratio)
    _compare_grads(fourier_dct_attention_forward, fourier_dct_attention_backward, s, _t_fourier, rng)


def _t_udit(t, cfg):
    x, h = t["x"], cfg["num_heads"]
    b, c, hh, ww = x.shape
    f, d = 2, c // h
    k = t["downsampler.layer.weight"].shape[-1]
    xc = F.conv2d(x, t["downsampler.layer.weight"], t["downsampler.layer.bias"], padding=(k - 1) // 2, groups=c)
    if cfg["down_shortcut"]:
        xc = xc + x
    tok = xc.reshape(b, c, hh * ww).transpose(1, 2)  # pixels, row-major
    qkv = tok @ t["to_qkv.weight"] + t["to_qkv.bias"]
    q, kk, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
    ii, jj = np.divmod(np.arange(hh * ww), ww)
    same = torch.tensor(((ii % f) * f + jj % f)[:, None] == ((ii % f) * f + jj % f)[None, :])
    mloc = (ii // f) * (ww // f) + jj // f
    outs = []
    for head in range(h):
        sl = slice(head * d, (head + 1) * d)
        qh, kh = q[..., sl], kk[..., sl]
        if cfg["posemb"] == "rope2d":
            ang = torch.tensor(ud_mod.udit_rope2d_angles((hh // f) * (ww // f), d)[mloc])
            cos, sin = torch.cos(ang), torch.sin(ang)
            qh, kh = (torch.stack([a[..., 0::2] * cos - a[..., 1::2] * sin, a[..., 0::2] * sin + a[..., 1::2] * cos],
                                  -1).flatten(-2) for a in (qh, kh))
        if cfg["attn_type"] == "v2":
            sc = F.normalize(qh, dim=-1) @ F.normalize(kh, dim=-1).transpose(-1, -2)
            sc = sc * torch.clamp(t["logit_scale"][head, 0, 0], max=4.6052).exp()
        else:
            sc = qh @ kh.transpose(-1, -2) / math.sqrt(d)
        sc = sc.masked_fill(~same, -math.inf)
        outs.append(torch.softmax(sc, -1) @ v[..., sl])
    y = torch.cat(outs, -1).transpose(1, 2).reshape(b, c, hh, ww)
    return F.conv2d(y, t["to_out.weight"], t["to_out.bias"])


@pytest.mark.parametrize("attn_type", ud_mod.UDIT_ATTN_TYPES)
@pytest.mark.parametrize("posemb", ud_mod.UDIT_POSEMB)
def test_udit_gradients_vs_masked_global_attention(attn_type, posemb):
    rng = np.random.default_rng(2)
    s = ud_mod._draw(rng, "small", attn_type, posemb, bool(rng.integers(0, 2)))
    _compare_grads(udit_attention_forward, udit_attention_backward, s, _t_udit, rng)


def _t_wavspa(t, cfg):
    x, filt, h = t["x"], t["adawave"], cfg["num_heads"]
    b, n, c = x.shape
    level, boundary = cfg["level"], cfg["boundary"]
    L = filt.shape[0]
    sign = torch.tensor([(-1.0) ** (m + 1) for m in range(L)])

    def mats(m_len, col):  # differentiable dense analysis matrices of one level for one channel
        lo, hi = ws_mod._pads(m_len, L, boundary)
        big_p = m_len + lo + hi
        pad, _, _, crop = ws_mod._level_matrices(m_len, np.ones(L), boundary)
        shifts = np.zeros((L, big_p // 2, big_p))
        for m in range(L):
            shifts[m, np.arange(big_p // 2), (2 * np.arange(big_p // 2) + m) % big_p] = 1.0
        shifts = torch.tensor(shifts)
        hcol = filt[:, col]
        g = sign * torch.flip(hcol, [0])
        wl = torch.einsum("m,mjp->jp", torch.flip(hcol, [0]), shifts)
        wh = torch.einsum("m,mjp->jp", torch.flip(g, [0]), shifts)
        return torch.tensor(pad), wl, wh, torch.tensor(crop), (big_p // 2)

    per = []
    for col in range(c):
        m_len, lv = n, []
        for _ in range(level):
            lv.append(mats(m_len, col))
            m_len = lv[-1][4]
        per.append(lv)
    bands_per_ch = []
    for col in range(c):
        a, his = x[..., col], []
        for pad, wl, wh, _, _ in per[col]:
            ap = a @ pad.T
            his.append(ap @ wh.T)
            a = ap @ wl.T
        bands_per_ch.append([a] + his[::-1])
    outs = []
    for i in range(level + 1):
        band = torch.stack([bands_per_ch[col][i] for col in range(c)], -1)
        pre = f"SelfAttention_{i}"
        q, k, v = (band @ t[f"{pre}.{nm}.kernel"] for nm in ("query", "key", "value"))
        outs.append(_mha(q, k, v, h) @ t[f"{pre}.out.kernel"])
    ys = []
    for col in range(c):
        a = outs[0][..., col]
        for lev in range(level - 1, -1, -1):
            _, wl, wh, crop, _ = per[col][lev]
            a = (a @ wl + outs[level - lev][..., col] @ wh) @ crop.T
        ys.append(a)
    return torch.stack(ys, -1)


@pytest.mark.parametrize("boundary", ws_mod.WAVELET_BOUNDARIES)
@pytest.mark.parametrize("level", [1, 2])
def test_wavspa_gradients_vs_dense_wavelet_matrices(boundary, level):
    rng = np.random.default_rng(3)
    s = ws_mod._draw(rng, "small", boundary=boundary, level=level)
    _compare_grads(wavspa_attention_forward, wavspa_attention_backward, s, _t_wavspa, rng)


def _t_mra(sample):
    cfg = sample.config
    q0, k0 = sample.inputs["q"], sample.inputs["k"]
    b = cfg["block_size"]
    lam, _, score = mra_block_scores(q0, k0, b, q0.shape[-1] ** -0.5, cfg["initial_prior_first_n_blocks"],
                                     cfg["initial_prior_diagonal_n_blocks"])
    bi, bj = mra_block_selection(score, cfg["num_blocks"])
    nb = lam.shape[-1]
    sel = np.zeros(lam.shape, dtype=bool)
    for idx in np.ndindex(*lam.shape[:-2]):
        sel[idx][bi[idx], bj[idx]] = True
    tok = torch.tensor(np.repeat(np.repeat(sel, b, axis=-2), b, axis=-1))  # refined (i, j), fixed
    eps = cfg.get("eps", 1e-6)

    def fn(t, _cfg):
        q, k, v = t["q"], t["k"], t["v"]
        d = q.shape[-1]
        s = d ** -0.5
        qh = q.reshape(q.shape[:-2] + (nb, b, d)).mean(-2)
        kh = k.reshape(k.shape[:-2] + (nb, b, d)).mean(-2)
        lam_t = s * qh @ kh.transpose(-1, -2)
        mu = lam_t.max(-1).values
        up = lam_t.repeat_interleave(b, -2).repeat_interleave(b, -1)
        full = s * q @ k.transpose(-1, -2)
        big_m = torch.where(tok, full, torch.tensor(-math.inf)).max(-1).values
        if cfg["approx_mode"] == "full":
            a = torch.where(tok, full, up)
            c = torch.maximum(mu.repeat_interleave(b, -1), big_m)
        else:
            a = torch.where(tok, full, torch.tensor(-math.inf))
            c = big_m
        cs = torch.where(torch.isfinite(c), c, torch.zeros_like(c))
        w = torch.exp(a - cs[..., None])
        out = (w @ v) / (w.sum(-1, keepdim=True) + eps)
        return torch.where(torch.isfinite(c)[..., None], out, torch.zeros_like(out))
    return fn


@pytest.mark.parametrize("approx_mode", mra_mod.MRA_MODES)
@pytest.mark.parametrize("priors", [False, True])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_mra_gradients_vs_dense_matrix(approx_mode, priors, eps):
    rng = np.random.default_rng(4)
    s = mra_mod._draw(rng, "small", approx_mode, priors)
    s.config["eps"] = eps
    _compare_grads(mra_attention_forward, mra_attention_backward, s, _t_mra(s), rng)


def _t_combiner(t, cfg):
    x, h, seg = t["x"], cfg["num_heads"], cfg["seg_len"]
    q, k, v = (x @ t[f"{nm}.kernel"] for nm in ("query", "key", "value"))
    b, n, c = q.shape
    d = c // h
    pool = (lambda a: a.max(-2).values) if cfg["pooling"] == "max" else (lambda a: a.sum(-2))
    part = cb_mod._partition(n, seg, cfg["variant"])
    outs = []
    for hh in range(h):
        sl = slice(hh * d, (hh + 1) * d)
        qh, kh, vh = q[..., sl], k[..., sl], v[..., sl]
        rows = []
        for i, (direct, regions) in enumerate(part):
            logits = [(qh[:, i] * kh[:, j]).sum(-1) / math.sqrt(d) for j in direct]
            logits += [(qh[:, i] * pool(kh[:, r])).sum(-1) / math.sqrt(d) for r in regions]
            p = torch.softmax(torch.stack(logits, -1), -1)
            o = sum(p[:, a, None] * vh[:, j] for a, j in enumerate(direct))
            for a, r in enumerate(regions):
                loc = torch.softmax((pool(qh[:, r])[:, None, :] * kh[:, r]).sum(-1) / math.sqrt(d), -1)
                o = o + p[:, len(direct) + a, None] * (loc[..., None] * vh[:, r]).sum(1)
            rows.append(o)
        outs.append(torch.stack(rows, 1))
    return torch.cat(outs, -1) @ t["out.kernel"]


@pytest.mark.parametrize("variant, pooling", [("mixture", "max"), ("mixture", "sum"), ("axial", "max"),
                                               ("fixed", "sum")])
def test_combiner_gradients_vs_dense_factorisation(variant, pooling):
    rng = np.random.default_rng(5)
    s = cb_mod._draw(rng, "tiny", variant, pooling)
    _compare_grads(combiner_attention_forward, combiner_attention_backward, s, _t_combiner, rng)


def test_combiner_dense_matrix_matches_core():
    """O = A V with the public explicit form equals the core's output, every variant and pooling."""
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 12, 3)) for _ in range(3))
    for variant in cb_mod.COMBINER_VARIANTS:
        for pooling in cb_mod.COMBINER_POOLING:
            a = cb_mod.combiner_dense_matrix(q, k, seg_len=4, variant=variant, pooling=pooling)
            out = cb_mod.combiner_core_forward(q, k, v, seg_len=4, variant=variant, pooling=pooling)[0]
            assert np.max(np.abs(a @ v - out)) < 1e-13


def _t_vcc(sample):
    cfg = sample.config
    x0, p0 = sample.inputs["x"], sample.params
    _, cache = vcc_layer_forward(x0, p0, **cfg)
    order, fine, crs = cache["order"], cache["fine"], cache["crs"]
    bsz, n, c = x0.shape
    r, b = cfg["num_important_tokens"], cfg["block_size"]
    cmats, dmats, dups = [], [], []
    for bi in range(bsz):  # C and D from the (fixed) ranking
        rest = order[bi, r:]
        rows = ([("t", [rest[j * b + u]]) for j in fine[bi] for u in range(b)]
                + [("b", list(rest[j * b:(j + 1) * b])) for j in crs[bi]] + [("t", [t]) for t in order[bi, :r]])
        cm, dm = np.zeros((len(rows), n)), np.zeros((n, len(rows)))
        for ri, (kind, toks) in enumerate(rows):
            cm[ri, toks] = 1.0 if kind == "t" else 1.0 / (b + 1e-4)
            dm[toks, ri] = 1.0
        cmats.append(cm)
        dmats.append(dm)
        dups.append([1.0 if kind == "t" else float(b) for kind, _ in rows])
    cmat, dmat = torch.tensor(np.stack(cmats)), torch.tensor(np.stack(dmats))
    kb = np.log(np.ones_like(np.array(dups)) + 1e-4)
    if cfg["scale_correction"]:
        kb = kb + np.log(np.array(dups) + 1e-4)
    kb = torch.tensor(kb)[:, None, :]

    def fn(t, _cfg):
        s = cmat @ t["x"]
        hh = F.layer_norm(s, (c,), t["attention.LayerNorm.weight"], t["attention.LayerNorm.bias"], 1e-5)
        q, k, v = (_lin(t, f"attention.{nm}", hh) for nm in ("query", "key", "value"))
        att = _lin(t, "attention.dense", _mha(q, k, v, cfg["num_heads"], kb))
        u = _lin(t, "FFN.1", F.layer_norm(att + s, (c,), t["FFN.0.weight"], t["FFN.0.bias"], 1e-5))
        fs = s + _lin(t, "FFN.3", F.gelu(u)) + att
        return t["x"] + dmat @ (fs - s)
    return fn


@pytest.mark.parametrize("trial", range(3))
def test_vcc_gradients_vs_explicit_compression(trial):
    rng = np.random.default_rng(7 + trial)
    s = vcc_mod._draw(rng, "small", score_gradient="exact")
    _compare_grads(vcc_layer_forward, vcc_layer_backward, s, _t_vcc(s), rng)


# --------------------------------------------------------------------------------------------
# Selections against brute force


def test_mra_selection_vs_sort_many_draws():
    rng = np.random.default_rng(8)
    for _ in range(30):
        nb = int(rng.integers(2, 6))
        score = rng.standard_normal((2, nb, nb))
        k = int(rng.integers(0, nb * nb + 2))
        bi, bj = mra_block_selection(score, k)
        for g in range(2):
            want = sorted(((score[g, i, j], i, j) for i in range(nb) for j in range(nb)), reverse=True)[:k]
            assert set(zip(bi[g].tolist(), bj[g].tolist())) == {(i, j) for _, i, j in want}


def test_mra_priors_force_blocks():
    """Priors select the diagonal band and the first block row/column before any coarse score."""
    rng = np.random.default_rng(9)
    q, k = rng.standard_normal((1, 1, 32, 4)), rng.standard_normal((1, 1, 32, 4))
    _, _, score = mra_block_scores(q, k, 4, 0.5, first_n=1, diagonal_n=3)
    nb = 8
    band = {(i, j) for i in range(nb) for j in range(nb) if abs(i - j) <= 1 or i == 0 or j == 0}
    bi, bj = mra_block_selection(score, len(band))
    assert set(zip(bi[0, 0].tolist(), bj[0, 0].tolist())) == band


def test_vcc_ranking_vs_sort():
    """The decompressed blocks are the top-m of an explicitly computed VIP relevance."""
    rng = np.random.default_rng(10)
    for _ in range(5):
        s = vcc_mod._draw(rng, "small")
        x, p, cfg = s.inputs["x"], s.params, s.config
        _, cache = vcc_layer_forward(x, p, **cfg)
        order = vcc_sort_tokens(cfg["importance_mask"])
        assert np.array_equal(order, np.stack([sorted(range(x.shape[1]), key=lambda t, m=msk: (not m[t], t))
                                               for msk in cfg["importance_mask"]]))
        r, b = cfg["num_important_tokens"], cfg["block_size"]
        xs = np.take_along_axis(x, order[..., None], 1)
        nb = (x.shape[1] - r) // b
        coarse = xs[:, r:].reshape(x.shape[0], nb, b, -1).sum(2) / (b + 1e-4)
        imp = np.take_along_axis(cfg["importance_mask"], order, 1)[:, :r].astype(float)
        pbar, _ = vcc_block_relevance(xs[:, :r], coarse, imp, p, cfg["num_heads"])
        for g in range(x.shape[0]):
            want = sorted(range(nb), key=lambda j: -pbar[g, j])[:cfg["num_fine_blocks"]]
            assert set(cache["fine"][g].tolist()) == set(want)


def test_vcc_output_for_coarse_tokens_is_shifted_input():
    """A token of a still-compressed block moves by its block's coarse update: x_j + f(S)_J - c_J, so
    two tokens of one coarse block keep their difference."""
    rng = np.random.default_rng(11)
    s = vcc_mod._draw(rng, "small", m=1)
    x, p, cfg = s.inputs["x"], s.params, s.config
    out, cache = vcc_layer_forward(x, p, **cfg)
    order, r, b = cache["order"], cfg["num_important_tokens"], cfg["block_size"]
    for g in range(x.shape[0]):
        for j in cache["crs"][g]:
            toks = order[g, r + j * b:r + (j + 1) * b]
            d_in = x[g, toks] - x[g, toks[0]]
            d_out = out[g, toks] - out[g, toks[0]]
            assert np.max(np.abs(d_in - d_out)) < 1e-13


# --------------------------------------------------------------------------------------------
# Further identities and argument errors


def test_wavspa_perfect_reconstruction_db_orders():
    rng = np.random.default_rng(12)
    for p_ord in range(1, 7):
        filt = np.repeat(ws_mod.daubechies_filter(p_ord)[:, None], 2, axis=1)
        x = rng.standard_normal((1, 41, 2))
        bands, _ = ws_mod.wavedec(x, filt, 2, "reflect")
        assert np.max(np.abs(ws_mod.waverec(bands, filt, 41, "reflect")[0] - x)) < 1e-12


def test_mra_full_refinement_equals_torch_sdpa():
    rng = np.random.default_rng(13)
    q, k, v = (rng.standard_normal((2, 2, 16, 4)) for _ in range(3))
    ref = F.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v))).numpy()
    out = mra_attention(q, k, v, num_blocks=16, block_size=4, eps=0.0)
    assert np.max(np.abs(out - ref)) < 1e-13


@pytest.mark.parametrize("call, match", [
    (lambda s: linformer_attention_forward(np.zeros((2, 40, 8)), s["lf"].params, num_heads=2), "max_seq_len"),
    (lambda s: linformer_attention_forward(s["lf"].inputs["x"], s["lf"].params, num_heads=3), "num_heads"),
    (lambda s: linformer_attention_forward(s["lf"].inputs["x"], s["lf"].params, num_heads=2, sharing="rows"),
     "sharing"),
    (lambda s: fourier_dct_attention_forward(s["ft"].inputs["x"], s["ft"].params, num_heads=2, dct_percentage=1.5),
     "dct_percentage"),
    (lambda s: udit_attention_forward(np.zeros((1, 8, 5, 6)), s["ud"].params, num_heads=2), "down_factor"),
    (lambda s: udit_attention_forward(s["ud"].inputs["x"], s["ud"].params, num_heads=2, attn_type="v3"), "attn_type"),
    (lambda s: wavspa_attention(np.zeros((2, 13, 6)), s["ws"].params, num_heads=2, level=s["ws"].config["level"],
                                boundary="periodic"), "periodic"),
    (lambda s: mra_attention(np.zeros((1, 1, 10, 2)), np.zeros((1, 1, 10, 2)), np.zeros((1, 1, 10, 2)),
                             num_blocks=2, block_size=4), "block_size"),
    (lambda s: mra_attention(*(np.zeros((1, 1, 8, 2)),) * 3, num_blocks=0, block_size=4, approx_mode="sparse"),
     "num_blocks"),
    (lambda s: combiner_attention_forward(np.zeros((2, 10, 6)), s["cb"].params, num_heads=2, seg_len=3), "seg_len"),
    (lambda s: combiner_attention_forward(s["cb"].inputs["x"], s["cb"].params, num_heads=2, seg_len=3,
                                          variant="logsparse"), "variant"),
    (lambda s: vcc_layer(s["vc"].inputs["x"], s["vc"].params, **dict(s["vc"].config, num_fine_blocks=9)),
     "num_fine_blocks"),
    (lambda s: vcc_layer(s["vc"].inputs["x"], s["vc"].params,
                         **dict(s["vc"].config, importance_mask=s["vc"].config["importance_mask"].astype(int))),
     "importance_mask"),
])
def test_argument_errors(call, match):
    rng = np.random.default_rng(14)
    samples = {"lf": lf_mod._draw(rng, "small", sharing="headwise"), "ft": ft_mod._draw(rng, "small"),
               "ud": ud_mod._draw(rng, "small", "v2", "rope2d", True), "ws": ws_mod._draw(rng, "small"),
               "cb": cb_mod._draw(rng, "small"), "vc": vcc_mod._draw(rng, "small")}
    with pytest.raises((ValueError, TypeError), match=match):
        call(samples)
