"""Samplers and parameter builders shared by the registry records of several differential modules.

Test-only (verification, not the math): V1-style parameter dictionaries and samples (used by V1,
DiffCLIP, GDA, DINT), the two-branch low-rank parameters of DiffLoRA and Shared DIFF, and the
random ``q, k, v`` and explicit softmax of the relatives' records. A private module: its names are
public so that the records of sibling modules can import them.
"""

from __future__ import annotations

import numpy as np

from ...registry import Sample
from .layer import V1_LAMBDA_KEYS, lambda_init_fn, rope_tables

__all__ = [
    "draw_lambda_vectors",
    "v1_params",
    "sample_v1",
    "v1_cases",
    "v1_sample_lambda_zero",
    "two_branch_params",
    "rand_qkv",
    "explicit_softmax",
]


def draw_lambda_vectors(rng, d, lambda_init, n=4):
    r"""λ vectors with $|1 - \lambda| \ge 0.3$: under a causal mask the first query sees one key,
    $A_1 = A_2$ there and its pre-norm output is $(1-\lambda)v_0$; RMSNorm is ill-conditioned near
    0, so a sample with $\lambda\approx 1$ is a near-kink for finite differences."""
    while True:
        vec = 0.4 * rng.standard_normal((n, d))
        lam = np.exp(vec[0] @ vec[1]) - np.exp(vec[2] @ vec[3]) + lambda_init
        if abs(1.0 - lam) >= 0.3:
            return dict(zip(V1_LAMBDA_KEYS, vec))


def v1_params(rng, C, H, Hkv, d, c_out=None, bias=False, lambda_init=0.5):
    """V1 parameters (``q_proj/k_proj/v_proj/out_proj.weight``, ``lambda_*`` with λ away from 1,
    ``subln.weight``); ``bias=True`` adds projection biases."""
    c_out = C if c_out is None else c_out
    P = {"q_proj.weight": rng.standard_normal((C, 2 * H * d)) / np.sqrt(C),
         "k_proj.weight": rng.standard_normal((C, 2 * Hkv * d)) / np.sqrt(C),
         "v_proj.weight": rng.standard_normal((C, 2 * Hkv * d)) / np.sqrt(C),
         "out_proj.weight": rng.standard_normal((2 * H * d, c_out)) / np.sqrt(2 * H * d)}
    P.update(draw_lambda_vectors(rng, d, lambda_init))
    P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(2 * d)
    if bias:
        for key, w in list(P.items()):
            if key.endswith("proj.weight"):
                P[key.replace("weight", "bias")] = 0.1 * rng.standard_normal(w.shape[1])
    return P


def sample_v1(rng, size, config=None):
    """The V1 record's sampler (also DINT's): MHA or GQA, random depth, norm, GQA pairing and RoPE.

    ``config`` (a caller's configuration, e.g. the paper's ``subln="rms"`` with
    ``subln_affine=False``) fixes what it names and the forward's defaults fix the rest: the heads,
    the norm and its affine flag, λ_init, the RoPE tables (whose shape fixes N and d). The params
    then fit that configuration (``subln.weight`` only for an affine norm, ``subln.bias`` only for
    ``"layer"``), and the returned config is the caller's, plus ``num_heads`` when it names none.
    """
    if size == "tiny":
        B, n, C, H, d = 2, int(rng.integers(2, 4)), 3, 2, 2
    else:
        B, n, C, H, d = 2, int(rng.integers(4, 7)), 6, 2, 4
    if config is not None:
        return _sample_v1_for(rng, B, n, C, H, d, dict(config))
    Hkv = int(rng.choice([1, H]))
    x = rng.standard_normal((B, n, C))
    depth = int(rng.integers(0, 6))
    subln = str(rng.choice(["rms", "rms", "layer"]))
    cfg = {"num_heads": H, "num_kv_heads": Hkv, "depth": depth, "subln": subln,
           "rel_pos": rope_tables(n, d), "gqa_pairing": str(rng.choice(["naive", "flash"]))}
    P = v1_params(rng, C, H, Hkv, d, lambda_init=lambda_init_fn(depth))
    if subln == "layer":
        P["subln.bias"] = 0.1 * rng.standard_normal(2 * d)
    return Sample(inputs={"x": x}, params=P, config=cfg)


