r"""DINT: differential-integral attention, rows normalised to sum to one.

Cang, Liu, Zhang, Zhao, Shi, "DINT Transformer", EMNLP 2025, arXiv 2501.17486 (abstract only; no
official code). DIFF attention plus an integral term of "global importance scores" with one
unified λ:

$$A = A_1 - \lambda A_2 + \lambda G,\qquad G = C A_{\text{src}},$$

$C$ a row average over the queries (all rows, or a causal running mean), so that every row of $A$
sums to $1-\lambda+\lambda = 1$. The ``integral="all"``, ``integral_source="A1"`` form follows
the only implementation found (third-party, ``jwliao1209/Differential-FT-Transformer``
``src/models/layers.py``, commit 5e94ec8, ``MultiheadDintAttention``); the causal average and the
``"A2"`` source are reconstructions, unverified. Since $GV = C(A_1V)$ the term costs one row
average of $O_1$. Backward: V1's chain with $dO_a \mathrel{+}= \lambda C^\top G$ and
$d\lambda \mathrel{+}= \langle G, C O_a\rangle$ (``refattn.attention.differential.core``,
`row_average_transpose`).
"""

from __future__ import annotations

import numpy as np

from ..._checks import check_choice
from ...registry import Mechanism, register
from ._samples import sample_v1, v1_sample_lambda_zero
from .core import expanded_core_forward
from .layer import v1_generic_backward, v1_layer_forward
from .v1 import diff_attention_v1_forward

__all__ = [
    "dint_attention_forward",
    "dint_attention_backward",
    "dint_attention",
]


