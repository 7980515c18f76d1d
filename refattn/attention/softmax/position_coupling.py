r"""Position coupling: task-aligned tokens share one position ID of a learned absolute embedding.

Paper: Cho, Cha, Awasthi, Bhojanapalli, Gupta, Yun, "Position Coupling: Improving Length
Generalization of Arithmetic Transformers Using Task Structure", NeurIPS 2024, arXiv 2405.20671.
Upstream: HanseulJo/position-coupling @b9cad9476b1044a4232b2410ccfb7c6f758b6b36 —
``src/data/addition.py`` (``AdditionDatasetWithCoupledPositions.__getitem__``: the ID assignment and
its random start), ``src/tokenization/tokenization.py`` (``tokenize_for_decoder``: the IDs placed
after the BOS token, 0 elsewhere) and ``src/model/modeling/custom_gpt2.py`` (``abs_learned``:
``hidden_states = wte(input_ids) + wpe(position_ids)``).

The coupled IDs (a data-side rule, integers)
--------------------------------------------
For the decoder sequence ``a + b = c`` of an addition (digits of $a$, ``+``, digits of $b$, ``=``,
digits of the answer $c$), every digit of significance $s$ (0 = units), in $a$, $b$ and $c$ alike,
gets the ID $\text{start} + 1 + s$; ``+`` gets $\text{start}$; ``=`` gets $\text{start}$ when the
answer is written reversed (least significant digit first, ``reverse_output=True``, upstream's
``addition_coupled`` config) and $\text{start} + |c| + 1$ otherwise. ``reverse_input`` says whether
the operands are written least-significant first. `coupled_addition_position_ids` returns exactly
upstream's ``input_positions + label_positions`` (checked against the upstream dataset class, see
the docs). During training the start is random, $\text{start}\sim\mathcal U\{1, \dots, P_{\max} - |c| - 1 + [\texttt{reverse\_output}]\}$
(`sample_coupling_start`, upstream's ``torch.randint(1, max_position - len(labels) + r)``), so all IDs
stay in $[1, P_{\max}]$; evaluation uses ``start = 1``. `pad_position_ids` lays a batch out as
``tokenize_for_decoder`` does (ID 0 at the BOS token, the padding and the EOS).

The layer (differentiable): ``position_coupling_embed``
------------------------------------------------------
For token embeddings $x$ ``(B, N, D)`` (upstream ``wte(input_ids)``), the table $W$ =
``wpe.weight`` ``(P, D)`` and the integer IDs $\pi$ ``(B, N)`` (or ``(N,)``, shared by the batch):

$$y_{b,n} = x_{b,n} + W_{\pi_{b,n}}.$$

Backward: $dx = dy$; $dW_p = \sum_{(b,n):\,\pi_{b,n} = p} dy_{b,n}$ — a scatter-add, so coupled tokens (equal
significance) sum into the same row. The IDs are a fixed integer selection (no gradient).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "coupled_addition_position_ids",
    "coupling_start_bounds",
    "sample_coupling_start",
    "pad_position_ids",
    "position_coupling_param_spec",
    "init_position_coupling_params",
    "position_coupling_embed_forward",
    "position_coupling_embed_backward",
    "position_coupling_embed",
]


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return bool(value)


def coupled_addition_position_ids(len_a: int, len_b: int, len_answer: int, *, start: int = 1,
                                  reverse_input: bool = False, reverse_output: bool = False) -> np.ndarray:
    """Coupled IDs ``(len_a + len_b + len_answer + 2,)`` of the tokens ``a + b = c`` (module docstring).

    ``len_*`` count digit tokens (padding digits included: upstream's ``padding=True`` gives
    ``len_a = len_b = max`` and ``len_answer = max + 1``).
    """
    la, lb, lc = check_size(len_a, "len_a"), check_size(len_b, "len_b"), check_size(len_answer, "len_answer")
    start = check_size(start, "start", 0)
    rin, rout = _check_bool(reverse_input, "reverse_input"), _check_bool(reverse_output, "reverse_output")

    def digits(length, reverse):
        sig = np.arange(length) if reverse else np.arange(length)[::-1]  # significance of each written digit
        return start + 1 + sig

    eq = start if rout else start + lc + 1
    return np.concatenate([digits(la, rin), [start], digits(lb, rin), [eq], digits(lc, rout)]).astype(np.int64)


def coupling_start_bounds(max_position: int, len_answer: int, *, reverse_output: bool = False) -> tuple:
    """Inclusive range ``(1, high)`` of the random training start (upstream's ``randint`` bounds)."""
    max_position, len_answer = check_size(max_position, "max_position"), check_size(len_answer, "len_answer")
    high = max_position - len_answer - 1 + (1 if _check_bool(reverse_output, "reverse_output") else 0)
    if high < 1:
        raise ValueError(f"max_position={max_position} is too small for an answer of {len_answer} digits "
                         f"(need max_position >= {len_answer + 2 - int(bool(reverse_output))})")
    return 1, high


def sample_coupling_start(rng, max_position: int, len_answer: int, *, reverse_output: bool = False) -> int:
    """A uniform random start in `coupling_start_bounds` (the training-time random offset)."""
    lo, hi = coupling_start_bounds(max_position, len_answer, reverse_output=reverse_output)
    return int(rng.integers(lo, hi + 1))


def pad_position_ids(position_lists, total_length: int, *, offset: int = 1) -> np.ndarray:
    """Batch layout ``(B, total_length)`` int64: list ``b`` at columns ``offset:``, 0 elsewhere (BOS, EOS, padding)."""
    total_length, offset = check_size(total_length, "total_length"), check_size(offset, "offset", 0)
    out = np.zeros((len(position_lists), total_length), dtype=np.int64)
    for b, pos in enumerate(position_lists):
        pos = np.asarray(pos)
        if pos.ndim != 1 or pos.dtype.kind not in "iu":
            raise TypeError(f"position_lists[{b}] must be a 1-D integer sequence; got {pos.dtype} {pos.shape}")
        if offset + len(pos) > total_length:
            raise ValueError(f"position_lists[{b}] has {len(pos)} IDs; with offset {offset} they need "
                             f"total_length >= {offset + len(pos)}, got {total_length}")
        out[b, offset:offset + len(pos)] = pos
    return out


def position_coupling_param_spec(num_positions: int, d_model: int):
    """``(spec, optional)``: the learned absolute table ``wpe.weight (P, D)`` (GPT-2's name)."""
    return {"wpe.weight": (check_size(num_positions, "num_positions"), check_size(d_model, "d_model"))}, ()


def init_position_coupling_params(rng, num_positions: int, d_model: int) -> dict:
    """GPT-2's initialisation of ``wpe``: $\\mathcal N(0, 0.02^2)$."""
    spec, _ = position_coupling_param_spec(num_positions, d_model)
    return {"wpe.weight": 0.02 * rng.standard_normal(spec["wpe.weight"])}


def _validate_ids(position_ids, b, n, num_positions):
    pos = np.asarray(position_ids)
    if pos.dtype.kind not in "iu":
        raise TypeError(f"position_ids must be an integer array; got dtype {pos.dtype}")
    if pos.shape not in ((n,), (b, n)):
        raise ValueError(f"position_ids must have shape (N,) = ({n},) or (B, N) = ({b}, {n}); got {pos.shape}")
    if pos.size and (pos.min() < 0 or pos.max() >= num_positions):
        raise ValueError(f"position_ids must lie in [0, {num_positions}) (rows of wpe.weight); "
                         f"got range [{pos.min()}, {pos.max()}]")
    return np.broadcast_to(pos, (b, n)).astype(np.int64)


def position_coupling_embed_forward(x, params, *, position_ids):
    r"""Token embeddings plus the learned absolute embedding at the coupled IDs: $y = x + W_{\pi}$.

    Parameters
    ----------
    x : array (B, N, D)
        Token embeddings (upstream ``wte(input_ids)``).
    params : dict
        ``wpe.weight`` ``(P, D)``.
    position_ids : int array (N,) or (B, N)
        The coupled IDs (`coupled_addition_position_ids`, `pad_position_ids`), in ``[0, P)``; a fixed
        selection.

    Returns
    -------
    y, cache
        ``y`` of shape (B, N, D).
    """
    x = as_float(x, "x", ndim=3)
    if not isinstance(params, dict) or "wpe.weight" not in params:
        raise TypeError("params must be a dict with 'wpe.weight' of shape (num_positions, D)")
    table = as_float(params["wpe.weight"], "wpe.weight", ndim=2)
    b, n, d = x.shape
    if table.shape[1] != d:  # P is read off axis 0: state D only (an embedding table is (num, dim) in torch too)
        raise ValueError(f"wpe.weight must have shape (num_positions, D={d}) (an embedding table, laid out as "
                         f"PyTorch's nn.Embedding.weight; D is x's last axis); got {table.shape}")
    p = check_params(params, position_coupling_param_spec(table.shape[0], d)[0], where="position_coupling")
    pos = _validate_ids(position_ids, b, n, table.shape[0])
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    y = x + p["wpe.weight"][pos]
    return y, {"pos": pos, "table_shape": table.shape, "shape": y.shape, "dt": dt}


def position_coupling_embed_backward(dout, cache):
    """Gradient of :func:`position_coupling_embed_forward`: ``x`` (identity) and ``wpe.weight`` (scatter-add)."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    dw = np.zeros(cache["table_shape"], dtype=cache["dt"])
    np.add.at(dw, cache["pos"].reshape(-1), g.reshape(-1, g.shape[-1]))
    return {"x": g.copy(), "wpe.weight": dw}


def position_coupling_embed(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`position_coupling_embed_forward`."""
    return position_coupling_embed_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        la, lb, d, max_pos = int(rng.integers(1, 3)), int(rng.integers(1, 3)), 2, 6
    else:
        la, lb, d, max_pos = int(rng.integers(2, 5)), int(rng.integers(2, 5)), 4, 12
    lc = max(la, lb) + 1
    rin, rout = bool(rng.random() < 0.5), bool(rng.random() < 0.7)
    lists = [coupled_addition_position_ids(la, lb, lc, start=sample_coupling_start(rng, max_pos, lc, reverse_output=rout),
                                           reverse_input=rin, reverse_output=rout) for _ in range(2)]
    n = la + lb + lc + 3                      # BOS + the tokens; the IDs sit after the BOS (ID 0), as upstream
    pos = pad_position_ids(lists, n)
    x = rng.standard_normal((2, n, d))
    p = {"wpe.weight": rng.standard_normal((max_pos + 1, d))}
    return Sample(inputs={"x": x}, params=p, config={"position_ids": pos})


def _reference(x, params, *, position_ids):
    # Token by token: add the table row of its ID.
    out = np.array(x, dtype=float)
    pos = np.broadcast_to(position_ids, x.shape[:2])
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            out[b, t] += params["wpe.weight"][pos[b, t]]
    return out


def _ids_from_significance(a: str, b: str, c: str, start, rin, rout):
    # Brute force from the written strings: each digit's significance from its place in the number.
    ids = []
    for s, rev in ((a, rin), (None, None), (b, rin), ("=", None), (c, rout)):
        if s is None:
            ids.append(start)
        elif s == "=":
            ids.append(start if rout else start + len(c) + 1)
        else:
            for i in range(len(s)):
                sig = i if rev else len(s) - 1 - i
                ids.append(start + 1 + sig)
    return np.array(ids)


def _check_ids_equal_significance(rng):
    # Coupled IDs = start + 1 + significance for every digit of a, b and the answer (reversed answers and
    # the other three layouts), '+' at start; random starts stay in [1, max_position].
    worst = 0
    for _ in range(20):
        a, b = int(rng.integers(0, 10 ** int(rng.integers(1, 6)))), int(rng.integers(0, 10 ** int(rng.integers(1, 6))))
        c = str(a + b)
        rin, rout = bool(rng.random() < 0.5), bool(rng.random() < 0.5)
        sa, sb, sc = str(a)[::-1] if rin else str(a), str(b)[::-1] if rin else str(b), c[::-1] if rout else c
        start = sample_coupling_start(rng, 16, len(c), reverse_output=rout)
        got = coupled_addition_position_ids(len(sa), len(sb), len(sc), start=start, reverse_input=rin,
                                            reverse_output=rout)
        want = _ids_from_significance(sa, sb, sc, start, rin, rout)
        worst = max(worst, int(np.abs(got - want).max()))
        assert 1 <= got.min() and got.max() <= 16, (got, start)
        # the units digits of a, b and c share one ID
        units = [len(sa) - 1 if not rin else 0, len(sa) + 1 + (len(sb) - 1 if not rin else 0),
                 len(sa) + len(sb) + 2 + (len(sc) - 1 if not rout else 0)]
        assert len(set(got[units].tolist())) == 1, got
    assert worst == 0, worst
    return float(worst)


def _check_coupled_rows_sum_gradients(rng):
    # The table gradient of a row is the sum of dout over exactly the tokens coupled to that ID.
    s = _sample(rng, "small")
    y, cache = position_coupling_embed_forward(s.inputs["x"], s.params, **s.config)
    g = rng.standard_normal(y.shape)
    dw = position_coupling_embed_backward(g, cache)["wpe.weight"]
    pos = s.config["position_ids"]
    want = np.stack([g[pos == r].sum(0) for r in range(dw.shape[0])])
    err = float(np.abs(dw - want).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="position_coupling", family="1-softmax", tier="T2",
        title="Position coupling (shared position IDs for task-aligned tokens)",
        paper="Cho, Cha, Awasthi, Bhojanapalli, Gupta, Yun, Position Coupling: Improving Length Generalization of "
              "Arithmetic Transformers Using Task Structure, NeurIPS 2024, arXiv 2405.20671",
        forward=position_coupling_embed_forward, backward=position_coupling_embed_backward, sample=_sample,
        reference=_reference, docs="softmax/positional-encodings.md#position-coupling",
        checks={"ids_equal_significance": _check_ids_equal_significance,
                "coupled_rows_sum_gradients": _check_coupled_rows_sum_gradients},
    ),
)
