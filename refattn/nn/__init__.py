r"""Shared primitives with forward and hand-derived backward.

Softmax, linear, norms, activations, RoPE, convolution, pooling, grid sampling and Swin windows.
Every attention and operator module builds on these instead of re-deriving them inline. Each
module has validated ``xxx_forward``/``xxx_backward`` pairs and unvalidated helpers
(``linear_apply``, ``softmax_lse``, ``normalize_forward`` ...) for use inside other mechanisms
after they validated their own arguments.

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
activations
    Pointwise activations with hand-derived derivatives: GELU, SiLU, sigmoid, ELU+1, SwiGLU, ReLU
    (``elu_plus_one``, ``gelu``, ``sigmoid``, ``silu``, ``swiglu``).
conv
    N-d convolution and transposed convolution (PyTorch ``F.conv{1,2,3}d`` /
    ``F.conv_transpose{1,2,3}d``), with the padding, im2col and col2im helpers the other spatial
    primitives (pooling, unfold/fold) share (``conv``, ``conv_transpose``).
linear
    Affine (fully connected) layer $y = xW + b$ over the last axis, with a hand-derived backward
    (``linear``).
norms
    Layer, RMS, group and instance normalisation, sharing one normalisation core (``layer_norm``,
    ``rms_norm``, ``group_norm``, ``instance_norm``).
pooling
    N-d average, max and adaptive average pooling (PyTorch ``F.avg_pool{1,2,3}d``,
    ``F.max_pool{1,2,3}d``, ``F.adaptive_avg_pool{1,2,3}d``), with hand-derived backward passes
    (``adaptive_avg_pool``, ``avg_pool``, ``max_pool``).
rope
    Rotary position embedding (RoPE), both channel layouts, partial rotary, hand-derived backward
    (``rope``).
sampling
    Differentiable sampling: ``grid_sample`` (2-D bilinear / 3-D trilinear, nearest) and
    ``affine_grid``, in exact PyTorch ``F.grid_sample`` / ``F.affine_grid`` semantics, with
    gradients w.r.t (``affine_grid``, ``grid_sample``).
softmax
    Stable softmax, masked softmax, log-softmax and logsumexp, with hand-derived backwards
    (``log_softmax``, ``logsumexp``, ``softmax``).
windows
    Swin-style window helpers and ``F.unfold`` / ``F.fold`` (``fold``, ``unfold``,
    ``window_partition``, ``window_reverse``).
"""

from __future__ import annotations

from .activations import (  # noqa: F401
    elu_plus_one,
    elu_plus_one_backward,
    elu_plus_one_forward,
    elu_plus_one_grad,
    gelu,
    gelu_backward,
    gelu_forward,
    gelu_grad,
    relu,
    relu_grad,
    sigmoid,
    sigmoid_backward,
    sigmoid_forward,
    sigmoid_grad,
    silu,
    silu_backward,
    silu_forward,
    silu_grad,
    swiglu,
    swiglu_backward,
    swiglu_forward,
    swiglu_vjp,
)
from .conv import (  # noqa: F401
    PADDING_MODES,
    check_int_tuple,
    col2im,
    conv,
    conv_apply,
    conv_backward,
    conv_forward,
    conv_output_size,
    conv_padding,
    conv_transpose,
    conv_transpose_apply,
    conv_transpose_backward,
    conv_transpose_forward,
    conv_transpose_output_size,
    conv_transpose_vjp,
    conv_vjp,
    im2col,
    pad_nd,
    pad_nd_vjp,
)
from .linear import (  # noqa: F401
    check_linear_params,
    init_linear_prefixed,
    init_torch_default,
    linear,
    linear_apply,
    linear_backward,
    linear_forward,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    linear_vjp,
    merge_heads,
    split_heads,
)
from .norms import (  # noqa: F401
    group_norm,
    group_norm_backward,
    group_norm_forward,
    instance_norm,
    instance_norm_backward,
    instance_norm_forward,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    normalize_backward,
    normalize_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)
