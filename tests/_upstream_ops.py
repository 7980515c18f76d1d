"""PyTorch modules written from the upstream operator files, for the fidelity tests.

Each ``build_*`` helper returns ``(module, mapping)``: a float64 ``torch.nn.Module`` re-stated
from the cited upstream file (our own code, not a copy: the formulas carry over, the code does
not), and ``mapping``, a dict ``refattn_param_key -> (torch_parameter, to_refattn)`` where
``to_refattn`` turns the torch tensor (or its ``.grad``) into refattn's layout (e.g. the
``nn.Linear`` transpose). :func:`compare_module` runs the module and the refattn forward/backward
side by side and returns the largest relative errors of the output and of every gradient; it is
written so that ``refattn.interop.torch.check_module`` can take it over.

Where the upstream installs from PyPI (neuraloperator), the tests use the real module instead.
"""

from __future__ import annotations

import numpy as np


def linear_t(t):
    """``nn.Linear.weight`` (out, in) -> refattn ``(in, out)``."""
    return t.detach().numpy().T.copy()


def same(t):
    return t.detach().numpy().copy()


def rel_err(a, b, floor=1.0) -> float:
    """max|a - b| / max(max|b|, floor): relative for arrays of size >= ``floor``, absolute below
    (the tests draw O(1) data; a gradient that is zero up to round-off — e.g. of a bias that a
    following norm removes — is then compared absolutely, and a wrong small gradient still
    shows as an error far above the tolerance)."""
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), floor))


def compare_module(torch, module, mapping, forward, backward, inputs, *, config=None, call=None,
                   input_grads=None, seed=0):
    """Run ``module`` and refattn's ``forward``/``backward`` on the same float64 ``inputs``.

    ``inputs`` maps refattn input names to arrays; ``call(module, tensors)`` runs the module
    (default ``module(**tensors)``); ``input_grads`` names the inputs whose gradients are compared
    (default: all). Returns ``{"out": err, "<name>": err, ...}`` (relative max errors)."""
    config = config or {}
    tens = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    out_t = call(module, tens) if call is not None else module(**tens)
    params = {k: f(p) for k, (p, f) in mapping.items()}
    out, cache = forward(**inputs, params=params, **config)
    g = np.random.default_rng(seed).standard_normal(out.shape)
    out_t.backward(torch.tensor(g))
    grads = backward(g, cache)
    errs = {"out": rel_err(out, out_t.detach().numpy())}
    for k in input_grads if input_grads is not None else inputs:
        errs[k] = rel_err(grads[k], tens[k].grad.numpy())
    for k, (p, f) in mapping.items():
        ref = f(p.grad) if p.grad is not None else np.zeros_like(params[k])
        errs[k] = rel_err(grads[k], ref)
    return errs


# ------------------------------------------------------------------------------------------ ONO


