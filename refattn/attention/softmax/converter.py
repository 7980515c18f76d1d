r"""Converter: synthetic unitary digraph convolution ("Kernelution") in place of self-attention,
with the Converter encoder block around it.

Paper: Zhang, Mao, Chiu, Sun, "Converting Transformers into DGNNs Form", arXiv 2502.00585 (2025).
Upstream (official): hazdzz/converter ``model/encoder/converter.py@dccb8f2f3014c3bcec44da787df1a35b89e5d393``
(classes ``GenerateEigenvalue``, ``GenerateParameters``, ``gengerate_dhhp_parameters``,
``DHHPTransform``, ``InverseDHHPTransform``, ``KernelPolynomial``, ``Kernelution``,
``GatedFeedForward``, ``ConverterEncoder``), ``model/norm.py`` (``ScaleNorm``, ``FixNorm``) and
``utils/pscan.py`` (the parallel scan the DHHP stages run on). The earlier explicit-stencil DHHP of
commit ``e1179aa`` is not implemented (see "Conventions").

The digraph convolution
-----------------------
Self-attention is replaced by $Y = U^{-1}\,\mathrm{diag}(e^{i\,p(\lambda)})\,U\,V$ with a learned,
input-dependent "digraph Fourier basis" $U$ and spectrum $\lambda$ (per token), on a complex value
$V = xW_r + i\,xW_i$ (``value_linear_real`` / ``value_linear_imag``, no bias). For
$x\in\mathbb R^{B\times N\times D}$:

* **Eigenvalues** (``seq_eigenvalue``): $\lambda = \mathrm{mean}_D\,\sin\!\big(\mathrm{SN}(\sin(xV_0+c_0))V_4 + c_4\big)$,
  a SIREN with a ScaleNorm $\mathrm{SN}(h) = w\odot h/(\lVert h\rVert_2+\epsilon)$ (``siren.0``,
  ``siren.2``, ``siren.4``); then the kernel polynomial (``seq_kernel_poly``, Chebyshev with Gibbs
  damping $g_k$ of ``kernel_type``)
  $p(\lambda) = \sum_{k=0}^{K} c_{bk}\,g_k\,T_k(\lambda)$ ($g_0 = 1$, $T_0 = 1$, $T_1 = \lambda$,
  $T_{k} = 2\lambda T_{k-1} - T_{k-2}$). Upstream's ``cheb_coef`` has one row per *batch slot*
  (shape ``(batch_size, K+1)``); a ``(K+1,)`` vector shared by the batch is also accepted.
* **Givens parameters** (``givens_parameters``): $P = \mathrm{pool}_7\,\mathrm{FixNorm}(\sin(\mathrm{SN}(\sin(xW_0+b_0))W_4+b_4))$,
  adaptive average pooling of the $D$ features to 7, then upstream's
  ``view(b, 7n).chunk(7, dim=1)``: the $(N, 7)$ array is flattened token-major and cut into seven
  consecutive length-$N$ pieces $c_0..c_6$ (each piece mixes tokens and pooled features; kept
  exactly). $(\alpha,\beta,\gamma)_l = c_{0,1,2}[:N-1]$, $(\alpha,\beta,\gamma)_u = c_{3,4,5}[1:]$,
  $\theta = c_6$. Each triple gives 2×2 blocks with $A = \pi(\alpha+\beta)$, $B = \pi(\alpha-\beta)$,
  $C = \pi\gamma$:
  $$g_{ii} = e^{-iA}\cos C,\quad g_{ij} = -e^{iB}\sin C,\quad g_{ji} = e^{-iB}\sin C,\quad g_{jj} = e^{iA}\cos C,$$
  their conjugate transpose $(g_{jj}, -g_{ij}, -g_{ji}, g_{ii})$, and $\Delta = e^{2\pi i\theta}$.
* **1-DHHP stages** (upstream ``DHHPTransform`` on ``pscan``): with coefficient vectors of length
  $N-1$, an *upper* stage $Y = \mathcal U_{g}(X)$ and a *lower* stage $Z = \mathcal L_{g}(Y)$:
  $$H_{N-1} = 0,\ H_t = g_{ii,t}X_t + g_{ij,t}H_{t+1};\qquad Y_0 = H_0,\ Y_t = g_{ji,t-1}X_{t-1} + g_{jj,t-1}H_t,$$
  $$L_0 = 0,\ L_t = g_{ji,t-1}L_{t-1} + g_{jj,t-1}Y_t;\qquad Z_t = g_{ii,t}L_t + g_{ij,t}Y_{t+1}\ (t<N-1),\ Z_{N-1} = L_{N-1}.$$
  Forward transform $F = \Delta\odot\mathcal L_{l}(\mathcal U_{u}(\Pi V))$; inverse transform
  $\Pi^{-1}\mathcal L_{l^*}(\mathcal U_{u^*}(\bar\Delta\odot\,\cdot))$ with the conjugate-transposed
  blocks (upstream's ``InverseDHHPTransform`` swaps the two sets twice, so the upper stage again
  gets the $u$ set) ($\Pi$: upstream's optional ``permutation_dim`` $M$ reshuffle, $(N/M, M)\to(M, N/M)$).
* **Kernelution**: $K = \mathrm{inverse}\big(e^{i\,p(\lambda)}\odot F\big)$, complex $(B, N, D)$.

Note, measured on upstream's own classes: the scan initialisations $H_{N-1} = 0$, $L_0 = 0$ drop
$X_{N-1}$ from the upper stage and $Y_0$ from the lower one, so the stages are not the unitary
Givens products the paper describes (for random inputs $\lVert F\rVert^2/\lVert V\rVert^2\approx 0.7$
and inverse∘forward $\ne$ identity). The same holds for the older explicit-stencil version
(ratio ≈ 1.04). refattn follows the code at the pinned commit.

Encoder block (``ConverterEncoder`` without the embedding)
----------------------------------------------------------
$$k = K(x) + x,\quad \hat k = \mathrm{SN}_c(k),\quad
f = \big(\mathrm{softplus}_5(\mathrm{Re}\,\hat k\,W_{1r} + b_{1r})\odot\tanh(\mathrm{Im}\,\hat k\,W_{1i} + b_{1i})\big)W_2 + b_2,$$
$$y = \mathrm{SN}\big(f + a\,\mathrm{Re}\,\hat k + (1-a)\,\mathrm{Im}\,\hat k\big),\qquad a = \mathrm{clamp}(\texttt{alpha}, 0, 1),$$
$\mathrm{SN}_c$ the ScaleNorm of the complex vector ($\lVert k\rVert_2^2 = \sum_d|k_d|^2$, real weight),
$\mathrm{softplus}_5$ torch's ``Softplus(beta=1, threshold=5)`` (linear above 5). The output is real.

Backward
--------
Real loss, complex intermediates: the gradient of a complex $z$ is $\bar g_z = \partial L/\partial\mathrm{Re}\,z
+ i\,\partial L/\partial\mathrm{Im}\,z$ (torch's convention). Then for $w = az$: $\bar g_z = \bar a\,\bar g_w$,
$\bar g_a = \sum\bar z\,\bar g_w$; for a real $p$ entering $z(p)$: $\partial L/\partial p = \mathrm{Re}(\overline{\bar g_z}\,\partial z/\partial p)$.

* Block: SN VJP; $d\mathrm{Re}\,\hat k = dG\,(\ldots)$ through the gated FFN
  ($d r = (dh\odot\tanh s)\,\sigma(r)$ or $dh\odot\tanh s$ above the threshold, $ds = dh\odot\mathrm{sp}(r)(1-\tanh^2 s)$)
  plus $a\,dg$, $d\mathrm{Im}\,\hat k$ likewise plus $(1-a)dg$; $da = \sum dg\odot(\mathrm{Re}\,\hat k - \mathrm{Im}\,\hat k)$
  inside $[0,1]$ (zero outside); complex SN VJP $\bar g_k = s\,w\bar g - s^2\,\mathrm{Re}\langle w\bar g, k\rangle\,k/\lVert k\rVert$,
  $s = 1/(\lVert k\rVert+\epsilon)$; $dx \mathrel{+}= \mathrm{Re}\,\bar g_k$ (residual).
* Stages: each recurrence is reversed. Upper: $\bar g_{H_0} = \bar g_{Y_0}$, $\bar g_{H_t} = \bar g_{jj,t-1}\ldots$ —
  precisely $\bar g_{H_t} \mathrel{+}= \overline{g_{jj,t-1}}\,\bar g_{Y_t}$, $\bar g_{X_{t-1}} \mathrel{+}= \overline{g_{ji,t-1}}\,\bar g_{Y_t}$,
  then for $t = 0..N-2$: $\bar g_{H_t} \mathrel{+}= \overline{g_{ij,t-1}}\,\bar g_{H_{t-1}}$, $\bar g_{X_t} \mathrel{+}= \overline{g_{ii,t}}\,\bar g_{H_t}$;
  coefficient gradients $\bar g_{ii,t} = \sum_d\bar X_t\bar g_{H_t}$, $\bar g_{ij,t} = \sum_d\bar H_{t+1}\bar g_{H_t}$,
  $\bar g_{ji,t-1} = \sum_d\bar X_{t-1}\bar g_{Y_t}$, $\bar g_{jj,t-1} = \sum_d\bar H_t\bar g_{Y_t}$. Lower: the mirror
  image ($t = N-1..1$, $\bar g_{L_t} \mathrel{+}= \overline{g_{ji,t}}\bar g_{L_{t+1}}$).
* Givens blocks: $dA = \mathrm{Re}(\overline{\bar g_{ii}}(-i g_{ii}) + \overline{\bar g_{jj}}(i g_{jj}))$,
  $dB = \mathrm{Re}(\overline{\bar g_{ij}}(i g_{ij}) + \overline{\bar g_{ji}}(-i g_{ji}))$,
  $dC = \mathrm{Re}(\overline{\bar g_{ii}}(-e^{-iA}\sin C) + \overline{\bar g_{ij}}(-e^{iB}\cos C)
  + \overline{\bar g_{ji}}\,e^{-iB}\cos C + \overline{\bar g_{jj}}(-e^{iA}\sin C))$, then
  $d\alpha = \pi(dA+dB)$, $d\beta = \pi(dA-dB)$, $d\gamma = \pi\,dC$; $d\theta = \mathrm{Re}(\overline{\bar g_\Delta}\,2\pi i\Delta)$
  $- \mathrm{Re}(\overline{\bar g_{\bar\Delta}}\,2\pi i\bar\Delta)$; $dp = \mathrm{Re}(\overline{\bar g_E}\,iE)$ for $E = e^{ip}$.
* Chebyshev: $dT_k$ from $dp\,c_{bk}g_k$, reversed recurrence $dT_{k-1} \mathrel{+}= 2\lambda\,dT_k$,
  $dT_{k-2} \mathrel{-}= dT_k$, $d\lambda \mathrel{+}= 2T_{k-1}dT_k$ (and $dT_1$ to $\lambda$); $dc_{bk} = \sum_n dp\,g_kT_k$.
* SIRENs: mean / pooling / reshape / chunk VJPs are their adjoints; $\sin' = \cos$; SN and FixNorm
  VJPs as above (real); linear VJPs.

Conventions
-----------
* ``kernel_type`` in ``"none"`` (upstream default), ``"dirichlet"`` (both: $g_k = 1$),
  ``"fejer"``, ``"jackson"``, ``"lanczos"`` (``mu``), ``"lorentz"`` (``xi``), ``"wang"``
  (``stigma``, ``heta``); upstream's ``"vekic"`` indexes a row instead of a column and is not
  offered. ``max_order`` $K$ (default 2); ``enable_kpm=False`` uses $p(\lambda) = \lambda$.
* ``permutation_dim`` (default ``None`` = upstream's configs' 0).
* ScaleNorm / FixNorm $\epsilon = 10^{-5}$ added to the norm (``eps``). Dropouts (eval) not
  modelled. The Chebyshev-coefficient regulariser ``loss_seq_kp`` and the embedding are not layers
  of the block.
* The explicit-stencil DHHP of commit ``e1179aa`` (``model/encoder/converter.py@e1179aa``)
  computes a different tridiagonal operator; it is not offered.

Upstream parity (float64, CPU, torch 2.13; upstream ``ConverterEncoder`` imported from the
snapshot in a /tmp scratch script, its embedding replaced by the identity, parameters perturbed
off their init): $B=2$, $N=8$, $D=6$, hidden 10, $K=2$, four seeds × (``"none"``; ``"jackson"``
with ``permutation_dim=2``; ``"lanczos"``): output max abs error $3.4\times10^{-15}$. Upstream's
*gradients* are wrong: its ``PScan.backward`` (``utils/pscan.py``) is correct for real inputs
($10^{-15}$) but not for the complex ones the DHHP stages pass (errors $O(1)$ against torch autograd
of the same recurrence written as a loop), so upstream's autograd disagrees with finite differences
of upstream's own forward. With ``pscan`` replaced by that loop, refattn's gradients agree with
torch autograd to $4.1\times10^{-14}$ (``x``) and $6.4\times10^{-14}$ (parameters; relative $1.3\times10^{-14}$).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp
from ...nn.pooling import adaptive_pool_matrix
from ...registry import Mechanism, Sample, register

__all__ = [
    "KERNEL_TYPES",
    "kpm_damping",
    "givens_blocks",
    "givens_blocks_vjp",
    "dhhp_upper",
    "dhhp_upper_vjp",
    "dhhp_lower",
    "dhhp_lower_vjp",
    "converter_param_spec",
    "init_converter_params",
    "converter_block_forward",
    "converter_block_backward",
    "converter_block",
]

KERNEL_TYPES = ("none", "dirichlet", "fejer", "jackson", "lanczos", "lorentz", "wang")
_EIG = "kernelution.seq_eigenvalue.siren"
_GIV = "kernelution.givens_parameters.siren"
_CHEB = "kernelution.seq_kernel_poly.cheb_coef"


def kpm_damping(kernel_type: str = "none", max_order: int = 2, *, mu: int = 3, xi: float = 4.0, stigma: float = 0.5,
                heta: int = 2) -> np.ndarray:
    r"""Gibbs damping factors $g_0..g_K$ of upstream's ``KernelPolynomial`` ($g_0$ is never used: the
    constant term is undamped). ``"none"``/``"dirichlet"``: 1; ``"fejer"``: $1 - k/(K+1)$;
    ``"jackson"``: $((K+2-k)\sin c\cos kc + \cos c\sin kc)/((K+2)\sin c)$, $c = \pi/(K+2)$;
    ``"lanczos"``: $\mathrm{sinc}(k/(K+1))^{\mu}$; ``"lorentz"``: $\sinh(\xi(1-k/(K+1)))/\sinh\xi$;
    ``"wang"``: $\exp(-(k/(\varsigma(K+1)))^{\eta})$."""
    check_choice(kernel_type, "kernel_type", KERNEL_TYPES)
    kk = check_int(max_order, "max_order", minimum=0)
    k = np.arange(kk + 1, dtype=np.float64)
    if kernel_type == "fejer":
        g = 1.0 - k / (kk + 1)
    elif kernel_type == "jackson":
        c = math.pi / (kk + 2)
        g = ((kk + 2 - k) * math.sin(c) * np.cos(k * c) + math.cos(c) * np.sin(k * c)) / ((kk + 2) * math.sin(c))
    elif kernel_type == "lanczos":
        g = np.sinc(k / (kk + 1)) ** mu
    elif kernel_type == "lorentz":
        g = np.sinh(xi * (1.0 - k / (kk + 1))) / math.sinh(xi)
    elif kernel_type == "wang":
        g = np.exp(-((k / (stigma * (kk + 1))) ** heta))
    else:
        g = np.ones(kk + 1)
    g[0] = 1.0
    return g


def givens_blocks(alpha, beta, gamma):
    r"""The 2×2 block entries $(g_{ii}, g_{ij}, g_{ji}, g_{jj})$ of upstream's ``gengerate_dhhp_parameters``."""
    a, b, c = math.pi * (alpha + beta), math.pi * (alpha - beta), math.pi * gamma
    return np.exp(-1j * a) * np.cos(c), -np.exp(1j * b) * np.sin(c), np.exp(-1j * b) * np.sin(c), \
        np.exp(1j * a) * np.cos(c)


