r"""PhysGTO projection-inspired attention: learned tokens project the mesh, attend, and re-project back.

Paper: Pengwei Liu, Xingyu Ren, Pengkai Wang, Hangjie Yuan, Zhongkai Hao, Guanyu Chen, Chao Xu,
Dong Ni, Shengze Cai, "An Efficient Graph-Transformer Operator for Learning Physical Dynamics with
Manifolds Embedding" (PhysGTO), arXiv 2512.10227. Upstream: pengwei07/PhysGTO
``code/task1/src/atten.py`` (``Atten``), ``code/task2/src/model/atten.py`` (``GTO_Atten``),
``code/task3/src/model/atten.py`` (``Atten``) @ 198d88f0dcb2c20da7b343a7ec8db33dbb4f74dd.

Which part of the model
-----------------------
A PhysGTO block (the "Graph Transformer Operator" of the latent space) runs a flux-oriented
message-passing step on the mesh graph and this global attention; the unified graph embedding, the
mesh sampler and the decoder are ordinary MLP/graph layers left to this text. The attention costs
$O(NM)$ for $N$ mesh points and $M$ learned tokens (linear in $N$).

Forward (``variant="task1"``, the unstructured-mesh benchmarks)
---------------------------------------------------------------
Learned queries $Q\in\mathbb R^{H\times M\times d}$ ($d = C/H$), input $X\in\mathbb R^{N\times C}$,
heads split head-major (``b n (h c)``):

$$[K_1|V_1] = XW_{kv1} + b_{kv1},\qquad A_1 = \mathrm{softmax}_N\big(QK_1^\top/\sqrt d\big),\qquad T = A_1V_1
\quad(\text{projection: } M \text{ tokens per head}),$$

$$[K_2|V_2] = TW_{kv2} + b_{kv2}\ (\text{per head, width } d\to 2d),\qquad Q_3 = XW_{q3} + b_{q3},$$

$$Y = \big[\mathrm{softmax}_M(Q_3K_2^\top/\sqrt d)\,V_2\big]_{\text{heads merged}}\,W_{o} + b_{o}
\quad(\text{re-projection onto the } N \text{ points}).$$

Variants (keyword ``variant``; the three task folders of the official repository disagree):

* ``"task1"`` (default; ``code/task1``, the five unstructured-mesh datasets): as above, params
  ``Q, kv_1, kv_2, q_3, out_proj``.
* ``"task2"`` (``code/task2``, ``GTO_Atten``): one projection ``kv_1`` (C→C) serves as key *and*
  value of the first attention, ``qkv_2`` (d→2d, no bias), output ``proj``.
* ``"task3"`` (``code/task3``, 3-D geometries): three ``nn.MultiheadAttention`` layers,
  $T = \mathrm{MHA}_1(Q, X, X)$ with $Q\in\mathbb R^{M\times C}$, $T \leftarrow \mathrm{MHA}_2(T, T, T)$
  (self-attention among the tokens), $Y = \mathrm{MHA}_3(X, T, T)$.

Upstream applies dropout 0.1 to the attention weights in task 1 (training only); this is the eval
forward.

Backward
--------
Every attention is the standard softmax-attention VJP (``attention_core_backward``; ``mha_backward``
for task 3). The learned queries are broadcast over the batch, so $dQ = \sum_b dQ_b$. The linear maps
give $dW = \text{input}^\top d\text{out}$, $d\text{input} = d\text{out}\,W^\top$; ``kv_1`` in task 2 feeds
both key and value, so its output gradient is $dK + dV$. $dX$ collects the contributions through
$K_1, V_1$ (first attention) and $Q_3$ (re-projection).

Conventions
-----------
* Weights ``(in, out)`` = ``nn.Linear.weight.T``. Task 3's ``nn.MultiheadAttention`` parameters keep
  upstream names: ``attention{i}.in_proj_weight`` is ``in_proj_weight.T`` (C, 3C) (columns: q, k,
  v), ``attention{i}.out_proj.weight`` is ``out_proj.weight.T``.
* Scores are scaled by $1/\sqrt d$ with $d$ the head width in every variant.

Agreement with upstream
-----------------------
Each upstream class (``Atten``/``GTO_Atten``/``Atten``) in PyTorch float64 on CPU, eval mode, biases
randomised ($B = 2$, $N = 50$, $C = 16$, $H = 4$, $M = 8$), maximum error relative to the largest
entry: task 1 output 5.6e-16, gradients <= 1.2e-14; task 2 5.7e-16 / 7.6e-14; task 3 4.9e-16 /
1.1e-15.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward, mha_backward, mha_forward
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..registry import Mechanism, Sample, register
from .common import xavier_uniform

__all__ = ["physgto_attention_forward", "physgto_attention_backward", "physgto_attention",
           "init_physgto_attention_params", "PHYSGTO_VARIANTS"]

PHYSGTO_VARIANTS = ("task1", "task2", "task3")


def _spec(variant, c, h, m):
    d = c // h
    if variant == "task1":
        return {"Q": (h, m, d), "kv_1.weight": (c, 2 * c), "kv_1.bias": (2 * c,), "kv_2.weight": (d, 2 * d),
                "kv_2.bias": (2 * d,), "q_3.weight": (c, c), "q_3.bias": (c,), "out_proj.weight": (c, c),
                "out_proj.bias": (c,)}
    if variant == "task2":
        return {"Q": (h, m, d), "kv_1.weight": (c, c), "kv_1.bias": (c,), "qkv_2.weight": (d, 2 * d),
                "q_3.weight": (c, c), "q_3.bias": (c,), "proj.weight": (c, c), "proj.bias": (c,)}
    spec = {"Q": (m, c)}
    for i in (1, 2, 3):
        spec.update({f"attention{i}.in_proj_weight": (c, 3 * c), f"attention{i}.in_proj_bias": (3 * c,),
                     f"attention{i}.out_proj.weight": (c, c), f"attention{i}.out_proj.bias": (c,)})
    return spec


def _validate(x, params, num_heads, variant):
    x = as_float(x, "x", ndim=3)
    c = x.shape[2]
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    if c % num_heads:
        raise ValueError(f"the channel width C={c} (x's last axis) must be divisible by num_heads={num_heads}")
    check_choice(variant, "variant", PHYSGTO_VARIANTS)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    q = params.get("Q")
    if q is None:
        raise ValueError("params is missing 'Q' (the learned token queries)")
    q = as_float(q, "Q", ndim=2 if variant == "task3" else 3)
    m = q.shape[0] if variant == "task3" else q.shape[1]
    p = check_params(params, _spec(variant, c, num_heads, m))
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads


def _mha_params(p, i, c):
    w, b = p[f"attention{i}.in_proj_weight"], p[f"attention{i}.in_proj_bias"]
    return {"q_proj": w[:, :c], "k_proj": w[:, c:2 * c], "v_proj": w[:, 2 * c:], "out_proj": p[f"attention{i}.out_proj.weight"],
            "q_proj_bias": b[:c], "k_proj_bias": b[c:2 * c], "v_proj_bias": b[2 * c:],
            "out_proj_bias": p[f"attention{i}.out_proj.bias"]}


def _mha_grads(grads, g, i):
    grads[f"attention{i}.in_proj_weight"] = np.concatenate([g["q_proj"], g["k_proj"], g["v_proj"]], axis=1)
    grads[f"attention{i}.in_proj_bias"] = np.concatenate([g["q_proj_bias"], g["k_proj_bias"], g["v_proj_bias"]])
    grads[f"attention{i}.out_proj.weight"] = g["out_proj"]
    grads[f"attention{i}.out_proj.bias"] = g["out_proj_bias"]


def physgto_attention_forward(x, params, *, num_heads: int, variant: str = "task1"):
    r"""PhysGTO's projection-inspired attention (module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Features of the N mesh points.
    params : dict
        ``"task1"``: ``Q (H, M, C/H)``, ``kv_1.weight (C, 2C)``/``.bias``, ``kv_2.weight (C/H, 2C/H)``/``.bias``,
        ``q_3.weight (C, C)``/``.bias``, ``out_proj.weight (C, C)``/``.bias``.
        ``"task2"``: ``Q (H, M, C/H)``, ``kv_1 (C, C)``/bias, ``qkv_2.weight (C/H, 2C/H)`` (no bias),
        ``q_3``, ``proj``. ``"task3"``: ``Q (M, C)`` and ``attention{1,2,3}.in_proj_weight (C, 3C)``,
        ``.in_proj_bias (3C,)``, ``.out_proj.weight (C, C)``, ``.out_proj.bias (C,)``.
        Linear weights ``(in, out)`` = ``nn.Linear.weight.T``.
    num_heads : int
    variant : {"task1", "task2", "task3"}
        Which of the official repository's three implementations (module docstring).

    Returns
    -------
    out, cache
        ``out (B, N, C)``.
    """
    x, p, h = _validate(x, params, num_heads, variant)
    b, n, c = x.shape
    if variant == "task3":
        q = np.broadcast_to(p["Q"], (b,) + p["Q"].shape)
        t1, c1 = mha_forward(q, x, _mha_params(p, 1, c), num_heads=h)
        t2, c2 = mha_forward(t1, None, _mha_params(p, 2, c), num_heads=h)
        out, c3 = mha_forward(x, t2, _mha_params(p, 3, c), num_heads=h)
        return out, dict(variant=variant, p=p, x=x, mha=(c1, c2, c3), out_shape=out.shape)
    kv1 = linear_prefixed(p, "kv_1", x)
    if variant == "task1":
        k1, v1 = split_heads(kv1[..., :c], h), split_heads(kv1[..., c:], h)
    else:
        k1 = v1 = split_heads(kv1, h)
    q = np.broadcast_to(p["Q"], (b,) + p["Q"].shape)
    tok, a1 = attention_core_forward(q, k1, v1)
    kv2 = linear_prefixed(p, "kv_2" if variant == "task1" else "qkv_2", tok)
    dh = c // h
    k2, v2 = kv2[..., :dh], kv2[..., dh:]
    q3 = linear_prefixed(p, "q_3", x)
    o, a2 = attention_core_forward(split_heads(q3, h), k2, v2)
    om = merge_heads(o)
    out = linear_prefixed(p, "out_proj" if variant == "task1" else "proj", om)
    return out, dict(variant=variant, p=p, x=x, h=h, tok=tok, om=om, a1=a1, a2=a2, out_shape=out.shape)


def physgto_attention_backward(dout, cache):
    """Gradients of :func:`physgto_attention_forward`: ``x`` and every params key."""
    p, x, variant = cache["p"], cache["x"], cache["variant"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    if variant == "task3":
        c1, c2, c3 = cache["mha"]
        g3 = mha_backward(g, c3)
        _mha_grads(grads, g3, 3)
        g2 = mha_backward(g3["context"], c2)
        _mha_grads(grads, g2, 2)
        g1 = mha_backward(g2["x"], c1)
        _mha_grads(grads, g1, 1)
        grads["Q"] = g1["x"].sum(axis=0)
        grads["x"] = g3["x"] + g1["context"]
        return grads
    h = cache["h"]
    dom = linear_prefixed_vjp(grads, p, "out_proj" if variant == "task1" else "proj", g, cache["om"])
    ga2 = attention_core_backward(split_heads(dom, h), cache["a2"])
    dx = linear_prefixed_vjp(grads, p, "q_3", merge_heads(ga2["q"]), x)
    dtok = linear_prefixed_vjp(grads, p, "kv_2" if variant == "task1" else "qkv_2",
                               np.concatenate([ga2["k"], ga2["v"]], axis=-1), cache["tok"])
    ga1 = attention_core_backward(dtok, cache["a1"])
    grads["Q"] = ga1["q"].sum(axis=0)
    if variant == "task1":
        dkv1 = np.concatenate([merge_heads(ga1["k"]), merge_heads(ga1["v"])], axis=-1)
    else:
        dkv1 = merge_heads(ga1["k"] + ga1["v"])
    grads["x"] = dx + linear_prefixed_vjp(grads, p, "kv_1", dkv1, x)
    return grads


def physgto_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`physgto_attention_forward`."""
    return physgto_attention_forward(x, params, **config)[0]


