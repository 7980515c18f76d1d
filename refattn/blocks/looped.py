r"""Looped (weight-tied) transformer with input injection; AlgoFormer's pre/loop/post structure.

Yang, Lee, Nowak, Papailiopoulos, "Looped Transformers are Better at Learning Learning
Algorithms", ICLR 2024, arXiv 2311.12424. Upstream: Leiay/looped_transformer
``scripts/models.py`` (``TransformerModelLooped``) and ``scripts/nano_gpt.py`` (``GPT2Model``,
``Block``) @ 6b3bdb2295625092cbe7f868ca1742ab28d4cd5b. AlgoFormer: Gao, Zheng, Xie, Shi, Hu, Li,
Ng, Li, Liu, "AlgoFormer: An Efficient Transformer Framework with Algorithmic Structures", TMLR
2025, arXiv 2402.13572 (no public code).

Forward
-------
The loop body is upstream's backbone ``GPT2Model`` called on ``inputs_embeds``:
$\mathrm{TF}(z) = N_f\big(B_{L}\circ\dots\circ B_1(z + E_{pos})\big)$ with the learned positions
$E_{pos}$ = ``wpe.weight[:N]``, $L$ = ``num_layers`` pre-norm GPT-2 blocks
$B(u) = u' + \mathrm{MLP}(N_2u')$, $u' = u + A(N_1u)$ (GELU-tanh MLP, any attention sublayer;
upstream's is causal multi-head attention) and the final LayerNorm $N_f$ = ``ln_f``. With the
injected input $P$ (the embedded prompt) and $T$ = ``n_loops``:

$$Y_0 = 0,\quad Y_{t+1} = \mathrm{TF}(Y_t + P)\quad(\texttt{injection="add"}, \text{upstream's } z=f(x+z)),$$

$Y_0 = \mathbf 1$, $Y_{t+1} = \mathrm{TF}(Y_t\odot P)$ (``"mul"``, upstream's $z = f(x\cdot z)$), or
$Y_0 = P$, $Y_{t+1} = \mathrm{TF}(Y_t)$ (``"none"``: no injection, upstream's weight-tied baseline
``TransformerModelTying``). The output is $Y_T$, or with ``window`` $=W$ the stack
$(Y_{T-W+1},\dots,Y_T)$ on a new axis 1 (the iterates upstream reads out and averages the loss
over, ``n_loop_window``).

AlgoFormer (reconstruction): $y = \mathrm{TF}_{post}(\mathrm{TF}_{loop}^{T}(\mathrm{TF}_{pre}(x)))$.
With ``pre_layers``/``post_layers`` $>0$ the injected input is $P = \mathrm{TF}_{pre}(x)$ and each
returned iterate passes through $\mathrm{TF}_{post}$; $\mathrm{TF}_{pre}$, $\mathrm{TF}_{post}$ are
stacks of the same pre-norm blocks (``pre.h.{l}.*``, ``post.h.{l}.*``) without positions or final
norm. The paper defines the three-phase structure but publishes no code; how the looped phase
consumes the pre-transformer's output is our reading (marked reconstruction): it is injected
like $P$ (use ``injection="none"`` for a plain $Y_0 = P$ start).

Backward
--------
Backpropagation through the loop. With $g_t = \partial L/\partial Y_t$ (from the output window
and from iteration $t$'s input) and $z_t$ the loop input:
$dz_t = J_{\mathrm{TF}}(z_t)^\top g_{t+1}$, then for ``"add"`` $g_t \mathrel{+}= dz_t$, $dP \mathrel{+}= dz_t$;
for ``"mul"`` $g_t \mathrel{+}= dz_t\odot P$, $dP \mathrel{+}= dz_t\odot Y_t$; for ``"none"``
$g_t \mathrel{+}= dz_t$ and $dP = g_0$. Tied weights: every parameter's gradient is the sum over
the $T$ iterations of its per-iteration gradient (they accumulate into one dict); $dE_{pos}$ is
$\sum_t\sum_b dz'_t$ on the first $N$ rows. The attention's backward is the sublayer's own.

Conventions and not reproduced
------------------------------
``injection`` ("add"), ``activation`` ("gelu_tanh", nanoGPT's ``new_gelu``), ``eps`` (1e-5), GPT-2
parameter names. Upstream runs the iterations before the window under ``torch.no_grad``
(truncated backpropagation, ``horizon_start = n_loops - n_loop_window``); the backward here is the
full gradient of the forward. The read-in/read-out linear maps and the curriculum over
``n_loops`` are task and training details outside the block.

Agreement with upstream
-----------------------
``TransformerModelLooped`` run end to end in float64 (read-in, 4 loops, read-out of every
iterate; fused ``c_attn`` split into the MHA projections): predictions and the gradients of every
backbone parameter and of ``read_in`` agree to $4.4\times10^{-16}$ (``z=f(x+z)``),
$1.5\times10^{-15}$ (``z=f(x*z)``) and $1.1\times10^{-15}$ (two-block body).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    BlockNames,
    add_grad,
    add_prefix,
    block_dtype,
    init_attention_params,
    norm_backward,
    norm_forward,
    norm_spec,
    param_dim,
    resolve_sublayer,
    split_block_params,
    transformer_block_backward,
    transformer_block_forward,
    transformer_block_spec,
)

__all__ = ["looped_transformer_forward", "looped_transformer_backward", "looped_transformer", "LOOP_INJECTIONS"]

LOOP_INJECTIONS = ("add", "mul", "none")


def _names(stack, layer):
    base = f"{stack}h.{layer}"
    return BlockNames(norm1=f"{base}.ln_1", norm2=f"{base}.ln_2", fc1=f"{base}.mlp.c_fc", fc2=f"{base}.mlp.c_proj")


def looped_transformer_forward(x, params, *, n_loops: int, num_layers: int = 1, attention=None,
                               attention_config=None, injection: str = "add", window=None, pre_layers: int = 0,
                               post_layers: int = 0, activation: str = "gelu_tanh", eps: float = 1e-5):
    r"""Looped transformer $Y_{t+1} = \mathrm{TF}(Y_t + P)$, $t < T$ (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
        The embedded input $P$ (or AlgoFormer's input to $\mathrm{TF}_{pre}$).
    params : dict
        Loop body (GPT-2 names, weights ``(in, out)`` = PyTorch ``weight.T``): for each layer
        ``l < num_layers`` ``"h.{l}.ln_1.weight"``/``.bias``, ``"h.{l}.ln_2.*"`` ``(C,)``,
        ``"h.{l}.mlp.c_fc.weight" (C, F)``, ``"h.{l}.mlp.c_proj.weight" (F, C)`` (optional biases)
        and the attention's keys under ``"h.{l}.attn."``; optional ``"wpe.weight" (P_max >= N, C)``
        and ``"ln_f.weight"``/``.bias``. AlgoFormer stacks: the same keys under ``"pre."`` and
        ``"post."``.
    n_loops : int
        $T \ge 1$.
    num_layers : int
        Blocks in the loop body (upstream ``n_layer``, 1 in the looped configs).
    attention, attention_config
        The attention sublayer of every block (default ``"multi_head_attention"``; upstream's is
        causal: pass ``{"num_heads": H, "is_causal": True}``).
    injection : {"add", "mul", "none"}
    window : int, optional
        Return the last ``window`` iterates as ``(..., window, N, C)`` (new axis ``-3``).
    pre_layers, post_layers : int
        AlgoFormer's pre- and post-transformer depths (0: the plain looped transformer).
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
    """
    x = as_float(x, "x", min_ndim=2)
    t_max = check_int(n_loops, "n_loops", minimum=1)
    nl = check_int(num_layers, "num_layers", minimum=1)
    npre = check_int(pre_layers, "pre_layers", minimum=0)
    npost = check_int(post_layers, "post_layers", minimum=0)
    check_choice(injection, "injection", LOOP_INJECTIONS)
    check_choice(activation, "activation", ACTIVATIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    w = None if window is None else check_int(window, "window", minimum=1)
    if w is not None and w > t_max:
        raise ValueError(f"window must be <= n_loops={t_max}; got {w}")
    spec_attn = "multi_head_attention" if attention is None else attention
    stacks = {"": nl, "pre.": npre, "post.": npost}
    subl = {(s, l): resolve_sublayer(spec_attn, prefix=f"{s}h.{l}.attn", config=attention_config)
            for s, n in stacks.items() for l in range(n)}
    c, n = x.shape[-1], x.shape[-2]
    hidden = param_dim(params, "h.0.mlp.c_fc.weight", 1, where="looped_transformer", shape=("C", "F"))
    spec = {}
    for s, l in subl:
        spec.update(transformer_block_spec(_names(s, l), c, hidden))
    spec.update(norm_spec("ln_f", c))
    n_pos = np.shape(params.get("wpe.weight"))[0] if isinstance(params, dict) and np.ndim(params.get("wpe.weight")) == 2 else n
    spec["wpe.weight"] = (n_pos, c)
    if n_pos < n:
        raise ValueError(f"wpe.weight must have at least N={n} rows (positions); got {n_pos}")
    optional = [k for k in spec if k.endswith(".bias") or k.startswith(("ln_f.", "wpe."))]
    keys = list(subl)
    own, subs = split_block_params(params, spec, [subl[k] for k in keys], optional=optional,
                                   where="looped_transformer")
    dt = block_dtype(x, own, subs)
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    ap = {k: cast_all(dt, p) for k, p in zip(keys, subs)}
    cfg = {"own": own, "subl": subl, "ap": ap, "eps": eps, "act": activation}
    p_in, c_pre = _stack_forward(x, "pre.", npre, cfg)
    y = np.zeros_like(p_in) if injection == "add" else (np.ones_like(p_in) if injection == "mul" else p_in)
    iters, outs, c_post = [], [], []
    first_out = t_max - (1 if w is None else w)
    for t in range(t_max):
        z = y + p_in if injection == "add" else (y * p_in if injection == "mul" else y)
        u = z + own["wpe.weight"][:n] if "wpe.weight" in own else z
        h, c_body = _stack_forward(u, "", nl, cfg)
        y_new, c_f = norm_forward(own, "ln_f", h, kind="layer" if "ln_f.weight" in own else "none", eps=eps)
        iters.append((y, c_body, c_f))
        y = y_new
        if t >= first_out:
            o, co = _stack_forward(y, "post.", npost, cfg)
            outs.append(o)
            c_post.append(co)
    out = outs[-1] if w is None else np.stack(outs, axis=-3)
    cache = {"cfg": cfg, "iters": iters, "c_pre": c_pre, "c_post": c_post, "p_in": p_in, "injection": injection,
             "window": w, "n": n, "shape": out.shape, "x_shape": x.shape, "dtype": dt}
    return out, cache


def _stack_forward(u, stack, layers, cfg):
    caches = []
    for l in range(layers):
        u, c = transformer_block_forward(u, cfg["own"], cfg["subl"][(stack, l)], cfg["ap"][(stack, l)],
                                         names=_names(stack, l), eps=cfg["eps"], activation=cfg["act"])
        caches.append(c)
    return u, caches


def _stack_backward(grads, du, caches, cfg):
    for c in reversed(caches):
        du = transformer_block_backward(grads, cfg["own"], du, c)
    return du


def looped_transformer_backward(dout, cache):
    r"""Gradients of `looped_transformer_forward` for ``x`` and every params key; tied weights
    accumulate over the iterations (module docstring)."""
    cfg, own, inj, w = cache["cfg"], cache["cfg"]["own"], cache["injection"], cache["window"]
    g_out = as_dout(dout, cache["shape"], cache["dtype"])
    grads = {}
    t_max = len(cache["iters"])
    n_out = 1 if w is None else w
    p_in = cache["p_in"]
    dp = np.zeros_like(p_in)
    g = np.zeros_like(p_in)
    for t in range(t_max - 1, -1, -1):
        j = t - (t_max - n_out)
        if j >= 0:
            go = g_out if w is None else g_out[..., j, :, :]
            g = g + _stack_backward(grads, go, cache["c_post"][j], cfg)
        y_prev, c_body, c_f = cache["iters"][t]
        du = _stack_backward(grads, norm_backward(grads, own, g, c_f), c_body, cfg)
        if "wpe.weight" in own:
            dpos = np.zeros_like(own["wpe.weight"])
            dpos[: cache["n"]] = du.reshape((-1,) + du.shape[-2:]).sum(axis=0)
            add_grad(grads, "wpe.weight", dpos)
        if inj == "add":
            g, dp = du, dp + du
        elif inj == "mul":
            g, dp = du * p_in, dp + du * y_prev
        else:
            g = du
    if inj == "none":
        dp = dp + g
    grads["x"] = _stack_backward(grads, dp, cache["c_pre"], cfg)
    return grads


def looped_transformer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `looped_transformer_forward`."""
    return looped_transformer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _block_params(rng, prefix, c, f, attention, heads):
    p = {f"{prefix}.ln_1.weight": 1.0 + 0.2 * rng.standard_normal(c), f"{prefix}.ln_1.bias": 0.1 * rng.standard_normal(c),
         f"{prefix}.ln_2.weight": 1.0 + 0.2 * rng.standard_normal(c), f"{prefix}.ln_2.bias": 0.1 * rng.standard_normal(c),
         f"{prefix}.mlp.c_fc.weight": rng.standard_normal((c, f)) / np.sqrt(c),
         f"{prefix}.mlp.c_fc.bias": 0.2 * rng.standard_normal(f),
         f"{prefix}.mlp.c_proj.weight": rng.standard_normal((f, c)) / np.sqrt(f),
         f"{prefix}.mlp.c_proj.bias": 0.1 * rng.standard_normal(c)}
    ap, acfg = init_attention_params(rng, attention, c, heads)
    p.update(add_prefix(ap, f"{prefix}.attn"))
    return p, acfg


def _sample(rng, size, attention="multi_head_attention", pre=None, post=None):
    tiny = size == "tiny"
    n, c, f, h = (int(rng.integers(2, 4)), 4, 4, 1) if tiny else (int(rng.integers(4, 6)), 6, 8, 2)
    if attention == "diff_attention_v1":
        h = 1
    n_loops = 2 if tiny else int(rng.integers(2, 4))
    stage = 0 if tiny else int(rng.integers(0, 3))  # small: none, an AlgoFormer pre-, or a post-transformer
    pre = int(stage == 1) if pre is None else pre
    post = int(stage == 2) if post is None else post
    p = {}
    for stack, layers in (("", 1), ("pre.", pre), ("post.", post)):
        for l in range(layers):
            bp, acfg = _block_params(rng, f"{stack}h.{l}", c, f, attention, h)
            p.update(bp)
    if rng.random() < 0.7 or not tiny:
        p.update({"ln_f.weight": 1.0 + 0.2 * rng.standard_normal(c), "ln_f.bias": 0.1 * rng.standard_normal(c),
                  "wpe.weight": 0.3 * rng.standard_normal((n + int(rng.integers(0, 2)), c))})
    if attention == "multi_head_attention":
        acfg = dict(acfg, is_causal=True)
    cfg = {"n_loops": n_loops, "attention": attention, "attention_config": acfg,
           "injection": str(rng.choice(LOOP_INJECTIONS)), "pre_layers": pre, "post_layers": post}
    if rng.random() < 0.5:
        cfg["window"] = int(rng.integers(1, n_loops + 1))
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _gpt2_block(u, p, prefix, attention, attention_config, act, eps):
    from .. import registry
    from ..nn.norms import layer_norm
    from .core import activation_functions

    f, _ = activation_functions(act)
    ln = lambda v, k: layer_norm(v, {"weight": p[f"{prefix}.{k}.weight"], "bias": p.get(f"{prefix}.{k}.bias")}, eps=eps)  # noqa: E731
    sub = {k[len(prefix) + 6:]: v for k, v in p.items() if k.startswith(f"{prefix}.attn.")}
    u = u + registry.get(attention).forward(ln(u, "ln_1"), params=sub, **attention_config)[0]
    m = f(ln(u, "ln_2") @ p[f"{prefix}.mlp.c_fc.weight"] + p.get(f"{prefix}.mlp.c_fc.bias", 0.0))
    return u + m @ p[f"{prefix}.mlp.c_proj.weight"] + p.get(f"{prefix}.mlp.c_proj.bias", 0.0)


def _reference(x, params, n_loops, num_layers=1, attention=None, attention_config=None, injection="add", window=None,
               pre_layers=0, post_layers=0, activation="gelu_tanh", eps=1e-5):
    # The loop unrolled T times with the same parameters, every block written out with nn.layer_norm
    # and the registry attention.
    from ..nn.norms import layer_norm

    attention = attention or "multi_head_attention"
    p, n = params, x.shape[-2]

    def stack(u, s, layers):
        for l in range(layers):
            u = _gpt2_block(u, p, f"{s}h.{l}", attention, attention_config or {}, activation, eps)
        return u

    pin = stack(x, "pre.", pre_layers)
    y = {"add": np.zeros_like(pin), "mul": np.ones_like(pin), "none": pin}[injection]
    ys = []
    for _ in range(n_loops):
        z = {"add": y + pin, "mul": y * pin, "none": y}[injection]
        if "wpe.weight" in p:
            z = z + p["wpe.weight"][:n]
        y = stack(z, "", num_layers)
        if "ln_f.weight" in p:
            y = layer_norm(y, {"weight": p["ln_f.weight"], "bias": p.get("ln_f.bias")}, eps=eps)
        ys.append(stack(y, "post.", post_layers))
    return ys[-1] if window is None else np.stack(ys[-window:], axis=-3)


def _check_tied_gradient_is_the_sum(rng):
    # Untie the loop: T separate one-iteration calls (injection="none", each with its own copy of the
    # weights) chained by hand. The tied gradient equals the sum of the copies' gradients.
    s = _sample(rng, "small", pre=0, post=0)
    t_max = s.config["n_loops"]
    cfg = dict(s.config, injection="none", window=None)
    x = s.inputs["x"]
    out, cache = looped_transformer_forward(x, s.params, **cfg)
    g = rng.standard_normal(out.shape)
    tied = looped_transformer_backward(g, cache)
    one = dict(cfg, n_loops=1)
    caches, y = [], x
    for _ in range(t_max):
        y, c = looped_transformer_forward(y, s.params, **one)
        caches.append(c)
    summed, gy = {}, g
    for c in reversed(caches):
        gr = looped_transformer_backward(gy, c)
        gy = gr.pop("x")
        for k, v in gr.items():
            summed[k] = summed.get(k, 0.0) + v
    err = max(float(np.abs(y - out).max()), float(np.abs(gy - tied["x"]).max()))
    err = max(err, max(float(np.abs(summed[k] - tied[k]).max()) for k in summed))
    assert err < 1e-12, f"tied gradients differ from the sum over the untied iterations by {err}"
    return err


register(
    Mechanism(
        slug="looped_transformer", family="5-building-blocks", tier="T2",
        official_code="Leiay/looped_transformer scripts/models.py@6b3bdb2 (TransformerModelLooped)",
        title="Looped (weight-tied) transformer with input injection; AlgoFormer pre/loop/post",
        paper="Yang, Lee, Nowak, Papailiopoulos, Looped Transformers are Better at Learning Learning Algorithms, "
              "ICLR 2024, arXiv 2311.12424; Gao et al., AlgoFormer: An Efficient Transformer Framework with "
              "Algorithmic Structures, TMLR 2025, arXiv 2402.13572",
        forward=looped_transformer_forward, backward=looped_transformer_backward, sample=_sample,
        reference=_reference, docs="blocks/residual-blocks.md#looped-transformer",
        checks={"tied_gradient_is_the_sum": _check_tied_gradient_is_the_sum},
    ),
)