def build_ono_orth(torch, mu, residual=True):
    """xzppp/ONO ``ONOmodel2.py`` @ 8e4eee8 ``ONOBlock.forward`` (``orth=True``, training): the
    orthogonal-attention line with ``psi = proj(x)`` and ``fx`` as inputs; ``residual=False`` is
    commit 86e1bfe (``#+ fx``)."""
    nn = torch.nn

    class OrthCore(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = nn.Parameter(torch.tensor(mu, dtype=torch.float64))

        def forward(self, psi, fx):
            cov = torch.einsum("blc,bld->cd", psi, psi) / psi.shape[0] / psi.shape[1]
            lt = torch.linalg.cholesky(cov)
            w = psi @ lt.inverse().transpose(-2, -1)
            out = (w * torch.nn.functional.softplus(self.mu)) @ (w.transpose(-2, -1) @ fx)
            return out + fx if residual else out

    m = OrthCore()
    return m, {"mu": (m.mu, same)}


# ------------------------------------------------------------------------------------ OFormer


def build_oformer_linear_attention(torch, params, *, heads, dim_head, attn_type="galerkin"):
    """BaratiLab/OFormer ``airfoil/nn_module/attention_module.py`` @ f1111b3 ``LinearAttention``
    (no positional embedding, ``use_ln=False``): unpadded, ``InstanceNorm1d(dim_head)`` on a
    ``(b h) n d`` tensor (each point over its channels); padded, ``masked_instance_norm`` over the
    real points with the mean and variance detached (eps 1e-5). ``forward(x, padding_mask=None)``
    with a boolean ``(b, n)`` mask (True = real point). The reciprocal of the point count is taken
    in float64 here (upstream's ``1./grid_size`` is float32 unless the default dtype is float64)."""
    nn = torch.nn
    h, d = heads, dim_head
    normed = ("k", "v") if attn_type == "galerkin" else ("q", "k")

    def masked_in(t, m):
        mean = ((t * m).sum(1) / m.sum(1)).detach()
        var = ((((t - mean[:, None]) * m) ** 2).sum(1) / m.sum(1)).detach()
        return (t - mean[:, None]) / torch.sqrt(var[:, None] + 1e-5)

    class LinearAttention(nn.Module):  # upstream's parameter names: to_qkv, to_out.0
        def __init__(self):
            super().__init__()
            self.heads = h
            c, hd = params["to_qkv.weight"].shape[0], h * d
            self.to_qkv = nn.Linear(c, 3 * hd, bias=False)
            self.to_out = nn.Sequential(nn.Linear(hd, params["to_out.0.weight"].shape[1]))
            with torch.no_grad():
                self.to_qkv.weight.copy_(torch.tensor(params["to_qkv.weight"].T))
                self.to_out[0].weight.copy_(torch.tensor(params["to_out.0.weight"].T))
                self.to_out[0].bias.copy_(torch.tensor(params["to_out.0.bias"]))

        def forward(self, x, padding_mask=None):
            b, n, _ = x.shape
            ops = dict(zip("qkv", (t.reshape(b, n, h, d).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1))))
            if padding_mask is None:
                for t in normed:
                    ops[t] = torch.nn.functional.instance_norm(ops[t].reshape(b * h, n, d)).reshape(b, h, n, d)
                cnt = torch.full((b, 1, 1, 1), float(n), dtype=x.dtype)
            else:
                m = padding_mask[:, None, :, None].expand(b, h, n, 1).reshape(b * h, n, 1).to(x.dtype)
                for t in normed:
                    ops[t] = masked_in(ops[t].reshape(b * h, n, d), m).reshape(b, h, n, d)
                keep = padding_mask[:, None, :, None]
                ops = {t: v.masked_fill(~keep, 0.0) for t, v in ops.items()}
                cnt = padding_mask.sum(-1).to(x.dtype).view(-1, 1, 1, 1)
            out = ops["q"] @ (ops["k"].transpose(-1, -2) @ ops["v"]) / cnt
            return self.to_out(out.transpose(1, 2).reshape(b, n, h * d))

    mod = LinearAttention().to(torch.float64)
    return mod, {"to_qkv.weight": (mod.to_qkv.weight, linear_t), "to_out.0.weight": (mod.to_out[0].weight, linear_t),
                 "to_out.0.bias": (mod.to_out[0].bias, same)}


# ----------------------------------------------------------------------------- neuraloperator


def neuralop_linear_mapping(module, names):
    """``mapping`` for the ``nn.Linear`` children ``names`` of a real neuraloperator module
    (weights transposed; biases as they are); ``nn.Identity`` children are skipped."""
    out = {}
    for n in names:
        lin = getattr(module, n)
        if not hasattr(lin, "weight"):
            continue
        out[f"{n}.weight"] = (lin.weight, linear_t)
        if getattr(lin, "bias", None) is not None:
            out[f"{n}.bias"] = (lin.bias, same)
    return out


# ------------------------------------------------------------------------ Galerkin transformer