def dint_attention_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                           integral: str = "auto", integral_source: str = "A1", **v1_config):
    r"""DINT attention (Cang, Liu, Zhang, Zhao, Shi, "DINT Transformer", EMNLP 2025, arXiv 2501.17486).

    [paper, abstract only — the method section could not be retrieved here, no official code]
    DIFF attention plus an *integral* term of "global importance scores" integrated into the
    attention matrix, with one unified λ so that every attention row sums to exactly 1 (DIFF's rows
    sum to $1-\lambda$):

    $$A = A_1 - \lambda A_2 + \lambda G,\qquad G = C A_{\text{src}},$$

    where $C$ averages over query rows. [third-party code] The only implementation found,
    ``jwliao1209/Differential-FT-Transformer`` ``src/models/layers.py`` (commit 5e94ec8, ``MultiheadDintAttention``,
    a bidirectional tabular model that cites the paper), computes exactly the ``integral="all"``,
    ``integral_source="A1"`` form: ``a3 = attn_weights[:, :, 0].mean(dim=2)[:, :, None]`` (the column
    mean of $A_1$ over the queries) and ``attn_weights = lam * a3 + a1 - lam * a2``. [recon, unverified]
    the causal average and the ``"A2"`` source:

    ``integral="all"`` (bidirectional) $G_{ij} = \frac1N\sum_{i'}A_{1,i'j}$ (every row is the column
    mean of $A_1$), ``"causal"`` $G_{ij} = \frac1{i+1}\sum_{i'\le i}A_{1,i'j}$ (running mean over earlier
    queries, keeps causality — how the paper's causal language models avoid future leakage is not
    known here); ``"auto"`` picks ``"causal"`` when the layer is causal. ``integral_source="A2"``
    integrates $A_2$ instead. Rows of $G$ sum to 1, so rows of $A$ sum to $1-\lambda+\lambda = 1$ (rows
    of fully masked queries excepted). Then as V1: $\mathrm{head} = (1-\lambda_{init})\,\mathrm{RMSNorm}(AV)$,
    $Y = [\mathrm{head}_i]W_o$ (the third-party code uses GroupNorm and no λ-init factor unless
    ``use_rms_norm``; not adopted).

    Since $GV = C(A_1V)$, the term costs one row average of $O_1 = A_1V$ (no $N\times N$ product).

    Parameters
    ----------
    x, params, num_heads, num_kv_heads
        As :func:`refattn.attention.differential.diff_attention_v1_forward` (same params keys).
    integral : {"auto", "causal", "all"}
    integral_source : {"A1", "A2"}
    **v1_config
        Every other keyword of ``diff_attention_v1_forward`` (``depth``, ``lambda_init``, masks,
        RoPE, pairing, ``subln*``, ``rescale``).

    Notes
    -----
    Backward: V1's with $O = O_1 - \lambda O_2 + \lambda C O_a$: $dO_a \mathrel{+}= \lambda C^\top G$
    ($C^\top$: a reverse cumulative sum of $G_i/(i+1)$ for ``"causal"``, the column mean for
    ``"all"``) and $d\lambda \mathrel{+}= \langle G, C O_a\rangle$.
    """
    check_choice(integral, "integral", ("auto", "causal", "all"))
    check_choice(integral_source, "integral_source", ("A1", "A2"))
    if "is_causal" in v1_config and v1_config["is_causal"] is not None and not isinstance(
            v1_config["is_causal"], (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool or None; got {type(v1_config['is_causal']).__name__}")
    causal = v1_config.get("is_causal")
    if causal is None:
        causal = v1_config.get("attn_mask") is None
    kind = ("causal" if causal else "all") if integral == "auto" else integral
    cfg = dict(depth=None, lambda_init=None, lambda_init_convention="unilm", attn_mask=None, is_causal=None,
               causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True, scale=None,
               pairing="adjacent", gqa_pairing="naive", subln="rms", subln_affine=True, subln_eps=1e-5,
               rescale=True)
    unknown = sorted(set(v1_config) - set(cfg))
    if unknown:
        raise TypeError(f"dint_attention_forward got unexpected keywords {unknown}; expected {sorted(cfg)}")
    cfg.update(v1_config)
    return v1_layer_forward(x, params, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                 integral=(kind, integral_source), **cfg)


def dint_attention_backward(dout, cache):
    """Gradient of :func:`dint_attention_forward` (V1's chain with the integral term, see its Notes)."""
    return v1_generic_backward(dout, cache)


def dint_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`dint_attention_forward`."""
    return dint_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_dint(rng, size, config=None):
    # with a caller's config, the V1 params follow it (subln, heads, ...) and it stays as given
    s = sample_v1(rng, size, config)
    if config is None:
        s.config["integral"] = str(rng.choice(["auto", "all"]))
        s.config["integral_source"] = str(rng.choice(["A1", "A2"]))
    return s


def _dint_cases() -> dict:
    def case(size):
        def build(rng, config=None):
            return _sample_dint(rng, size, config)
        build.__doc__ = f"dint_attention compare case: the V1 sampler at {size!r}, following the caller's config"
        return build
    return {"tiny": case("tiny"), "small": case("small")}


def _check_dint_rows_sum_to_one(rng):
    B, H, n, d = 2, 3, 5, 2
    q1, q2, k1, k2 = rng.standard_normal((4, B, H, n, d))
    lam = rng.standard_normal((B, H, 1))
    err = 0.0
    keep = np.tril(np.ones((n, n), bool))
    for kind, mask in (("causal", keep), ("all", None), ("all", keep)):
        for src in ("A1", "A2"):
            out, _ = expanded_core_forward(q1, k1, q2, k2, np.ones((B, H, n, 1)), lam, mask, 0.7, (kind, src))
            err = max(err, float(np.abs(out - 1.0).max()))
    assert err < 1e-13, f"DINT rows do not sum to 1 ({err})"
    return err


def _check_dint_lambda_zero_is_v1(rng):
    s, P, _ = v1_sample_lambda_zero(rng)
    a = dint_attention(**s.inputs, params=P, **s.config)
    b = diff_attention_v1_forward(**s.inputs, params=P, **s.config)[0]
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"DINT with lambda = 0 differs from V1 by {err}"
    return err


def _check_dint_causal(rng):
    s = _sample_dint(rng, "small")
    s.config["integral"] = "causal"
    x = s.inputs["x"]
    out = dint_attention(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] += 1.0
    err = float(np.abs(dint_attention(x2, s.params, **s.config)[:, :-1] - out[:, :-1]).max())
    assert err < 1e-13, f"future token leaks through the causal integral ({err})"
    return err


register(
    Mechanism(
        slug="dint_attention", family="2-differential", tier="T1",
        title="DINT: differential-integral attention (row-normalised)",
        paper="Cang, Liu, Zhang, Zhao, Shi, 'DINT Transformer', EMNLP 2025, arXiv 2501.17486",
        forward=dint_attention_forward, backward=dint_attention_backward, sample=_sample_dint,
        docs="differential.md#dint_attention",
        checks={"rows_sum_to_one": _check_dint_rows_sum_to_one, "lambda_zero_is_v1": _check_dint_lambda_zero_is_v1,
                "causal_no_leakage": _check_dint_causal},
        cases=_dint_cases(),
    ),
)