def init_physgto_attention_params(rng, c: int, num_heads: int, n_token: int, *, variant: str = "task1",
                                  dtype=np.float64) -> dict:
    """Parameters as upstream initialises them: task 1 ``Q ~ N(0, 1)/sqrt(d)``, task 2 Xavier-uniform
    ``Q``, task 3 ``Q ~ N(0, 1)``; PyTorch default linears; ``nn.MultiheadAttention``'s Xavier in-projection
    with zero biases (task 3)."""
    check_choice(variant, "variant", PHYSGTO_VARIANTS)
    d = c // num_heads
    p = {}
    if variant == "task3":
        p["Q"] = rng.standard_normal((n_token, c))
        for i in (1, 2, 3):
            p[f"attention{i}.in_proj_weight"] = xavier_uniform(rng, c, 3 * c, 1.0)
            p[f"attention{i}.in_proj_bias"] = np.zeros(3 * c)
            p.update(init_linear_prefixed(rng, c, c, f"attention{i}.out_proj"))
            p[f"attention{i}.out_proj.bias"] = np.zeros(c)
    elif variant == "task1":
        p["Q"] = rng.standard_normal((num_heads, n_token, d)) / np.sqrt(d)
        p.update(init_linear_prefixed(rng, c, 2 * c, "kv_1"))
        p.update(init_linear_prefixed(rng, d, 2 * d, "kv_2"))
        p.update(init_linear_prefixed(rng, c, c, "q_3"))
        p.update(init_linear_prefixed(rng, c, c, "out_proj"))
    else:
        fan_in, fan_out = n_token * d, num_heads * d          # torch's fans of an (H, M, d) tensor
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        p["Q"] = rng.uniform(-bound, bound, (num_heads, n_token, d))
        p.update(init_linear_prefixed(rng, c, c, "kv_1"))
        p.update(init_linear_prefixed(rng, d, 2 * d, "qkv_2", bias=False))
        p.update(init_linear_prefixed(rng, c, c, "q_3"))
        p.update(init_linear_prefixed(rng, c, c, "proj"))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, variant="task1"):
    n, c, h, m = (int(rng.integers(3, 5)), 4, 2, 3) if size == "tiny" else (int(rng.integers(8, 14)), 6, 2, 4)
    p = init_physgto_attention_params(rng, c, h, m, variant=variant)
    for k in p:
        if k.endswith("bias"):
            p[k] = 0.3 * rng.standard_normal(p[k].shape)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p,
                  config={"num_heads": h, "variant": variant})


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(x, params, *, num_heads, variant="task1"):
    # Per (batch, head) loops with explicit softmax; task 3 by the packed nn.MultiheadAttention formula.
    b, n, c = x.shape
    h, d = num_heads, c // num_heads
    out = np.zeros_like(x)
    for bb in range(b):
        if variant == "task3":
            def mha(q, kv, i):
                w, bi = params[f"attention{i}.in_proj_weight"], params[f"attention{i}.in_proj_bias"]
                qq, kk, vv = q @ w[:, :c] + bi[:c], kv @ w[:, c:2 * c] + bi[c:2 * c], kv @ w[:, 2 * c:] + bi[2 * c:]
                o = np.concatenate([_softmax(qq[:, s] @ kk[:, s].T / np.sqrt(d)) @ vv[:, s]
                                    for s in (slice(j * d, (j + 1) * d) for j in range(h))], axis=1)
                return o @ params[f"attention{i}.out_proj.weight"] + params[f"attention{i}.out_proj.bias"]
            t = mha(params["Q"], x[bb], 1)
            t = mha(t, t, 2)
            out[bb] = mha(x[bb], t, 3)
            continue
        kv1 = x[bb] @ params["kv_1.weight"] + params["kv_1.bias"]
        q3 = x[bb] @ params["q_3.weight"] + params["q_3.bias"]
        heads = []
        for j in range(h):
            s = slice(j * d, (j + 1) * d)
            if variant == "task1":
                k1, v1 = kv1[:, s], kv1[:, c:][:, s]
                kv2 = _softmax(params["Q"][j] @ k1.T / np.sqrt(d)) @ v1 @ params["kv_2.weight"] + params["kv_2.bias"]
            else:
                k1 = kv1[:, s]
                kv2 = _softmax(params["Q"][j] @ k1.T / np.sqrt(d)) @ k1 @ params["qkv_2.weight"]
            heads.append(_softmax(q3[:, s] @ kv2[:, :d].T / np.sqrt(d)) @ kv2[:, d:])
        o = np.concatenate(heads, axis=1)
        last = "out_proj" if variant == "task1" else "proj"
        out[bb] = o @ params[f"{last}.weight"] + params[f"{last}.bias"]
    return out