def build_simple_attention(torch, params, *, n_head, attention_type="galerkin", norm_type="layer", eps=1e-5):
    """scaomath/galerkin-transformer ``libs/layers.py`` @ f9e7d6a ``SimpleAttention`` (eval, no
    dropout — upstream applies ``F.dropout(p=0.5)`` whenever a dropout module is passed):
    ``forward(query, key, pos=None)`` with ``value = key``. Galerkin divides by the *query*
    length (``linear_attention``: ``seq_len = query.size(-2)``), Fourier by the key length.
    ``norm_type="instance"`` transposes each head to ``(b, d, n)`` before ``InstanceNorm1d(d,
    affine=True)``."""
    nn = torch.nn
    normed = ("k", "v") if attention_type == "galerkin" else ("q", "k")
    key_of = {"q": "norm_Q", "k": "norm_K", "v": "norm_V"}

    class SimpleAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.tensor(v.copy()))
                                       for k, v in params.items()})

        def w(self, k):
            return self.p[k.replace(".", "__")]

        def forward(self, query, key, pos=None):
            b = query.shape[0]
            srcs = {"q": query, "k": key, "v": key}
            ops = {}
            for i, t in enumerate("qkv"):
                y = srcs[t] @ self.w(f"linears.{i}.weight") + self.w(f"linears.{i}.bias")
                ops[t] = y.view(b, -1, n_head, y.shape[-1] // n_head).transpose(1, 2)
            for t in normed:
                kk, x = key_of[t], ops[t]
                d = x.shape[-1]
                if norm_type == "layer":
                    ops[t] = torch.stack([torch.nn.functional.layer_norm(
                        x[:, h], (d,), self.w(f"{kk}.weight")[h], self.w(f"{kk}.bias")[h], eps)
                        for h in range(n_head)], 1)
                else:
                    ops[t] = torch.stack([torch.nn.functional.instance_norm(
                        x[:, h].transpose(-2, -1), weight=self.w(f"{kk}.weight")[h], bias=self.w(f"{kk}.bias")[h],
                        eps=eps).transpose(-2, -1) for h in range(n_head)], 1)
            if pos is not None:
                pr = pos.unsqueeze(1).repeat(1, n_head, 1, 1)
                ops = {t: torch.cat([pr, v], -1) for t, v in ops.items()}
            q, k, v = ops["q"], ops["k"], ops["v"]
            if attention_type == "galerkin":
                z = q @ ((k.transpose(-2, -1) @ v) / q.shape[-2])
            else:
                z = ((q @ k.transpose(-2, -1)) / np.sqrt(q.shape[-1]) / k.shape[-2]) @ v
            z = z.transpose(1, 2).reshape(b, q.shape[-2], -1)
            return z @ self.w("fc.weight") + self.w("fc.bias") if pos is not None else z

    mod = SimpleAttention()
    return mod, {k: (mod.w(k), same) for k in params}


# ------------------------------------------------------------------------------ IFactFormer-m


def build_fablock3d_m_core(torch, scaling=1.0):
    """huiyu-2002/IFactFormer-m ``libs/factorization_module.py`` @ 3f110da ``FABlock3D_m.forward``
    between the kernels and ``to_out``: $K_a = s\\,q_ak_a^\\top$ (``LowRankKernel`` without
    RoPE/softmax/residual), three axis contractions of the same ``u_phi`` and
    ``torch.cat(..., dim=5)``. ``forward(v, q_x, k_x, q_y, k_y, q_z, k_z)`` with ``v (b h i l r c)``."""
    class Core(torch.nn.Module):
        def forward(self, v, q_x, k_x, q_y, k_y, q_z, k_z):
            kx, ky, kz = (scaling * torch.einsum("bhid,bhjd->bhij", q, k) for q, k in ((q_x, k_x), (q_y, k_y), (q_z, k_z)))
            ux = torch.einsum("bhij,bhjmsc->bhimsc", kx, v)
            uy = torch.einsum("bhlm,bhimsc->bhilsc", ky, v)
            uz = torch.einsum("bhrs,bhilsc->bhilrc", kz, v)
            return torch.cat([ux, uy, uz], dim=5)

    return Core(), {}


# ------------------------------------------------------------------ neuraloperator SpectralConv


def build_neuralop_spectral_conv(torch, params, *, fft_norm="forward", inverse_shift="ifftshift"):
    """neuraloperator ``neuralop/layers/spectral_convolution.py`` @ 93d3f06 ``SpectralConv.forward``,
    dense weight, real data, ``enforce_hermitian_symmetry=True``, channel-first
    ``(B, C, n_1, ..., n_d)``: rfftn, fftshift over all but the last axis, the weight on the block
    centred at ``n//2`` (``[:k]`` on the last axis), inverse shift, ``ifftn`` over all but the last
    axis, imaginary parts of the DC (and even-n Nyquist) column zeroed, ``irfft``, ``+ bias``.
    ``inverse_shift="fftshift"`` is the PyPI 2.0.0 release. ``out_fft`` is complex128 here
    (upstream allocates complex64 even for float64 inputs)."""
    w0 = torch.tensor(params["weight_real"]) + 1j * torch.tensor(params["weight_imag"])

    class SpectralConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Module()  # upstream's dense FactorizedTensor: state_dict key weight.tensor
            self.weight.tensor = torch.nn.Parameter(w0.clone())
            self.bias = torch.nn.Parameter(torch.tensor(params["bias"])) if "bias" in params else None

        def forward(self, x):
            weight = self.weight.tensor
            d = x.ndim - 2
            dims = list(range(-d, 0))
            sizes = list(x.shape[2:])
            xf = torch.fft.rfftn(x, norm=fft_norm, dim=dims)
            if d > 1:
                xf = torch.fft.fftshift(xf, dim=dims[:-1])
            out = torch.zeros(x.shape[0], weight.shape[1], *xf.shape[2:], dtype=torch.complex128)
            sl = [slice(None), slice(None)]
            for n, k in zip(xf.shape[2:-1], weight.shape[2:-1]):
                sl.append(slice(n // 2 - k // 2, n // 2 + k // 2 + k % 2))
            sl.append(slice(None, weight.shape[-1]))
            out[tuple(sl)] = torch.einsum("bi...,io...->bo...", xf[tuple(sl)], weight)
            if d > 1:
                out = getattr(torch.fft, inverse_shift)(out, dim=dims[:-1])
                out = torch.fft.ifftn(out, s=sizes[:-1], dim=dims[:-1], norm=fft_norm)
            out[..., 0].imag.zero_()
            if sizes[-1] % 2 == 0:
                out[..., -1].imag.zero_()
            y = torch.fft.irfft(out, n=sizes[-1], dim=-1, norm=fft_norm)
            return y + self.bias if self.bias is not None else y

    mod = SpectralConv()
    mapping = {"weight_real": (mod.weight.tensor, lambda t: t.detach().real.numpy().copy()),
               "weight_imag": (mod.weight.tensor, lambda t: t.detach().imag.numpy().copy())}
    if "bias" in params:
        mapping["bias"] = (mod.bias, same)
    return mod, mapping


# ------------------------------------------------------------------------------ Transolver


def build_transolver_physics_attention(torch, params, *, heads, mesh_shape=None, tau_clamp=None):
    """thuml/Transolver ``PDE-Solving-StandardBenchmark/model/Physics_Attention.py`` @ 75e0f67:
    ``Physics_Attention_Irregular_Mesh`` (``mesh_shape=None``) or
    ``Physics_Attention_Structured_Mesh_2D``/``_3D`` (``in_project_x``/``in_project_fx`` are
    ``Conv{2,3}d(dim, inner, k, 1, k // 2)`` on ``x.reshape(B, H, W[, D], C)``; temperature clamped
    to ``(0.1, 5)``). ``to_out`` is a Linear of any width. Dropout 0."""
    nn = torch.nn
    t = {k: torch.tensor(v) for k, v in params.items()}
    inner, dim = (t["in_project_x.weight"].shape[:2] if mesh_shape else t["in_project_x.weight"].shape[::-1])
    dim_head = inner // heads

    class PhysicsAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.temperature = nn.Parameter(t["temperature"].reshape(1, heads, 1, 1).clone())
            for name in ("in_project_x", "in_project_fx"):
                if mesh_shape:
                    conv = (nn.Conv2d if len(mesh_shape) == 2 else nn.Conv3d)(dim, inner, t[f"{name}.weight"].shape[-1],
                                                                             1, t[f"{name}.weight"].shape[-1] // 2)
                    conv.weight.data, conv.bias.data = t[f"{name}.weight"].clone(), t[f"{name}.bias"].clone()
                    setattr(self, name, conv.double())
                else:
                    setattr(self, name, self._lin(t, name))
            self.in_project_slice = self._lin(t, "in_project_slice")
            for n in ("to_q", "to_k", "to_v"):
                setattr(self, n, self._lin(t, n))
            self.to_out = nn.Sequential(self._lin(t, "to_out.0"))

        @staticmethod
        def _lin(t, name):
            w = t[f"{name}.weight"]
            lin = nn.Linear(w.shape[0], w.shape[1], bias=f"{name}.bias" in t).double()
            lin.weight.data = w.T.clone()
            if f"{name}.bias" in t:
                lin.bias.data = t[f"{name}.bias"].clone()
            return lin

        def _proj(self, layer, x):
            b, n, c = x.shape
            if not mesh_shape:
                y = layer(x)
            else:
                xc = x.reshape(b, *mesh_shape, c).movedim(-1, 1)
                y = layer(xc).movedim(1, -1).reshape(b, n, inner)
            return y.reshape(b, n, heads, dim_head).permute(0, 2, 1, 3)

        def forward(self, x):
            fx_mid, x_mid = self._proj(self.in_project_fx, x), self._proj(self.in_project_x, x)
            temp = self.temperature if tau_clamp is None else torch.clamp(self.temperature, *tau_clamp)
            sw = torch.softmax(self.in_project_slice(x_mid) / temp, dim=-1)
            tok = torch.einsum("bhnc,bhng->bhgc", fx_mid, sw) / (sw.sum(2) + 1e-5)[..., None]
            q, k, v = self.to_q(tok), self.to_k(tok), self.to_v(tok)
            z = torch.softmax(q @ k.transpose(-1, -2) * dim_head ** -0.5, dim=-1) @ v
            y = torch.einsum("bhgc,bhng->bhnc", z, sw)
            return self.to_out(y.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], inner))

    mod = PhysicsAttention()
    mapping = {"temperature": (mod.temperature, lambda g: g.detach().numpy().reshape(-1).copy())}
    for name, m in mod.named_modules():
        if isinstance(m, nn.Linear) or hasattr(m, "kernel_size"):
            key = name.replace("to_out.0", "to_out.0")
            mapping[f"{key}.weight"] = (m.weight, linear_t if isinstance(m, nn.Linear) else same)
            if m.bias is not None:
                mapping[f"{key}.bias"] = (m.bias, same)
    return mod, mapping


# ------------------------------------------------------------------ FactFormer @ c9801d1


def low_rank_kernel_torch(torch, u_x, p, *, heads, u_y=None, pos_x=None, pos_y=None, rotary=True,
                          normalize=False, softmax=False, residual=True, scaling=1.0, min_freq=1 / 64):
    """BaratiLab/FactFormer ``libs/attention.py`` @ c9801d1 ``LowRankKernel.forward`` (``pos_dim=1``,
    ``positional_embedding`` ``'rotary'`` or ``'none'``), with ``p`` torch tensors ``(in, out)``.
    ``RotaryEmbedding`` frequencies in float64 (upstream computes them in float32)."""
    src_y = u_x if u_y is None else u_y
    n = src_y.shape[1]

    def heads_(t):
        b, m, hd = t.shape
        return t.reshape(b, m, heads, hd // heads).permute(0, 2, 1, 3)

    q, k = heads_(u_x @ p["to_q.weight"]), heads_(src_y @ p["to_k.weight"])
    if normalize:
        q = (q - q.mean(dim=-2, keepdim=True)) / (q.std(dim=-2, keepdim=True) + 1e-5)
        k = (k - k.mean(dim=-2, keepdim=True)) / (k.std(dim=-2, keepdim=True) + 1e-5)
    if rotary:
        d = q.shape[-1]
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))

        def rope(t, pos):
            f = torch.einsum("i,j->ij", pos[..., 0] / min_freq, inv)
            f = torch.cat((f, f), -1)
            t1, t2 = t[..., : d // 2], t[..., d // 2:]
            return t * f.cos() + torch.cat((-t2, t1), -1) * f.sin()

        q, k = rope(q, pos_x), rope(k, pos_x if pos_y is None else pos_y)
    kern = torch.einsum("bhid,bhjd->bhij", q, k) * scaling
    if softmax:
        kern = torch.softmax(kern, dim=-1)
    if residual:
        kern = kern + p["gamma"] * torch.eye(n, dtype=torch.float64) / n
    return kern


def fablock2d_c9801d1_torch(torch, u, p, pos_x, pos_y, *, heads, dim_head, scaling):
    """``libs/factorization_module.py`` @ c9801d1 ``FABlock2D.forward`` (``use_rope=True``,
    ``kernel_multiplier <= 4``: both axis kernels scaled by ``scaling_factor``), ``to_out`` =
    ``libs/basics.py`` ``GroupNorm(heads, domain_wise=True, affine=False)`` (unbiased var, eps 1e-8,
    output ``(B, nx*ny, C)``) → Linear → GELU → Linear."""
    F = torch.nn.functional

    def ln(x, pre):
        return F.layer_norm(x, (x.shape[-1],), p[pre + "weight"], p[pre + "bias"], 1e-5)

    def pool(x, pre):
        x = (x @ p[pre + "to_in.weight"]).mean(dim=tuple(range(2, x.ndim - 1)))
        x = ln(x, pre + "out_ffn.norm.")
        x = x @ p[pre + "out_ffn.fn.net.0.weight"] + p[pre + "out_ffn.fn.net.0.bias"]
        c = x.shape[-1]
        x = F.gelu(x[..., : c // 2]) * x[..., c // 2:]
        return x @ p[pre + "out_ffn.fn.net.3.weight"] + p[pre + "out_ffn.fn.net.3.bias"]

    def kern(ua, pos, ax):
        sub = {"to_q.weight": p[f"low_rank_kernel_{ax}.to_q.weight"], "to_k.weight": p[f"low_rank_kernel_{ax}.to_k.weight"]}
        return low_rank_kernel_torch(torch, ua, sub, heads=heads, pos_x=pos, residual=False, scaling=scaling)

    u = ln(u, "in_norm.")
    v, u = u @ p["to_v.weight"], u @ p["to_in.weight"]
    kx, ky = kern(pool(u, "to_x.0."), pos_x, "x"), kern(pool(u.permute(0, 2, 1, 3), "to_y.1."), pos_y, "y")
    b, nx, ny, _ = v.shape
    phi = v.reshape(b, nx, ny, heads, dim_head).permute(0, 3, 1, 2, 4)
    phi = torch.einsum("bhlm,bhimc->bhilc", ky, torch.einsum("bhij,bhjmc->bhimc", kx, phi))
    x = phi.permute(0, 1, 2, 3, 4).reshape(b, heads, -1)               # b g (i l c)
    x = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-8).sqrt()
    x = x.reshape(b, heads, nx * ny, dim_head).permute(0, 2, 1, 3).reshape(b, nx * ny, heads * dim_head)
    return F.gelu(x @ p["to_out.1.weight"]) @ p["to_out.3.weight"]


# ------------------------------------------------------------------------------ IPOT model


def ipot_model_torch(torch, x, q, tp, *, in_channel, num_bands, max_resolution, num_layers, heads):
    """7tl7qns7ch/IPOT @ 18c1778 ``models/epd.py`` ``EncoderProcessorDecoder`` with
    ``IPOTBasicPreprocessor``/``IPOTDecoder`` (``pos2fourier``: ``generate_fourier_features`` in
    ``models/ipot/position_encoding.py``, bands ``linspace(1, res/2, K)`` in float64 here), the
    encoder cross-attention, ``num_layers`` shared processor layers and the decoder, on ``tp``
    keyed by the full state-dict names (linear weights ``(in, out)``)."""
    F = torch.nn.functional

    def fourier(pos):
        fb = torch.stack([torch.linspace(1.0, r / 2, k, dtype=torch.float64) for r, k in zip(max_resolution, num_bands)])
        f = (pos[..., :, None] * fb).reshape(*pos.shape[:-1], -1)
        return torch.cat([pos, torch.sin(torch.pi * f), torch.cos(torch.pi * f)], -1)

    def ln(t, key):
        return F.layer_norm(t, t.shape[-1:], tp[f"{key}.weight"], tp[f"{key}.bias"], 1e-5)

    def attn(prefix, a, c):
        inner = tp[f"{prefix}.to_q.weight"].shape[1]
        qq = a @ tp[f"{prefix}.to_q.weight"]
        k, v = (c @ tp[f"{prefix}.to_kv.weight"]).split(inner, -1)
        b = a.shape[0]
        qq, k, v = (t.reshape(b, t.shape[1], heads, inner // heads).transpose(1, 2) for t in (qq, k, v))
        o = F.scaled_dot_product_attention(qq, k, v).transpose(1, 2).reshape(b, a.shape[1], inner)
        return o @ tp[f"{prefix}.to_out.weight"] + tp[f"{prefix}.to_out.bias"]

    def ff(prefix, t):
        u, g = (t @ tp[f"{prefix}.net.0.weight"] + tp[f"{prefix}.net.0.bias"]).chunk(2, -1)
        return (u * F.gelu(g)) @ tp[f"{prefix}.net.3.weight"] + tp[f"{prefix}.net.3.bias"]

    b = x.shape[0]
    flat = x.reshape(b, -1, x.shape[-1])
    inp = torch.cat([flat[..., :in_channel], fourier(flat[..., in_channel:])], -1)
    z = tp["encoder.latents"].expand(b, -1, -1)
    z = attn("encoder.encoder_cross_attn.fn", ln(z, "encoder.encoder_cross_attn.norm"),
             ln(inp, "encoder.encoder_cross_attn.norm_context")) + z
    for _ in range(num_layers):
        z = attn("processor.processor_self_attn.fn", ln(z, "processor.processor_self_attn.norm"), z) + z
        z = ff("processor.processor_ff.fn", ln(z, "processor.processor_ff.norm")) + z
    qe = fourier(q.reshape(-1, q.shape[-1])).expand(b, -1, -1)
    o = attn("decoder.decoder_cross_attn.fn", ln(qe, "decoder.decoder_cross_attn.norm"),
             ln(z, "decoder.decoder_cross_attn.norm_context"))
    return (ff("decoder.decoder_ff.fn", ln(o, "decoder.decoder_ff.norm")) + o) * 0.1