def givens_blocks_vjp(grads, alpha, beta, gamma):
    r"""``(dalpha, dbeta, dgamma)`` from the complex gradients ``(gii, gij, gji, gjj)`` (module docstring)."""
    gii, gij, gji, gjj = grads
    a, b, c = math.pi * (alpha + beta), math.pi * (alpha - beta), math.pi * gamma
    ii, ij, ji, jj = givens_blocks(alpha, beta, gamma)
    da = np.real(np.conj(gii) * (-1j * ii) + np.conj(gjj) * (1j * jj))
    db = np.real(np.conj(gij) * (1j * ij) + np.conj(gji) * (-1j * ji))
    dc = np.real(np.conj(gii) * (-np.exp(-1j * a) * np.sin(c)) + np.conj(gij) * (-np.exp(1j * b) * np.cos(c))
                 + np.conj(gji) * (np.exp(-1j * b) * np.cos(c)) + np.conj(gjj) * (-np.exp(1j * a) * np.sin(c)))
    return math.pi * (da + db), math.pi * (da - db), math.pi * dc


def _csum(a, b):
    # sum_d conj(a) * b over the feature axis
    return (np.conj(a) * b).sum(axis=-1)


def dhhp_upper(x, ii, ij, ji, jj):
    r"""Upstream's upper 1-DHHP stage on ``x (B, N, D)`` with coefficients ``(B, N-1)``: returns ``(y, H)``,
    $H_{N-1}=0$, $H_t = g_{ii,t}x_t + g_{ij,t}H_{t+1}$, $y_0 = H_0$, $y_t = g_{ji,t-1}x_{t-1} + g_{jj,t-1}H_t$."""
    n = x.shape[1]
    h = np.zeros(x.shape, dtype=np.result_type(x, ii))
    for t in range(n - 2, -1, -1):
        h[:, t] = ii[:, t, None] * x[:, t] + ij[:, t, None] * h[:, t + 1]
    y = np.empty_like(h)
    y[:, 0] = h[:, 0]
    y[:, 1:] = ji[..., None] * x[:, :-1] + jj[..., None] * h[:, 1:]
    return y, h


