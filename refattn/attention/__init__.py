"""Attention mechanisms, one package per catalogue family, one module per mechanism.

* `refattn.attention.softmax`: family 1, softmax attention and its exact memory-efficient forms
  (SDPA, masks, MHA/GQA, additive biases, ALiBi, relative positions, flash / Rabe–Staats / tree).
* `refattn.attention.differential`: family 2, differential attention (DIFF V1/V2, DiffCLIP, GDA,
  DEX, DiffLoRA, DINT …) and its relatives (shaped, momentum, PCT, ReflexSplit, MALA, MTA).
* `refattn.attention.linear`: family 4, linear, kernel, sparse, low-rank and set attention.

Operator-learning attention (family 3) lives in `refattn.operators`; the building blocks
(family 5) in `refattn.blocks`, on the primitives of `refattn.nn`.
"""
