r"""The Extractors (SHE, HE, WE, ME), drop-in replacements for self-attention — registered as **not implemented** (T3).

Z. Chen, "Attention Is Not All You Need Anymore", arXiv 2308.07661 (2023); a follow-up by the same
author, "Interpretation of the Transformer and Improvement of the Extractor", arXiv 2311.12678
(2023), revises one of the Extractors. No official code is public.

What the sources define
-----------------------
The abstract of arXiv 2308.07661 (the only part of the paper readable here) names a family of
drop-in replacements for the self-attention mechanism, the Extractors, with four examples: the
super high-performance Extractor (SHE), the higher-performance Extractor (HE), the worthwhile
Extractor (WE) and the minimalist Extractor (ME); the last three simplify SHE, need less
computation and memory than self-attention, and all have shorter critical paths. It gives no
formula. The follow-up's abstract says only that it improves "a type of the Extractor" without
new trainable parameters.

What is missing
---------------
The equations of all four Extractors. The one implementation found is a third-party Flax port of
SHE alone (a single file citing both papers, not the author's): per-position extraction matrices
$W^{ext}_s$ applied to $x_s$, a causal prefix sum scaled by $1/\sqrt t$, and an elementwise product
with $x_tW^{adj}$. It cannot be checked against the paper: whether the extraction weights are
indexed by absolute position $s$ (as the port does) or by the distance $t-s$, whether the
$1/\sqrt t$ factor belongs to SHE or to the follow-up's "improved" Extractor, and whether there are
biases or further terms are all undecided by the sources available; and HE, WE and ME are not
defined anywhere reachable. Implementing one reading of SHE, and inventing HE, WE and ME, would be
guesses, not the Extractors.
"""

from __future__ import annotations

from ...registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="extractors_she_he_we_me", family="1-softmax", tier="T3",
        title="The Extractors SHE / HE / WE / ME (not implemented: their equations are not in the available sources)",
        paper="Z. Chen, Attention Is Not All You Need Anymore, arXiv 2308.07661, 2023",
        docs="softmax/s8.md#extractors-she-he-we-me-not-implemented",
        notes="Not implemented: only the abstract of arXiv 2308.07661 (and of its follow-up arXiv 2311.12678) was "
              "readable and no official code is public. The abstract names the four Extractors (SHE, HE, WE, ME) but "
              "gives no equation for any of them. The only implementation found is a third-party Flax port of SHE "
              "alone (per-position extraction matrices, a causal prefix sum scaled by 1/sqrt(t), an elementwise "
              "product with x_t W_adj), which cannot be checked against the paper (absolute vs relative indexing of the "
              "extraction weights, whether the 1/sqrt(t) factor is SHE's or the follow-up's improvement, biases) and "
              "does not define HE, WE or ME.",
    ),
)