def dhhp_upper_vjp(gy, x, h, ii, ij, ji, jj):
    """Backward of :func:`dhhp_upper`: ``(gx, (gii, gij, gji, gjj))`` (complex gradients)."""
    n = x.shape[1]
    gx = np.zeros_like(gy)
    gh = np.zeros_like(gy)
    gh[:, 0] = gy[:, 0]
    gh[:, 1:] = np.conj(jj)[..., None] * gy[:, 1:]
    gx[:, :-1] = np.conj(ji)[..., None] * gy[:, 1:]
    gji, gjj = _csum(x[:, :-1], gy[:, 1:]), _csum(h[:, 1:], gy[:, 1:])
    gii = np.zeros(ii.shape, dtype=gy.dtype)
    gij = np.zeros(ij.shape, dtype=gy.dtype)
    for t in range(n - 1):
        gx[:, t] += np.conj(ii[:, t, None]) * gh[:, t]
        gii[:, t] = _csum(x[:, t], gh[:, t])
        gij[:, t] = _csum(h[:, t + 1], gh[:, t])
        gh[:, t + 1] += np.conj(ij[:, t, None]) * gh[:, t]
    return gx, (gii, gij, gji, gjj)


def dhhp_lower(y, ii, ij, ji, jj):
    r"""Upstream's lower 1-DHHP stage: returns ``(z, L)``, $L_0 = 0$, $L_t = g_{ji,t-1}L_{t-1} + g_{jj,t-1}y_t$,
    $z_t = g_{ii,t}L_t + g_{ij,t}y_{t+1}$ ($t<N-1$), $z_{N-1} = L_{N-1}$."""
    n = y.shape[1]
    lv = np.zeros(y.shape, dtype=np.result_type(y, ii))
    for t in range(1, n):
        lv[:, t] = ji[:, t - 1, None] * lv[:, t - 1] + jj[:, t - 1, None] * y[:, t]
    z = np.empty_like(lv)
    z[:, :-1] = ii[..., None] * lv[:, :-1] + ij[..., None] * y[:, 1:]
    z[:, -1] = lv[:, -1]
    return z, lv