def _check_variants(rng):
    # The task-2 and task-3 implementations against the explicit formula (their finite-difference
    # checks are in tests/test_operators_o3.py).
    errs = []
    for variant in ("task2", "task3"):
        s = _sample(rng, "small", variant=variant)
        err = float(np.abs(physgto_attention(**s.inputs, params=s.params, **s.config)
                           - _reference(**s.inputs, params=s.params, **s.config)).max())
        assert err < 1e-12, f"{variant}: forward differs from the explicit formula by {err:.2e}"
        errs.append(err)
    return max(errs)


def _check_point_permutation(rng):
    # Permuting the mesh points permutes the output rows (the learned tokens see a set).
    errs = []
    for variant in PHYSGTO_VARIANTS:
        s = _sample(rng, "small", variant=variant)
        x = s.inputs["x"]
        perm = rng.permutation(x.shape[1])
        out = physgto_attention(x[:, perm], s.params, **s.config)
        errs.append(float(np.abs(out - physgto_attention(x, s.params, **s.config)[:, perm]).max()))
    err = max(errs)
    assert err < 1e-12, f"not equivariant to point permutations: {err:.2e}"
    return err


def _check_duplication_invariance(rng):
    # Every mesh point duplicated (a uniform refinement of the sampling measure): the projection
    # softmax averages over the points, so the tokens and the output at each point are unchanged.
    errs = []
    for variant in PHYSGTO_VARIANTS:
        s = _sample(rng, "small", variant=variant)
        x = s.inputs["x"]
        out2 = physgto_attention(np.repeat(x, 2, axis=1), s.params, **s.config)
        errs.append(float(np.abs(out2[:, ::2] - physgto_attention(x, s.params, **s.config)).max()))
    err = max(errs)
    assert err < 1e-12, f"output changes when every point is duplicated: {err:.2e}"
    return err


register(
    Mechanism(
        slug="physgto_projection_attention", family="3-operator", tier="T3",
        official_code="pengwei07/PhysGTO code/task*/src/model/atten.py@198d88f",
        title="PhysGTO: projection-inspired attention (learned tokens project and re-project the mesh)",
        paper="Liu, Ren, Wang, Yuan, Hao, Chen, Xu, Ni, Cai, An Efficient Graph-Transformer Operator for Learning "
              "Physical Dynamics with Manifolds Embedding (PhysGTO), arXiv 2512.10227",
        forward=physgto_attention_forward, backward=physgto_attention_backward, sample=_sample,
        reference=_reference, docs="operators/operator-attention-t3.md#physgto-projection-attention",
        checks={"variants_task2_task3": _check_variants, "point_permutation": _check_point_permutation,
                "point_duplication_invariance": _check_duplication_invariance},
    ),
)
