r"""Mechanisms with official code but no ``state_dict`` table, and why: :data:`UNMAPPED`.

:func:`refattn.interop.coverage.torch_coverage` reports each with its status (one of
:data:`UNMAPPED_STATUSES`), and :mod:`refattn.interop.torch` answers with the reason:

``"no weights"``
    the record has no trainable parameters (a mask, a merge rule, a core on already projected
    ``q, k, v``): ``params_from_state_dict(slug, {})`` returns ``{}`` and ``grads_to_state_dict``
    returns ``{}``; compare such a core with :func:`refattn.testing.compare_implementation`;
``"no PyTorch module"``
    the code refattn follows is JAX, TensorFlow, Theano, Lua Torch or MindSpore: refattn's params
    keep that code's names (a flax ``Dense`` ``kernel`` is already ``(in, out)``), but there is no
    PyTorch ``state_dict`` to read;
``"code not readable"``
    the code is named, but its repository could not be read when refattn implemented the mechanism,
    so no table can be checked against it;
``"reconstruction"``
    refattn implements the upstream's composition but builds its sub-networks itself (the upstream
    takes them from libraries refattn does not reproduce layer for layer), so no upstream
    ``state_dict`` corresponds to the record's parameters.

The ``torch_specs_*`` modules register further rows with :func:`add_unmapped` as they are written.
"""

from __future__ import annotations

__all__ = ["UNMAPPED", "UNMAPPED_STATUSES", "add_unmapped"]

UNMAPPED_STATUSES = ("no weights", "no PyTorch module", "code not readable", "reconstruction")

UNMAPPED: dict[str, tuple[str, str]] = {}
"""``{slug: (status, reason)}``, filled by :func:`add_unmapped`."""


def add_unmapped(slug: str, status: str, reason: str) -> None:
    """Say why ``slug`` has no ``state_dict`` table: ``status`` is one of :data:`UNMAPPED_STATUSES`
    and ``reason`` one sentence a user can act on (what the upstream is, what to do instead)."""
    if status not in UNMAPPED_STATUSES:
        raise ValueError(f"add_unmapped[{slug}]: status must be one of {UNMAPPED_STATUSES}; got {status!r}")
    if not isinstance(reason, str) or len(reason.split()) < 3:
        raise ValueError(f"add_unmapped[{slug}]: reason must be a sentence; got {reason!r}")
    if slug in UNMAPPED:
        raise ValueError(f"add_unmapped: {slug!r} is already listed ({UNMAPPED[slug][0]})")
    UNMAPPED[slug] = (status, reason)


_CORE = "the record is the parameter-free core on projected q, k, v"
for _slug, _why in {
    "sdpa": "softmax(q k^T * scale + mask) v has no parameters; torch's own function is "
            "torch.nn.functional.scaled_dot_product_attention",
    "attention_masks": "the masks are built from lengths and offsets, with no parameters",
    "rope": "rotary tables are computed from positions and a base, with no parameters",
    "online_softmax_flash_attention": f"{_CORE} (flash-attention's kernels take q, k, v)",
    "tree_attention_merge": "the merge of partial (output, log-sum-exp) pairs has no parameters",
    "tova_kv_eviction": "the eviction rule reads attention scores and keeps a cache; it has no parameters",
    "neural_attention_search_mask": "the search is over masks of the attention scores, which take no "
                                    "parameters in the record",
    "attention_guided_extraction_scoring": "the scoring reads attention maps a model has already computed",
    "differential_cross_attention": f"{_CORE} (two softmax maps and a learned lambda passed as input)",
    "linear_attention_katharopoulos": f"{_CORE}; fast-transformers' LinearAttention itself has no "
                                      "parameters (its AttentionLayer holds ordinary Linear projections)",
    "fastmax_polynomial_attention": f"{_CORE} (armingerami/fastmax's function takes q, k, v)",
    "mra_multiresolution_attention": f"{_CORE} (mlpen/mra-attention's kernel takes q, k, v)",
    "topk_attention": f"{_CORE}; top-k selection adds no parameters",
    "token_pooling": "the k-medoids pooling of tokens has no parameters",
}.items():
    add_unmapped(_slug, "no weights", _why)

for _slug, _why in {
    "additive_attention_bahdanau": "the authors' code (kelvinxu/arctic-captions) is Theano",
    "bidaf_attention_flow": "allenai/bi-att-flow is TensorFlow 0.x",
    "plga_power_law_attention": "burcgokden/Power-Law-Graph-Transformer is TensorFlow/Keras (its "
                                "Dense ``kernel`` weights are already (in, out))",
    "combiner_attention": "google-research combiner is JAX/flax (Dense ``kernel`` is already (in, out))",
    "wavelet_space_attention": "EvanZhuang/wavspa is JAX/flax (Dense ``kernel`` is already (in, out))",
    "vano_variational_autoencoding_operator": "PredictiveIntelligenceLab/VANO is JAX/flax (Dense "
                                              "``kernel`` is already (in, out))",
    "reformer_lsh_attention": "google/trax is JAX (trax weights are already (in, out))",
    "reversible_residual_block": "the Reformer's reversible layers are google/trax (JAX)",
    "routing_transformer_kmeans": "google-research routing_transformer is TensorFlow",
    "etc_global_local_attention": "google-research etcmodel is TensorFlow",
    "magnetic_laplacian_pe": "deepmind digraph_transformer is JAX/haiku",
    "pdeformer_graph_inr": "functoreality/pdeformer-2 is MindSpore",
    "high_order_attention_vqa": "idansc/HighOrderAtten is Lua Torch7",
}.items():
    add_unmapped(_slug, "no PyTorch module", _why)

add_unmapped("fno_vit_scattering_hybrid", "reconstruction",
             "upstream composes neuraloperator's FNO and Poseidon's scOT (a SwinV2 U-Net); refattn keeps that "
             "composition (p = F(v_s) + T([v_delta, F(v_s)])) with an FNO stack and a ViT of its own, whose "
             "parameters no upstream checkpoint holds")