def dhhp_lower_vjp(gz, y, lv, ii, ij, ji, jj):
    """Backward of :func:`dhhp_lower`: ``(gy, (gii, gij, gji, gjj))``."""
    n = y.shape[1]
    gy = np.zeros_like(gz)
    gl = np.zeros_like(gz)
    gl[:, :-1] = np.conj(ii)[..., None] * gz[:, :-1]
    gl[:, -1] = gz[:, -1]
    gii, gij = _csum(lv[:, :-1], gz[:, :-1]), _csum(y[:, 1:], gz[:, :-1])
    gy[:, 1:] = np.conj(ij)[..., None] * gz[:, :-1]
    gji = np.zeros(ji.shape, dtype=gz.dtype)
    gjj = np.zeros(jj.shape, dtype=gz.dtype)
    for t in range(n - 1, 0, -1):
        gy[:, t] += np.conj(jj[:, t - 1, None]) * gl[:, t]
        gjj[:, t - 1] = _csum(y[:, t], gl[:, t])
        gji[:, t - 1] = _csum(lv[:, t - 1], gl[:, t])
        gl[:, t - 1] += np.conj(ji[:, t - 1, None]) * gl[:, t]
    return gy, (gii, gij, gji, gjj)


def converter_param_spec(dim: int, hidden: int, max_order: int = 2, batch: int | None = None) -> dict:
    """Shapes of the ``ConverterEncoder`` parameters (without ``embedding.*``; linear weights ``(in, out)``).
    ``cheb_coef`` is ``(batch, K+1)`` as upstream, or ``(K+1,)`` shared when ``batch`` is None."""
    d, h = dim, hidden
    spec = {}
    for pre in (_EIG, _GIV):
        spec.update({f"{pre}.0.weight": (d, d), f"{pre}.0.bias": (d,), f"{pre}.2.weight": (d,),
                     f"{pre}.4.weight": (d, d), f"{pre}.4.bias": (d,)})
    spec[_CHEB] = (max_order + 1,) if batch is None else (batch, max_order + 1)
    spec.update({"kernelution.value_linear_real.weight": (d, d), "kernelution.value_linear_imag.weight": (d, d),
                 "kernelution_norm.weight": (d,), "gffn.linear1_real.weight": (d, h), "gffn.linear1_real.bias": (h,),
                 "gffn.linear1_imag.weight": (d, h), "gffn.linear1_imag.bias": (h,), "gffn.linear2.weight": (h, d),
                 "gffn.linear2.bias": (d,), "gffn_norm.weight": (d,), "alpha": (1,)})
    return spec


def init_converter_params(rng, dim: int, hidden: int, *, max_order: int = 2, batch: int | None = None) -> dict:
    """Upstream's ``reset_parameters``: SIREN weights $U(\\pm\\sqrt{6/D})$ and zero biases, ScaleNorm weights 1,
    value weights $N(0, 1/2)$, Xavier-uniform FFN weights with zero biases, ``cheb_coef`` $2/(K+1)$ ($1/(K+1)$
    for $k=0$), ``alpha`` 1."""
    d, h = dim, hidden
    p = {}
    for pre in (_EIG, _GIV):
        bound = math.sqrt(6.0 / d)
        p.update({f"{pre}.0.weight": rng.uniform(-bound, bound, (d, d)), f"{pre}.0.bias": np.zeros(d),
                  f"{pre}.2.weight": np.ones(d), f"{pre}.4.weight": rng.uniform(-bound, bound, (d, d)),
                  f"{pre}.4.bias": np.zeros(d)})
    cheb = np.full((max_order + 1,), 2.0 / (max_order + 1))
    cheb[0] = 1.0 / (max_order + 1)
    p[_CHEB] = cheb if batch is None else np.tile(cheb, (batch, 1))
    xav = lambda a, b: rng.uniform(-1, 1, (a, b)) * math.sqrt(6.0 / (a + b))  # noqa: E731
    p.update({"kernelution.value_linear_real.weight": rng.normal(0.0, math.sqrt(0.5), (d, d)),
              "kernelution.value_linear_imag.weight": rng.normal(0.0, math.sqrt(0.5), (d, d)),
              "kernelution_norm.weight": np.ones(d), "gffn.linear1_real.weight": xav(d, h),
              "gffn.linear1_real.bias": np.zeros(h), "gffn.linear1_imag.weight": xav(d, h),
              "gffn.linear1_imag.bias": np.zeros(h), "gffn.linear2.weight": xav(h, d), "gffn.linear2.bias": np.zeros(d),
              "gffn_norm.weight": np.ones(d), "alpha": np.ones(1)})
    return p


