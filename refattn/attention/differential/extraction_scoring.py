r"""Attention-guided extraction scoring (SAGE): differential attention relevance of context tokens.

Wang, Chen, Vitagliano, Russo, Chen, Cafarella, Madden, Liu, "SAGE: Selective Attention-Guided
Extraction for Token-Efficient Document Indexing", 2026, arXiv 2604.15583. Official code:
Tranway1/AttentiveTrim ``system/data_reader.py`` (``compute_chunk_attention_with_cache``,
``process_document_question``, ``compute_differential_attention``, ``find_farest_questions``) and
``system/unit_window.py`` (``apply_budget_to_attention``) @ 5ff7f7bf230fe8eac24ed285a0bb39a3ef10dcda.

**No backward: an inference utility.** A small local LLM prefills ``"Context: " + chunk +
"\nQuestion: q\nAnswer:"`` once; its attention probabilities become a relevance score per context
token; a differential score subtracts the scores of a reference question; windows of top scores
are kept under a token budget. Nothing here is trained, and the selection is discrete, so the
record is registered with ``differentiable=False``.

Scores (``attention_guided_extraction_scoring_forward``)
--------------------------------------------------------
With the attention maps $A^{(l,h)}$ of every layer $l$ and head $h$ restricted to the $N_q$
question-token rows (queries at positions $\ge$ the question start) and the $P$ prefix columns
(the ``"Context: "`` marker and the chunk), the score of prefix position $j$ is

$$s_j = \frac1{N_q}\sum_{l,h}\sum_{i=1}^{N_q} A^{(l,h)}_{ij},$$

and the first ``context_start`` positions (the marker) are dropped. The differential score
subtracts a reference question's scores on the same chunk,

$$\Delta_j = s_j(q) - s_j(q_{\text{ref}}),$$

the reference being the document's *baseline* question (a fixed neutral question, upstream
``"{doc}_baseline"``) or the *farthest* question (`farthest_question_index`: the question of the
same document whose embedding has the lowest cosine similarity). ``reference=None`` gives the raw
scores (upstream ``raw``).

Documents and selection
-----------------------
* `assemble_document_scores`: a document longer than the model's chunk length is split into
  chunks, each prefilled separately; chunk $c$'s scores are scaled by $n_c / \max_c n_c$
  (chunk-length normalisation) and concatenated in document order.
* `select_budget_windows`: windows of $w = \max(1, \lfloor 0.02\,M\rfloor)$ tokens; for a budget
  fraction $\beta \le 0.02$ the single window of largest sum (width $\max(1,\lfloor\beta M\rfloor)$);
  otherwise windows in descending order of mean score (stable for ties) are added greedily,
  merged with every selected range they overlap, until $\max(10, \lfloor\beta M\rfloor)$ tokens; a
  non-overlapping window that would overflow is truncated to the remaining budget. Ranges are
  returned in document order.

Measured agreement with upstream (float64): upstream's ``apply_budget_to_attention``,
``compute_differential_attention`` and ``find_farest_questions`` were run unchanged (with a stub
tokenizer, in a scratch script) on random scores for 300 (length, budget) pairs and 40 embedding
sets: identical ranges, differences and indices (0 mismatches, differences bit-equal); the torch
score lines of ``compute_chunk_attention_with_cache`` (no-cache path) transcribed on random
attention tensors: max abs error 5.6e-16 (summation order; see ``docs/differential/t3.md#attention_guided_extraction_scoring``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_float, check_choice, check_int, compute_dtype
from ...registry import Mechanism, Sample, register

__all__ = [
    "attention_guided_extraction_scoring_forward",
    "attention_guided_extraction_scoring",
    "chunk_attention_scores",
    "assemble_document_scores",
    "farthest_question_index",
    "select_budget_windows",
]


def chunk_attention_scores(attn, *, context_start: int = 0) -> np.ndarray:
    r"""$s_j = \frac1{N_q}\sum_{l,h,i} A^{(l,h)}_{ij}$ over a chunk's prefix, marker positions dropped.

    ``attn``: ``(..., L, H, N_q, P)`` attention probabilities of the question-token rows over the
    prefix columns; returns ``(..., P - context_start)``.
    """
    attn = as_float(attn, "attn", min_ndim=4)
    context_start = check_int(context_start, "context_start", minimum=0)
    if context_start >= attn.shape[-1]:
        raise ValueError(f"context_start must be below the prefix length P={attn.shape[-1]}; got {context_start}")
    n_q = attn.shape[-2]
    if n_q == 0:
        raise ValueError("attn must have at least one question row (axis -2); got 0")
    return attn.sum(axis=(-4, -3, -2))[..., context_start:] / n_q


def attention_guided_extraction_scoring_forward(attn, attn_ref=None, *, context_start: int = 0,
                                                reference: str | None = "baseline"):
    r"""Differential relevance $\Delta_j = s_j(q) - s_j(q_{\text{ref}})$ of every context token.

    Parameters
    ----------
    attn : array (B, L, H, N_q, P)
        Attention probabilities of the question's tokens (rows) over the prefix (the
        ``"Context: "`` marker and the chunk), every layer and head.
    attn_ref : array (B, L, H, N_q', P), optional
        The same for the reference question (baseline or farthest question); required unless
        ``reference=None``. ``N_q'`` may differ from ``N_q``.
    context_start : int
        Marker tokens before the chunk, dropped from the scores.
    reference : {"baseline", "farthest"} or None
        Which reference ``attn_ref`` holds (documentation only: the arithmetic is the same), or
        None for the raw scores.

    Returns
    -------
    scores (B, P - context_start), cache (empty: no backward, inference utility)
    """
    if reference is not None:
        check_choice(reference, "reference", ("baseline", "farthest"))
    attn = as_float(attn, "attn", ndim=5)
    if reference is None:
        if attn_ref is not None:
            raise ValueError("attn_ref must be None when reference=None (raw scores)")
        return chunk_attention_scores(attn, context_start=context_start), {}
    if attn_ref is None:
        raise ValueError(f"attn_ref is required for reference={reference!r}; pass reference=None for raw scores")
    attn_ref = as_float(attn_ref, "attn_ref", ndim=5)
    if attn_ref.shape[:3] != attn.shape[:3] or attn_ref.shape[-1] != attn.shape[-1]:
        raise ValueError(f"attn_ref must have shape (B, L, H, N_q', P) = {attn.shape[:3] + ('N_q_ref', attn.shape[-1])}; "
                         f"got {attn_ref.shape}")
    dt = compute_dtype(attn, attn_ref)
    s = chunk_attention_scores(attn.astype(dt, copy=False), context_start=context_start)
    s_ref = chunk_attention_scores(attn_ref.astype(dt, copy=False), context_start=context_start)
    return s - s_ref, {}


def attention_guided_extraction_scoring(attn, attn_ref=None, **config) -> np.ndarray:
    """Convenience wrapper: the scores of :func:`attention_guided_extraction_scoring_forward`."""
    return attention_guided_extraction_scoring_forward(attn, attn_ref, **config)[0]


def assemble_document_scores(chunk_scores) -> np.ndarray:
    r"""Concatenate per-chunk scores with chunk-length normalisation $n_c/\max_c n_c$ (upstream
    ``process_document_question``). ``chunk_scores``: a non-empty sequence of 1-D arrays."""
    if isinstance(chunk_scores, np.ndarray) or not isinstance(chunk_scores, (list, tuple)) or not chunk_scores:
        raise TypeError("chunk_scores must be a non-empty list or tuple of 1-D arrays")
    chunks = [as_float(c, f"chunk_scores[{i}]", ndim=1) for i, c in enumerate(chunk_scores)]
    n_max = max(len(c) for c in chunks)
    if n_max == 0:
        raise ValueError("chunk_scores are all empty")
    return np.concatenate([c * (len(c) / n_max) for c in chunks])


def farthest_question_index(embeddings) -> np.ndarray:
    r"""For each question, the other question of lowest cosine similarity (upstream
    ``find_farest_questions``: self-similarity set to 1, first minimum). ``embeddings (Q, E)``, Q >= 2."""
    e = as_float(embeddings, "embeddings", ndim=2)
    if e.shape[0] < 2:
        raise ValueError(f"embeddings must hold at least 2 questions; got {e.shape[0]}")
    norm = np.linalg.norm(e, axis=1, keepdims=True)
    u = e / np.where(norm == 0, 1.0, norm)
    sim = u @ u.T
    np.fill_diagonal(sim, 1.0)
    return np.argmin(sim, axis=1)


def select_budget_windows(scores, budget: float, *, window_fraction: float = 0.02,
                          min_budget_tokens: int = 10) -> list[tuple[int, int]]:
    r"""Token ranges ``[(start, end), ...]`` (document order) kept under a budget fraction
    (upstream ``apply_budget_to_attention``; see the module docstring).

    ``window_fraction`` (0.02) is the window width and the single-window threshold as a fraction of
    the length; ``min_budget_tokens`` (10) the least budget of the multi-window mode.
    """
    s = as_float(scores, "scores", ndim=1)
    if isinstance(budget, (bool, np.bool_)) or not isinstance(budget, (int, float, np.number)) or not 0 < budget <= 1:
        raise ValueError(f"budget must be a fraction in (0, 1]; got {budget!r}")
    if not 0 < window_fraction <= 1:
        raise ValueError(f"window_fraction must be in (0, 1]; got {window_fraction!r}")
    min_budget_tokens = check_int(min_budget_tokens, "min_budget_tokens", minimum=1)
    m = s.shape[0]
    if m == 0:
        return []
    if budget >= window_fraction:
        w, total = max(1, int(m * window_fraction)), max(min_budget_tokens, int(m * budget))
    else:
        w = total = max(1, int(m * budget))
    if w >= m:
        return [(0, m)]
    # np.sum per window (not a running sum): ties and near-ties order exactly as upstream's loop.
    sums = np.array([np.sum(s[i:i + w]) for i in range(m - w + 1)])
    if budget <= window_fraction:
        start = int(np.argmax(sums))
        return [(start, start + w)]
    order = np.argsort(-(sums / w), kind="stable")
    ranges: list[tuple[int, int]] = []
    used = 0
    for start in order:
        if used >= total:
            break
        a, b = int(start), int(start) + w
        hit = [r for r in ranges if a < r[1] and b > r[0]]
        if hit:
            for r in hit:
                ranges.remove(r)
                used -= r[1] - r[0]
            merged = (min([a] + [r[0] for r in hit]), max([b] + [r[1] for r in hit]))
            ranges.append(merged)
            used += merged[1] - merged[0]
        elif used + w > total:
            if total - used > 0:
                ranges.append((a, a + total - used))
                used = total
            break
        else:
            ranges.append((a, b))
            used += w
    return sorted(ranges)


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _attn(rng, shape):
    # Random attention rows: positive, summing to <= 1 over the prefix (the rest goes to the question).
    p = rng.dirichlet(np.ones(shape[-1] + 2), size=shape[:-1])[..., : shape[-1]]
    return p


def _sample(rng, size):
    if size == "tiny":
        b, layers, h, nq, nr, p = 2, 2, 2, 3, 2, 5
    else:
        b, layers, h, nq, nr, p = 2, 3, 2, int(rng.integers(3, 6)), int(rng.integers(2, 5)), int(rng.integers(8, 14))
    return Sample(inputs={"attn": _attn(rng, (b, layers, h, nq, p)), "attn_ref": _attn(rng, (b, layers, h, nr, p))},
                  config={"context_start": int(rng.integers(0, 3)), "reference": str(rng.choice(["baseline", "farthest"]))})


def _reference(attn, attn_ref=None, *, context_start=0, reference="baseline"):
    # Upstream's loop: accumulate over layers the (heads, question rows) sums, divide by N_q, drop the marker.
    def score(a):
        out = np.zeros(a.shape[:1] + a.shape[-1:])
        for layer in range(a.shape[1]):
            out += a[:, layer].sum(axis=(1, 2))
        return (out / a.shape[-2])[:, context_start:]
    return score(attn) if reference is None else score(attn) - score(attn_ref)


def _check_uniform_reference_cancels(rng):
    # A question whose attention equals the reference's (up to its number of rows) scores exactly 0:
    # the differential removes the question-independent ("structural") part.
    a = _attn(rng, (2, 3, 2, 4, 9))
    rows = a.mean(axis=-2, keepdims=True)
    err = float(np.abs(attention_guided_extraction_scoring(np.repeat(rows, 4, axis=-2), np.repeat(rows, 2, axis=-2))).max())
    assert err < 1e-13, f"identical per-row attention does not cancel ({err:.2e})"
    return err


def _check_scores_sum(rng):
    # Rows of softmax probabilities: raw scores over the whole prefix sum to L * H * (row mass).
    a = rng.dirichlet(np.ones(7), size=(2, 3, 2, 4))
    s = attention_guided_extraction_scoring(a, reference=None)
    err = float(np.abs(s.sum(axis=-1) - 3 * 2).max())
    assert err < 1e-12, f"raw scores do not sum to layers x heads ({err:.2e})"
    return err


def _check_selection_budget(rng):
    # Multi-window mode: document-ordered, disjoint ranges totalling at most the budget, and the best
    # window (largest mean) is inside the selection.
    err = 0.0
    for _ in range(20):
        m = int(rng.integers(60, 400))
        s = rng.standard_normal(m)
        beta = float(rng.uniform(0.03, 0.5))
        rs = select_budget_windows(s, beta)
        total = max(10, int(m * beta))
        used = sum(b - a for a, b in rs)
        assert used <= total and all(rs[i][1] <= rs[i + 1][0] for i in range(len(rs) - 1)), (rs, total)
        w = max(1, int(m * 0.02))
        best = int(np.argmax(np.convolve(s, np.ones(w), mode="valid")))
        assert any(a <= best and best + w <= b for a, b in rs), "best window not selected"
    return err


register(
    Mechanism(
        slug="attention_guided_extraction_scoring", family="2-differential", tier="T3",
        title="Differential attention scoring for context reduction (training-free)",
        paper="Wang, Chen, Vitagliano, Russo, Chen, Cafarella, Madden, Liu, 'SAGE: Selective Attention-Guided "
              "Extraction for Token-Efficient Document Indexing', 2026, arXiv 2604.15583",
        official_code="Tranway1/AttentiveTrim",
        forward=attention_guided_extraction_scoring_forward, backward=None, differentiable=False,
        sample=_sample, reference=_reference, docs="differential/t3.md#attention_guided_extraction_scoring",
        notes="no backward: inference utility (training-free scoring of context tokens from a frozen LLM's "
              "attention, followed by a discrete top-window selection under a token budget; nothing is trained).",
        checks={"identical_reference_cancels": _check_uniform_reference_cancels, "raw_scores_sum": _check_scores_sum,
                "selection_budget": _check_selection_budget},
    ),
)
