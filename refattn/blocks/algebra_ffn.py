r"""Associative-algebra product FFN projection — registered as **not implemented** (T3).

The catalogue entry's only source is its seed abstract ([5-5] in the catalogue's abstracts): an
FFN whose dense block matrix product is replaced by "an associative-algebra construction that
replaces ordinary matrix multiplication with a sparser interaction table over the same weight
blocks", with quadratic arithmetic in the matrix dimension at a fixed physical block size,
optimal for its bilinear rank by the Alder–Strassen bound, "realized as row-typed rectangular
projections compatible with causal masking and KV-cached decoding"; two ~110M-parameter
decoder-only LMs (12.3B tokens) differ only in the FFN. No title, authors, arXiv id or code
could be found for it (searches of the stored web pages, documentation and code corpora for the
abstract's sentences and its terms — "associative-algebra product", "interaction table",
"row-typed rectangular projections", "Alder–Strassen" with "Transformer" — return nothing).

What is missing
---------------
The algebra itself: its structure constants (the interaction table $c_{ijk}$ of
$y_k = \sum_{i,j} c_{ijk} W_i x_j$), which the abstract never states, and which choice of algebra
reaches the Alder–Strassen bound here; how the hidden vector and the weight matrix are cut into
blocks and mapped to algebra elements ("row-typed rectangular projections" — which rows carry
which type, and how a rectangular $C\to F$ projection becomes a product in a square algebra);
where in the FFN the product replaces the matmul (up-projection, down-projection or both) and
whether anything else (normalisation, gating) changes. The catalogue's example, the group
algebra of $\mathbb Z_n$ (block-circulant $y_k = \sum_j W_{(k-j)\bmod n}x_j$), is a guess: it is
not sparser than the dense block product (it uses all $n^2$ block pairs) and has no relation to
the abstract's "row types", so implementing it would not be this paper's layer. Block-circulant
and other structured projections of that kind are covered by refattn's existing linear-layer
variants (`refattn.blocks.low_rank_linear`).
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="algebra_product_ffn", family="5-building-blocks", tier="T3",
        title="Associative-algebra product FFN projection (not implemented: the algebra is not defined in the "
              "available sources)",
        paper="Unidentified paper of the catalogue's seed abstract [5-5] (an associative-algebra product replacing "
              "the FFN's dense block matmul; two ~110M-parameter decoder-only LMs on 12.3B tokens); title, authors "
              "and arXiv id not found in the available sources",
        docs="blocks/b7.md#algebra_product_ffn",
        notes="Not implemented: the seed abstract is the only source (no title, authors, arXiv id or code could be "
              "found). It says the FFN's dense block product is replaced by an associative-algebra product with a "
              "sparser interaction table over the same weight blocks, optimal by the Alder-Strassen bound and realised "
              "as row-typed rectangular projections, but it does not give the algebra's structure constants (the "
              "interaction table), how activations and weights are split into blocks and mapped to algebra elements, "
              "what the row types are, or which FFN projections are replaced; the catalogue's block-circulant "
              "(group algebra of Z_n) example is a guess that is not sparser than the dense block product.",
    ),
)