# --------------------------------------------------------------------------------------------
# Private math helpers: ScaleNorm / FixNorm (real or complex), the SIRENs, the thresholded softplus


def _sn(h, w, eps):
    # ScaleNorm (w given) or FixNorm (w None) over the last axis; |.| is the complex modulus.
    r = np.sqrt((np.abs(h) ** 2).sum(axis=-1, keepdims=True))
    s = 1.0 / (r + eps)
    y = h * s if w is None else w * h * s
    return y, (h, r, s, w)


def _sn_vjp(gy, c):
    h, r, s, w = c
    wg = gy if w is None else w * gy
    t = np.real((np.conj(wg) * h).sum(axis=-1, keepdims=True))
    gh = s * wg - (s * s / r) * t * h
    gw = None if w is None else np.real(np.conj(gy) * h * s).reshape(-1, h.shape[-1]).sum(axis=0)
    return gh, gw


def _siren(x, p, pre, eps):
    a0 = linear_apply(x, p[f"{pre}.0.weight"], p[f"{pre}.0.bias"])
    h2, c2 = _sn(np.sin(a0), p[f"{pre}.2.weight"], eps)
    a4 = linear_apply(h2, p[f"{pre}.4.weight"], p[f"{pre}.4.bias"])
    return np.sin(a4), (x, a0, c2, h2, a4)


def _siren_vjp(g, c, p, pre, grads):
    x, a0, c2, h2, a4 = c
    l4 = linear_vjp(g * np.cos(a4), h2, p[f"{pre}.4.weight"])
    gh1, grads[f"{pre}.2.weight"] = _sn_vjp(l4["x"], c2)
    l0 = linear_vjp(gh1 * np.cos(a0), x, p[f"{pre}.0.weight"])
    grads.update({f"{pre}.4.weight": l4["weight"], f"{pre}.4.bias": l4["bias"], f"{pre}.0.weight": l0["weight"],
                  f"{pre}.0.bias": l0["bias"]})
    return l0["x"]


def _softplus5(r):
    # torch Softplus(beta=1, threshold=5): linear above the threshold
    return np.where(r > 5.0, r, np.logaddexp(0.0, np.minimum(r, 5.0)))


def _softplus5_grad(r):
    return np.where(r > 5.0, 1.0, 0.5 * (1.0 + np.tanh(0.5 * np.minimum(r, 5.0))))