from .pooling import (  # noqa: F401
    adaptive_avg_pool,
    adaptive_avg_pool_apply,
    adaptive_avg_pool_backward,
    adaptive_avg_pool_forward,
    adaptive_avg_pool_vjp,
    adaptive_pool_matrix,
    avg_pool,
    avg_pool_apply,
    avg_pool_backward,
    avg_pool_forward,
    avg_pool_vjp,
    max_pool,
    max_pool_apply,
    max_pool_backward,
    max_pool_forward,
    max_pool_vjp,
    pool_output_size,
)
from .rope import (  # noqa: F401
    apply_rope,
    interleave_permutation,
    rope,
    rope_angles,
    rope_angles_vjp,
    rope_backward,
    rope_forward,
    rope_frequencies,
)
from .sampling import (  # noqa: F401
    affine_base_grid,
    affine_grid,
    affine_grid_apply,
    affine_grid_backward,
    affine_grid_forward,
    affine_grid_vjp,
    grid_coordinates,
    grid_sample,
    grid_sample_apply,
    grid_sample_backward,
    grid_sample_forward,
    grid_sample_vjp,
)
from .softmax import (  # noqa: F401
    apply_mask,
    log_softmax_backward,
    log_softmax_forward,
    logsumexp_backward,
    logsumexp_forward,
    softmax,
    softmax_backward,
    softmax_forward,
    softmax_lse,
    softmax_vjp,
)
from .windows import (  # noqa: F401
    cyclic_shift,
    cyclic_shift_vjp,
    fold,
    fold_apply,
    fold_backward,
    fold_forward,
    relative_position_bias,
    relative_position_bias_vjp,
    relative_position_index,
    shifted_window_mask,
    shifted_window_region_ids,
    swinv2_relative_coords_table,
    unfold,
    unfold_apply,
    unfold_backward,
    unfold_forward,
    window_partition,
    window_partition_apply,
    window_partition_backward,
    window_partition_forward,
    window_reverse,
    window_reverse_apply,
    window_reverse_backward,
    window_reverse_forward,
)

__all__ = [
    "elu_plus_one", "elu_plus_one_backward", "elu_plus_one_forward", "elu_plus_one_grad", "gelu", "gelu_backward",
    "gelu_forward", "gelu_grad", "relu", "relu_grad", "sigmoid", "sigmoid_backward", "sigmoid_forward", "sigmoid_grad",
    "silu", "silu_backward", "silu_forward", "silu_grad", "swiglu", "swiglu_backward", "swiglu_forward", "swiglu_vjp",
    "PADDING_MODES", "check_int_tuple", "col2im", "conv", "conv_apply", "conv_backward", "conv_forward",
    "conv_output_size", "conv_padding", "conv_transpose", "conv_transpose_apply", "conv_transpose_backward",
    "conv_transpose_forward", "conv_transpose_output_size", "conv_transpose_vjp", "conv_vjp", "im2col", "pad_nd",
    "pad_nd_vjp", "check_linear_params", "init_linear_prefixed", "init_torch_default", "linear", "linear_apply",
    "linear_backward", "linear_forward", "linear_prefixed", "linear_prefixed_spec", "linear_prefixed_vjp", "linear_vjp",
    "merge_heads", "split_heads", "group_norm", "group_norm_backward", "group_norm_forward", "instance_norm",
    "instance_norm_backward", "instance_norm_forward", "layer_norm", "layer_norm_backward", "layer_norm_forward",
    "normalize_backward", "normalize_forward", "rms_norm", "rms_norm_backward", "rms_norm_forward", "adaptive_avg_pool",
    "adaptive_avg_pool_apply", "adaptive_avg_pool_backward", "adaptive_avg_pool_forward", "adaptive_avg_pool_vjp",
    "adaptive_pool_matrix", "avg_pool", "avg_pool_apply", "avg_pool_backward", "avg_pool_forward", "avg_pool_vjp",
    "max_pool", "max_pool_apply", "max_pool_backward", "max_pool_forward", "max_pool_vjp", "pool_output_size",
    "apply_rope", "interleave_permutation", "rope", "rope_angles", "rope_angles_vjp", "rope_backward", "rope_forward",
    "rope_frequencies", "affine_base_grid", "affine_grid", "affine_grid_apply", "affine_grid_backward",
    "affine_grid_forward", "affine_grid_vjp", "grid_coordinates", "grid_sample", "grid_sample_apply",
    "grid_sample_backward", "grid_sample_forward", "grid_sample_vjp", "apply_mask", "log_softmax_backward",
    "log_softmax_forward", "logsumexp_backward", "logsumexp_forward", "softmax", "softmax_backward", "softmax_forward",
    "softmax_lse", "softmax_vjp", "cyclic_shift", "cyclic_shift_vjp", "fold", "fold_apply", "fold_backward",
    "fold_forward", "relative_position_bias", "relative_position_bias_vjp", "relative_position_index",
    "shifted_window_mask", "shifted_window_region_ids", "swinv2_relative_coords_table", "unfold", "unfold_apply",
    "unfold_backward", "unfold_forward", "window_partition", "window_partition_apply", "window_partition_backward",
    "window_partition_forward", "window_reverse", "window_reverse_apply", "window_reverse_backward",
    "window_reverse_forward",
]
