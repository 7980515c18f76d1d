r"""LTM-Transformer learnable token merging — registered as **not implemented** (T3).

Wang, Yang, "Efficient Visual Transformer by Learnable Token Merging", IEEE TPAMI 2025 (early
access), arXiv 2407.15219. Code: Statistical-Deep-Learning/LTM @ 395b959813516b9858c35048827b52bab6ab85dd.

What the sources define
-----------------------
The abstract: an LTM-Transformer block merges tokens with a merging mask produced by a *mask
module*, whose architecture is designed to reduce a separable variational upper bound of the
information-bottleneck (IB) loss; the block replaces the transformer blocks of MobileViT,
EfficientViT, ViT and Swin. The catalogue's reading is $X' = MX$, $M\in\mathbb R^{N'\times N}$.

The repository is a fork of timm that holds only the training side:
``timm/loss/cross_entropy.py`` (``LabelSmoothingCrossEntropy_IB.get_IB_Loss``: the bound
$\sum_{a,b} q_{out}(b)\,q_{in}(a)\log q_{in}(a) - \sum_{b,y} q_{out}(b)\,[y]\log Q_{b,y}$ from soft
k-means cluster scores of the input and of the features) and ``train.py`` (faiss k-means of the
features each epoch, the cluster scores and the matrix $Q$). It contains no LTM block and no mask
module: the README's ``--model ltm_mobilevit_s`` is not registered anywhere in the code
(``timm/models/mobilevit.py`` is timm's unchanged MobileViT).

What is missing
---------------
The mask module itself — its inputs, layers and parameters, how the merging matrix $M$ is
normalised, and how the number of merged tokens $N'$ follows from ``--compression-ratio`` — is
defined only in the body of the paper, which was not available here (the stored copies hold its
abstract). A merge $X' = MX$ with an invented mask module would be a guess, not LTM, so no
forward is registered; the record's ``notes`` say this.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="learnable_token_merging_ltm", family="5-building-blocks", tier="T3",
        title="LTM-Transformer learnable token merging (not implemented: mask module undefined in the sources)",
        paper="Wang, Yang, Efficient Visual Transformer by Learnable Token Merging, IEEE TPAMI 2025, arXiv 2407.15219",
        docs="blocks/vision-token-mixers.md#learnable-token-merging-ltm",
        notes="Not implemented: the mask module that produces the token-merging matrix M is not defined in any "
              "source available here. Statistical-Deep-Learning/LTM@395b959 holds only the training side (the "
              "variational IB bound LabelSmoothingCrossEntropy_IB in timm/loss/cross_entropy.py and the k-means "
              "cluster scores in train.py) and no LTM block or mask module (its README's ltm_mobilevit_s model is "
              "not in the code); the paper (arXiv 2407.15219) was available only as its abstract, which does not "
              "give the mask module's inputs, layers, the normalisation of M, or how the number of merged tokens "
              "follows from the compression ratio.",
    ),
)