def _permutation(n, m):
    if m is None:
        return None, None
    perm = np.arange(n).reshape(n // m, m).T.ravel()
    return perm, np.argsort(perm)


# --------------------------------------------------------------------------------------------
# The encoder block


def converter_block_forward(x, params, *, kernel_type: str = "none", enable_kpm: bool = True,
                            permutation_dim=None, mu: int = 3, xi: float = 4.0, stigma: float = 0.5, heta: int = 2,
                            eps: float = 1e-5):
    r"""Converter encoder block on an embedded sequence ``x (B, N, D)`` (upstream ``ConverterEncoder``
    after its ``embedding``; see the module docstring). Returns ``(out (B, N, D), cache)``.

    ``params`` as :func:`converter_param_spec` (``cheb_coef`` ``(B, K+1)`` as upstream or ``(K+1,)``;
    $K$ = ``max_order`` is read from its last axis). ``permutation_dim`` $M$ must divide $N$.
    """
    x = as_float(x, "x", ndim=3)
    b, n, d = x.shape
    if n < 2:
        raise ValueError(f"x must have at least 2 tokens (the DHHP stages couple neighbours); got N={n}")
    check_choice(kernel_type, "kernel_type", KERNEL_TYPES)
    eps = check_positive(eps, "eps")
    m = None if permutation_dim in (None, 0, "none") else check_int(permutation_dim, "permutation_dim", minimum=1)
    if m is not None and n % m:
        raise ValueError(f"permutation_dim must divide the sequence length N={n}; got {m}")
    # K (max_order), the batch layout of cheb_coef and the FFN width are read from the params;
    # anything malformed falls through to check_params, which names the key.
    given = params if isinstance(params, dict) else {}
    cheb_shape = np.shape(given.get(_CHEB)) if given.get(_CHEB) is not None else (3,)
    if len(cheb_shape) not in (1, 2) or cheb_shape[-1] < 1:
        raise ValueError(f"{_CHEB} must have shape (K+1,) or (B={b}, K+1); got {cheb_shape}")
    w1 = np.shape(given.get("gffn.linear1_real.weight")) if given.get("gffn.linear1_real.weight") is not None else ()
    hidden = w1[-1] if len(w1) == 2 else 1
    spec = converter_param_spec(d, hidden, cheb_shape[-1] - 1, None if len(cheb_shape) == 1 else b)
    p = check_params(params, spec, where="converter_block (Converter ConverterEncoder)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    kk = cheb_shape[-1] - 1
    damp = kpm_damping(kernel_type, kk, mu=mu, xi=xi, stigma=stigma, heta=heta).astype(dt)
    cdt = np.result_type(dt, np.complex64)

    # Givens parameters and the diagonal
    h3, cg = _siren(x, p, _GIV, eps)
    h4, c6 = _sn(h3, None, eps)
    pool = adaptive_pool_matrix(d, 7, dt)
    chunks = (h4 @ pool.T).reshape(b, 7 * n).reshape(b, 7, n)
    lset = (chunks[:, 0, :-1], chunks[:, 1, :-1], chunks[:, 2, :-1])
    uset = (chunks[:, 3, 1:], chunks[:, 4, 1:], chunks[:, 5, 1:])
    theta = chunks[:, 6]
    gl, gu = givens_blocks(*lset), givens_blocks(*uset)
    gl_h, gu_h = (gl[3], -gl[1], -gl[2], gl[0]), (gu[3], -gu[1], -gu[2], gu[0])
    dg = np.exp(2j * math.pi * theta)

    # spectrum
    e3, ce = _siren(x, p, _EIG, eps)
    lam = e3.mean(axis=-1)
    cb = p[_CHEB] if p[_CHEB].ndim == 2 else p[_CHEB][None]
    tk = [np.ones_like(lam), lam]
    for _ in range(2, kk + 1):
        tk.append(2.0 * lam * tk[-1] - tk[-2])
    tk = tk[:kk + 1]
    spec_p = sum(cb[:, k:k + 1] * (damp[k] if k else 1.0) * tk[k] for k in range(kk + 1)) if enable_kpm else lam
    eig = np.exp(1j * spec_p)

    # the digraph convolution
    perm, inv = _permutation(n, m)
    v = (linear_apply(x, p["kernelution.value_linear_real.weight"])
         + 1j * linear_apply(x, p["kernelution.value_linear_imag.weight"])).astype(cdt)
    xp = v if perm is None else v[:, perm]
    y1, h1 = dhhp_upper(xp, *gu)
    z1, l1 = dhhp_lower(y1, *gl)
    f = dg[..., None] * z1
    u1 = eig[..., None] * f
    x2 = np.conj(dg)[..., None] * u1
    y2, h2 = dhhp_upper(x2, *gu_h)
    z2, l2 = dhhp_lower(y2, *gl_h)
    kern = z2 if inv is None else z2[:, inv]

    # the block
    kn, cn = _sn(kern + x, p["kernelution_norm.weight"], eps)
    r = linear_apply(kn.real, p["gffn.linear1_real.weight"], p["gffn.linear1_real.bias"])
    s = linear_apply(kn.imag, p["gffn.linear1_imag.weight"], p["gffn.linear1_imag.bias"])
    hg = _softplus5(r) * np.tanh(s)
    a = float(np.clip(p["alpha"][0], 0.0, 1.0))
    g = linear_apply(hg, p["gffn.linear2.weight"], p["gffn.linear2.bias"]) + a * kn.real + (1.0 - a) * kn.imag
    out, co = _sn(g, p["gffn_norm.weight"], eps)
    cache = {"x": x, "p": p, "cg": cg, "c6": c6, "pool": pool, "lset": lset, "uset": uset, "gl": gl, "gu": gu,
             "gl_h": gl_h, "gu_h": gu_h, "dg": dg, "ce": ce, "lam": lam, "tk": tk, "cb": cb, "damp": damp,
             "kk": kk, "kpm": bool(enable_kpm), "eig": eig, "perm": perm, "inv": inv, "xp": xp, "y1": y1, "h1": h1,
             "z1": z1, "l1": l1, "f": f, "u1": u1, "x2": x2, "y2": y2, "h2": h2, "l2": l2, "cn": cn, "kn": kn,
             "r": r, "s": s, "hg": hg, "a": a, "co": co, "shape": out.shape}
    return out, cache


def converter_block_backward(dout, cache):
    """Gradient of :func:`converter_block_forward`: ``x`` and every parameter (module docstring)."""
    c, p, x = cache, cache["p"], cache["x"]
    b, n, d = x.shape
    go = as_dout(dout, c["shape"], x.dtype)
    grads = {}
    gg, grads["gffn_norm.weight"] = _sn_vjp(go, c["co"])
    kn, r, s, a = c["kn"], c["r"], c["s"], c["a"]
    alpha = p["alpha"][0]
    grads["alpha"] = np.array([(gg * (kn.real - kn.imag)).sum() if 0.0 <= alpha <= 1.0 else 0.0], dtype=x.dtype)
    l2 = linear_vjp(gg, c["hg"], p["gffn.linear2.weight"])
    grads["gffn.linear2.weight"], grads["gffn.linear2.bias"] = l2["weight"], l2["bias"]
    th = np.tanh(s)
    lr = linear_vjp(l2["x"] * th * _softplus5_grad(r), kn.real, p["gffn.linear1_real.weight"])
    li = linear_vjp(l2["x"] * _softplus5(r) * (1.0 - th * th), kn.imag, p["gffn.linear1_imag.weight"])
    for nm, lv in (("real", lr), ("imag", li)):
        grads[f"gffn.linear1_{nm}.weight"], grads[f"gffn.linear1_{nm}.bias"] = lv["weight"], lv["bias"]
    gkn = (lr["x"] + a * gg) + 1j * (li["x"] + (1.0 - a) * gg)
    gk, grads["kernelution_norm.weight"] = _sn_vjp(gkn, c["cn"])
    gx = np.real(gk).copy()                                               # the residual k = K(x) + x

    # the digraph convolution, reversed
    gz2 = gk if c["inv"] is None else gk[:, c["perm"]]
    gy2, gl_h = dhhp_lower_vjp(gz2, c["y2"], c["l2"], *c["gl_h"])
    gx2, gu_h = dhhp_upper_vjp(gy2, c["x2"], c["h2"], *c["gu_h"])
    dg, eig, f, u1 = c["dg"], c["eig"], c["f"], c["u1"]
    g_cdg = _csum(u1, gx2)
    gu1 = dg[..., None] * gx2
    g_eig = _csum(f, gu1)
    gf = np.conj(eig)[..., None] * gu1
    g_dg = _csum(c["z1"], gf)
    gz1 = np.conj(dg)[..., None] * gf
    gy1, gl_f = dhhp_lower_vjp(gz1, c["y1"], c["l1"], *c["gl"])
    gxp, gu_f = dhhp_upper_vjp(gy1, c["xp"], c["h1"], *c["gu"])
    gv = gxp if c["perm"] is None else gxp[:, c["inv"]]
    for nm, part in (("real", np.real(gv)), ("imag", np.imag(gv))):
        lv = linear_vjp(part, x, p[f"kernelution.value_linear_{nm}.weight"], False)
        grads[f"kernelution.value_linear_{nm}.weight"] = lv["weight"]
        gx += lv["x"]

    # spectrum
    gp = np.real(np.conj(g_eig) * 1j * eig)
    lam, tk, cb, damp, kk = c["lam"], c["tk"], c["cb"], c["damp"], c["kk"]
    if c["kpm"]:
        gcb = np.stack([(gp * (damp[k] if k else 1.0) * tk[k]).sum(axis=-1) for k in range(kk + 1)], axis=-1)
        grads[_CHEB] = gcb if p[_CHEB].ndim == 2 else gcb.sum(axis=0)
        gt = [gp * cb[:, k:k + 1] * (damp[k] if k else 1.0) for k in range(kk + 1)]
        glam = np.zeros_like(lam)
        for k in range(kk, 1, -1):
            glam += 2.0 * tk[k - 1] * gt[k]
            gt[k - 1] = gt[k - 1] + 2.0 * lam * gt[k]
            gt[k - 2] = gt[k - 2] - gt[k]
        if kk >= 1:
            glam += gt[1]
    else:
        grads[_CHEB] = np.zeros_like(p[_CHEB])
        glam = gp
    gx += _siren_vjp(np.repeat(glam[..., None] / d, d, axis=-1), c["ce"], p, _EIG, grads)

    # Givens parameters and the diagonal
    gu_all = [gf_ + h_ for gf_, h_ in zip(gu_f, (gu_h[3], -gu_h[1], -gu_h[2], gu_h[0]))]
    gl_all = [gf_ + h_ for gf_, h_ in zip(gl_f, (gl_h[3], -gl_h[1], -gl_h[2], gl_h[0]))]
    dl, du = givens_blocks_vjp(gl_all, *c["lset"]), givens_blocks_vjp(gu_all, *c["uset"])
    gchunks = np.zeros((b, 7, n), dtype=x.dtype)
    for i in range(3):
        gchunks[:, i, :-1] = dl[i]
        gchunks[:, 3 + i, 1:] = du[i]
    gchunks[:, 6] = np.real(np.conj(g_dg) * 2j * math.pi * dg) + np.real(np.conj(g_cdg) * (-2j) * math.pi * np.conj(dg))
    gh4 = gchunks.reshape(b, n, 7) @ c["pool"]
    gh3, _ = _sn_vjp(gh4, c["c6"])
    gx += _siren_vjp(gh3, c["cg"], p, _GIV, grads)
    grads["x"] = gx
    return {"x": gx, **{k: grads[k] for k in p}}


def converter_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`converter_block_forward`."""
    return converter_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, **config):
    b, n, d, h = (2, 4, 4, 4) if size == "tiny" else (2, int(rng.integers(4, 8)), 6, 8)
    p = init_converter_params(rng, d, h, max_order=2, batch=b)
    for k in p:  # move every parameter off its structured init so that each gradient is exercised
        p[k] = p[k] + 0.2 * rng.standard_normal(p[k].shape)
    p["alpha"] = np.array([rng.uniform(0.25, 0.75)])
    return Sample(inputs={"x": rng.standard_normal((b, n, d))}, params=p, config=dict(config))


def _stage_matrices(ii, ij, ji, jj, n):
    # Dense (N, N) matrices of the upper and lower stages from their closed forms (one batch row).
    r = np.zeros((n, n), dtype=complex)
    for t in range(n - 1):
        for s_ in range(t, n - 1):
            r[t, s_] = np.prod(ij[t:s_]) * ii[s_]
    up = np.zeros((n, n), dtype=complex)
    up[0] = r[0]
    lm = np.zeros((n, n), dtype=complex)
    for t in range(1, n):
        up[t] = jj[t - 1] * r[t]
        up[t, t - 1] += ji[t - 1]
        for s_ in range(1, t + 1):
            lm[t, s_] = np.prod(ji[s_:t]) * jj[s_ - 1]
    low = np.zeros((n, n), dtype=complex)
    for t in range(n - 1):
        low[t] = ii[t] * lm[t]
        low[t, t + 1] += ij[t]
    low[n - 1] = lm[n - 1]
    return up, low


def _reference(x, params, *, kernel_type="none", enable_kpm=True, permutation_dim=None, mu=3, xi=4.0, stigma=0.5,
               heta=2, eps=1e-5):
    # Per batch element with dense stage matrices, Chebyshev polynomials as cos(k arccos(lambda)) and
    # the permutation as a matrix.
    p = params
    b, n, d = x.shape

    def sn(h, w):
        return (1.0 if w is None else w) * h / (np.sqrt((np.abs(h) ** 2).sum(-1, keepdims=True)) + eps)

    def siren(z, pre):
        h1 = sn(np.sin(z @ p[f"{pre}.0.weight"] + p[f"{pre}.0.bias"]), p[f"{pre}.2.weight"])
        return np.sin(h1 @ p[f"{pre}.4.weight"] + p[f"{pre}.4.bias"])

    cheb = p[_CHEB] if p[_CHEB].ndim == 2 else np.tile(p[_CHEB], (b, 1))
    kk = cheb.shape[1] - 1
    damp = kpm_damping(kernel_type, kk, mu=mu, xi=xi, stigma=stigma, heta=heta)
    pm = np.eye(n)
    if permutation_dim:
        pm = np.eye(n)[np.arange(n).reshape(n // permutation_dim, permutation_dim).T.ravel()]
    out = np.zeros_like(x)
    for bb in range(b):
        xb = x[bb]
        prm = (sn(siren(xb, _GIV), None) @ adaptive_pool_matrix(d, 7).T).reshape(7, n)
        gl = givens_blocks(prm[0, :-1], prm[1, :-1], prm[2, :-1])
        gu = givens_blocks(prm[3, 1:], prm[4, 1:], prm[5, 1:])
        dg = np.diag(np.exp(2j * np.pi * prm[6]))
        lam = siren(xb, _EIG).mean(-1)
        ks = np.arange(kk + 1)
        pk = (cheb[bb] * np.where(ks == 0, 1.0, damp) * np.cos(ks[None] * np.arccos(lam)[:, None])).sum(-1)
        e = np.diag(np.exp(1j * (pk if enable_kpm else lam)))
        up_u, low_l = _stage_matrices(*gu, n)[0], _stage_matrices(*gl, n)[1]
        up_uh = _stage_matrices(gu[3], -gu[1], -gu[2], gu[0], n)[0]
        low_lh = _stage_matrices(gl[3], -gl[1], -gl[2], gl[0], n)[1]
        op = pm.T @ low_lh @ up_uh @ dg.conj() @ e @ dg @ low_l @ up_u @ pm
        v = xb @ p["kernelution.value_linear_real.weight"] + 1j * (xb @ p["kernelution.value_linear_imag.weight"])
        kn = sn(op @ v + xb, p["kernelution_norm.weight"])
        r = kn.real @ p["gffn.linear1_real.weight"] + p["gffn.linear1_real.bias"]
        s_ = kn.imag @ p["gffn.linear1_imag.weight"] + p["gffn.linear1_imag.bias"]
        sp = np.where(r > 5.0, r, np.log1p(np.exp(np.minimum(r, 5.0))))
        a = np.clip(p["alpha"][0], 0.0, 1.0)
        g = (sp * np.tanh(s_)) @ p["gffn.linear2.weight"] + p["gffn.linear2.bias"] + a * kn.real + (1 - a) * kn.imag
        out[bb] = sn(g, p["gffn_norm.weight"])
    return out


def _check_givens_blocks_unitary(rng):
    # Each 2x2 block [[g_ii, g_ij], [g_ji, g_jj]] is unitary and upstream's "conj_trs" entries are its inverse.
    al, be, ga = (rng.standard_normal(50) for _ in range(3))
    ii, ij, ji, jj = givens_blocks(al, be, ga)
    blk = np.stack([np.stack([ii, ij], -1), np.stack([ji, jj], -1)], -2)
    inv = np.stack([np.stack([jj, -ij], -1), np.stack([-ji, ii], -1)], -2)
    err = max(float(np.abs(blk @ np.conj(np.swapaxes(blk, -1, -2)) - np.eye(2)).max()),
              float(np.abs(inv @ blk - np.eye(2)).max()))
    assert err < 1e-12, f"Givens blocks not unitary (error {err:.2e})"
    return err


def _check_stages_equal_dense_matrices(rng):
    # The scan recurrences equal the closed-form stage matrices, and (upstream's scans start from 0)
    # the upper stage ignores the last token and the lower stage the first one.
    n, d = 6, 3
    co = [np.exp(1j * rng.standard_normal((1, n - 1))) * rng.uniform(0.5, 1.5, (1, n - 1)) for _ in range(4)]
    x = rng.standard_normal((1, n, d)) + 1j * rng.standard_normal((1, n, d))
    up, low = _stage_matrices(*(c_[0] for c_ in co), n)
    err = max(float(np.abs(dhhp_upper(x, *co)[0][0] - up @ x[0]).max()),
              float(np.abs(dhhp_lower(x, *co)[0][0] - low @ x[0]).max()))
    assert err < 1e-12, f"DHHP stages differ from their dense matrices by {err:.2e}"
    assert np.abs(up[:, -1]).max() == 0.0 and np.abs(low[:, 0]).max() == 0.0
    return err


def _check_chebyshev_is_cos(rng):
    # T_k(lambda) = cos(k arccos lambda) on [-1, 1] for every damping kernel.
    from ...testing.gradcheck import directional_check
    err = 0.0
    for kt in KERNEL_TYPES:
        s = _sample(rng, "tiny", kernel_type=kt)
        err = max(err, float(np.abs(converter_block(s.inputs["x"], s.params, kernel_type=kt)
                                    - _reference(s.inputs["x"], s.params, kernel_type=kt)).max()))
    assert err < 1e-10, f"kernel-polynomial spectrum differs from its cosine form by {err:.2e}"
    res = directional_check(converter_block_forward, converter_block_backward,
                            _sample(rng, "tiny", kernel_type="jackson"))
    assert res.max_rel < 1e-6, res
    return max(err, res.max_rel)


def _check_permutation_and_shared_coefficients(rng):
    # permutation_dim reshuffles tokens before the forward transform and back after the inverse one;
    # a (K+1,) cheb_coef equals the same row tiled over the batch; enable_kpm=False uses lambda itself.
    from ...testing.gradcheck import directional_check
    s = _sample(rng, "tiny", permutation_dim=2)
    err = float(np.abs(converter_block(s.inputs["x"], s.params, permutation_dim=2)
                       - _reference(s.inputs["x"], s.params, permutation_dim=2)).max())
    res = directional_check(converter_block_forward, converter_block_backward, s)
    assert res.max_rel < 1e-6, res
    shared = dict(s.params, **{_CHEB: s.params[_CHEB][0]})
    tiled = dict(s.params, **{_CHEB: np.tile(s.params[_CHEB][0], (s.inputs["x"].shape[0], 1))})
    err = max(err, float(np.abs(converter_block(s.inputs["x"], shared) - converter_block(s.inputs["x"], tiled)).max()))
    err = max(err, float(np.abs(converter_block(s.inputs["x"], s.params, enable_kpm=False)
                                - _reference(s.inputs["x"], s.params, enable_kpm=False)).max()))
    assert err < 1e-10, f"permutation / shared coefficients / enable_kpm off by {err:.2e}"
    return max(err, res.max_rel)


register(
    Mechanism(
        slug="converter_digraph_convolution", family="1-softmax", tier="T3",
        official_code="hazdzz/converter model/encoder/converter.py@dccb8f2",
        title="Converter: synthetic unitary digraph convolution (Kernelution) encoder block",
        paper="Zhang, Mao, Chiu, Sun, Converting Transformers into DGNNs Form, arXiv 2502.00585",
        forward=converter_block_forward, backward=converter_block_backward, sample=_sample, reference=_reference,
        docs="softmax/s9.md#converter_digraph_convolution",
        checks={"givens_blocks_unitary": _check_givens_blocks_unitary,
                "stages_equal_dense_matrices": _check_stages_equal_dense_matrices,
                "chebyshev_is_cos_all_kernels": _check_chebyshev_is_cos,
                "permutation_and_shared_coefficients": _check_permutation_and_shared_coefficients},
    ),
)