def _sample_v1_for(rng, B, n, C, H, d, cfg):
    cfg.setdefault("num_heads", H)
    H = int(cfg["num_heads"])
    Hkv = int(cfg.get("num_kv_heads") or H)
    rel_pos = cfg.get("rel_pos")
    if rel_pos is not None:  # the tables are (N, d/2): they fix the sizes
        n, d = int(np.shape(rel_pos[0])[0]), 2 * int(np.shape(rel_pos[0])[1])
    x = rng.standard_normal((B, n, C))
    lam_init = cfg.get("lambda_init")
    if lam_init is None:
        lam_init = (lambda_init_fn(cfg["depth"], cfg.get("lambda_init_convention", "unilm"))
                    if cfg.get("depth") is not None else 0.8)
    P = v1_params(rng, C, H, Hkv, d, lambda_init=float(lam_init))
    subln, affine = cfg.get("subln", "rms"), cfg.get("subln_affine", True)
    if subln == "none" or not affine:
        del P["subln.weight"]
    elif subln == "layer":
        P["subln.bias"] = 0.1 * rng.standard_normal(2 * d)
    return Sample(inputs={"x": x}, params=P, config=cfg)


def v1_cases() -> dict:
    """Compare cases ``tiny`` and ``small`` of the V1 layer: :func:`sample_v1` following the
    caller's config (the default battery would pair the caller's config with the sampler's params,
    e.g. ``subln.bias`` drawn for ``"layer"`` under the caller's ``subln="rms"``)."""
    def case(size):
        def build(rng, config=None):
            return sample_v1(rng, size, config)
        build.__doc__ = f"diff_attention_v1 compare case: sample_v1 at {size!r}, following the caller's config"
        return build
    return {"tiny": case("tiny"), "small": case("small")}


def v1_sample_lambda_zero(rng):
    """A small V1 sample whose ``lambda_k2`` is set so that lambda = 0 (``e1 - e2 = -lambda_init``);
    returns ``(sample, params, lambda_init)``."""
    s = sample_v1(rng, "small")
    P = dict(s.params)
    lam0 = lambda_init_fn(s.config["depth"])
    e1 = np.exp(P["lambda_q1"] @ P["lambda_k1"])
    P["lambda_k2"] = P["lambda_q2"] * np.log(e1 + lam0) / (P["lambda_q2"] @ P["lambda_q2"])
    return s, P, lam0


def two_branch_params(rng, C, H, Hkv, d, dv, r, names, *, negative_term="base_lora", reparam=False,
                      norm=False, lambda_init=0.5, zero_B=False, positive_term="base_lora"):
    """Parameters of the two-branch low-rank layer (DiffLoRA, Shared DIFF) under the key names
    ``names``; ``zero_B`` is the adapters' zero initialisation."""
    P = {f"{names['q']}.weight": rng.standard_normal((C, H * d)) / np.sqrt(C),
         f"{names['k']}.weight": rng.standard_normal((C, Hkv * d)) / np.sqrt(C),
         f"{names['v']}.weight": rng.standard_normal((C, Hkv * dv)) / np.sqrt(C),
         f"{names['o']}.weight": rng.standard_normal((H * dv, C)) / np.sqrt(H * dv)}
    branches = tuple(a for a, on in (("1", positive_term == "base_lora"), ("2", negative_term != "full")) if on)
    for t, w in ((names["q"], H * d), (names["k"], Hkv * d)):
        for a in branches:
            P[f"{t}.lora_A{a}"] = rng.standard_normal((C, r)) / np.sqrt(C)
            P[f"{t}.lora_B{a}"] = np.zeros((r, w)) if zero_B else 0.5 * rng.standard_normal((r, w))
    if negative_term == "full":
        P[f"{names['q2']}.weight"] = rng.standard_normal((C, H * d)) / np.sqrt(C)
        P[f"{names['k2']}.weight"] = rng.standard_normal((C, Hkv * d)) / np.sqrt(C)
    if reparam:
        P.update(draw_lambda_vectors(rng, d, lambda_init))
    if norm:
        P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(dv)
    return P


def rand_qkv(rng, size, *, h=None, same_len=True):
    """Random SDPA-layout ``q, k, v`` for the relatives' samplers (``same_len=False``: ``M >= N``)."""
    if size == "tiny":
        b, h, n, d, dv = 2, h or 2, int(rng.integers(2, 5)), int(rng.integers(2, 4)), 2
    else:
        b, h, n, d, dv = 2, h or 3, int(rng.integers(5, 9)), 4, 3
    m = n if same_len else n + int(rng.integers(0, 3))
    return (rng.standard_normal((b, h, n, d)), rng.standard_normal((b, h, m, d)),
            rng.standard_normal((b, h, m, dv)))


def explicit_softmax(s):
    """Row softmax written out (shifted exponentials over their sum), for the explicit references."""
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
