r"""DyDiLA: dynamic differential linear attention — registered as **not implemented** (T3).

Cao, Yao, Wang, Ye, Wei, Shan, "Dynamic Differential Linear Attention: Enhancing Linear Diffusion
Transformer for High-Quality Image Generation", arXiv 2601.13683 (2026). No official code is public
(searched on 2026-12-02: the GitHub index for "DyDiLA" / "DyDi-LiT", the code and issue corpora; the
paper listings name no repository).

What the sources define
-----------------------
Reachable here: the abstract and third-party summaries of the method section (the stored copies of
the arXiv HTML stop before section 3.1). They define the first of the three parts, the *dynamic
projection module*: token-shared projections $[Q, K, V] = [XW_Q^0, XW_K^0, XW_V^0]$ and, per token,
an "information redundancy" $Q'_i = X_iW_Q^{u_i}$, $K'_i = X_iW_K^{v_i}$ with $n_P$ projector
matrices $W_Q^j, W_K^j\in\mathbb R^{d\times d}$ chosen by hard routers
$u_i = \arg\max_u (X_iR_Q^P)_u$, $v_i = \arg\max_v (X_iR_K^P)_v$, $R^P\in\mathbb R^{d\times n_P}$.

What is missing
---------------
The other two parts, which are the mechanism:

* the *dynamic measure kernel*: the set of kernel functions $\phi$ it chooses from and how a token's
  kernel is chosen (a second router? hard or soft?);
* the *token differential operator*: whether the redundancy is subtracted before or after the
  kernel ($\phi(Q) - \lambda\phi(Q')$ or $\phi(Q - \lambda Q')$ or a difference of two linear-attention
  outputs), what $\lambda$ is (fixed, learned, per head, re-parameterised as in DIFF), and the
  normaliser of the resulting signed linear attention (its denominator can cross zero);
* the gradient convention of the hard argmax routers (straight-through, a gate factor, none).

Each is a design decision of the method, not a convention; a forward written from the catalogue's
reconstruction ($\tilde Q = \phi(Q) - \lambda\phi(Q')$ with a single fixed $\phi$) would be a new
model, not DyDiLA. So no forward is registered; the record's ``notes`` say this.
"""

from __future__ import annotations

from ...registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="dydila_differential_linear_attention", family="2-differential", tier="T3",
        title="DyDiLA: dynamic differential linear attention (not implemented: the kernel and the differential "
              "operator are undefined in the available sources)",
        paper="Cao, Yao, Wang, Ye, Wei, Shan, Dynamic Differential Linear Attention: Enhancing Linear Diffusion "
              "Transformer for High-Quality Image Generation, arXiv 2601.13683",
        docs="differential/t3.md#dydila_differential_linear_attention",
        notes="Not implemented: only the abstract of arXiv 2601.13683 and summaries of its method section were "
              "available, and no code is public. They define the dynamic projection module (token-shared Q, K, V and a "
              "per-token redundancy Q'_i = X_i W_Q^{u_i}, K'_i = X_i W_K^{v_i} chosen by hard argmax routers) but not "
              "the dynamic measure kernel (which kernel functions, how a token's kernel is chosen), not where and with "
              "what lambda the token differential operator subtracts the redundancy, not the normaliser of the signed "
              "linear attention, and not the routers' gradient convention; those are the mechanism.",
    ),
)
