"""Vision token mixers, embeddings and token reduction (issue 16, slice b4): what the generated
registry tests cannot express.

* PyTorch float64 parity against ``torch.nn.functional`` transcriptions of each upstream module
  (``F.conv2d``, ``F.batch_norm``, ``F.group_norm``, ``F.avg_pool2d``, ``F.affine_grid``,
  ``F.grid_sample``), forward and every gradient;
* FastViT's structural re-parameterisation equals the train-time form (evaluation mode) and does
  not in training mode;
* the discrete selections against brute force: Token Pooling's clustering, the polyphase anchor;
  shift equivariance / invariance of the anchored embedding under every circular shift;
* the batch-norm helper (running and batch statistics) and the training-mode gradients the
  registry samples (evaluation mode) do not cover;
* argument errors that name the argument.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from refattn.blocks import (
    batch_norm_backward,
    batch_norm_forward,
    deform_conv2d_apply,
    deformable_token_merging_backward,
    deformable_token_merging_forward,
    fastvit_repmixer,
    fastvit_repmixer_backward,
    fastvit_repmixer_forward,
    fastvit_repmixer_reparameterize,
    patchify,
    polyphase_anchor,
    polyphase_anchoring,
    polyphase_anchoring_backward,
    polyphase_anchoring_forward,
    poolformer_pooling_mixer_backward,
    poolformer_pooling_mixer_forward,
    repmixer_branches,
    spatial_transformer,
    spatial_transformer_backward,
    spatial_transformer_forward,
    token_pooling,
    token_pooling_backward,
    token_pooling_clusters,
    token_pooling_forward,
    vit_patch_embedding_backward,
    vit_patch_embedding_forward,
)
from refattn.blocks import deformable_merging as lit_mod
from refattn.blocks import poolformer as pool_mod
from refattn.blocks import repmixer as rep_mod
from refattn.blocks import stn as stn_mod
from refattn.blocks import token_pool as tp_mod
from refattn.registry import Sample
from refattn.testing import directional_check, gradcheck

TOL = 1e-12


def _torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # tiny tensors: threads only add contention
    return torch, torch.nn.functional


def _parity(ours_fwd, ours_bwd, torch_fn, arrays: dict, *, no_grad=(), tol=TOL):
    """Compare the forward and every gradient with float64 autograd; ``no_grad`` keys (buffers) are
    passed to torch without ``requires_grad``. Errors are relative to each array's largest entry."""
    torch, _ = _torch()
    out, cache = ours_fwd(arrays)
    g = np.random.default_rng(7).standard_normal(out.shape)
    ts = {k: torch.tensor(v, dtype=torch.float64, requires_grad=k not in no_grad) for k, v in arrays.items()}
    tout = torch_fn(ts)
    tout.backward(torch.tensor(g))
    grads = ours_bwd(g, cache)
    ref = tout.detach().numpy()
    assert out.shape == ref.shape
    err = float(np.abs(out - ref).max()) / max(float(np.abs(ref).max()), 1.0)
    assert err < tol, f"output differs from PyTorch by {err}"
    for k, t in ts.items():
        if k in no_grad:
            continue
        tg = t.grad.numpy() if t.grad is not None else np.zeros_like(arrays[k])
        err = float(np.abs(grads[k] - tg).max()) / max(float(np.abs(tg).max()), 1.0)
        assert err < tol, f"gradient {k} differs from PyTorch by {err}"


def _split(a):
    return a["x"], {k: v for k, v in a.items() if k != "x"}


# ----------------------------------------------------------------------------- ViT patch embedding


@pytest.mark.parametrize("class_token,no_embed_class,dynamic", [(True, False, False), (True, True, True),
                                                                (False, False, True)])
def test_vit_patch_embedding_torch_parity(class_token, no_embed_class, dynamic):
    torch, F = _torch()
    rng = np.random.default_rng(0)
    h, w = (7, 9) if dynamic else (6, 8)
    n = 3 * 3 if dynamic else 2 * 4  # patch (3, 2): 7 x 5 pads to a 3 x 3 grid, 6 x 8 is 2 x 4
    length = n + 1 if class_token and not no_embed_class else n
    a = {"x": rng.standard_normal((2, 3, h, w)), "patch_embed.proj.weight": rng.standard_normal((5, 3, 3, 2)),
         "patch_embed.proj.bias": rng.standard_normal(5), "pos_embed": rng.standard_normal((1, length, 5))}
    if class_token:
        a["cls_token"] = rng.standard_normal((1, 1, 5))
    if dynamic:
        a["x"] = a["x"][:, :, :, :5]  # 7 x 5 -> padded to 9 x 6: a 3 x 3 grid
    cfg = {"class_token": class_token, "no_embed_class": no_embed_class, "dynamic_img_pad": dynamic}

    def tfn(t):
        x = t["x"]
        if dynamic:
            x = F.pad(x, (0, -x.shape[3] % 2, 0, -x.shape[2] % 3))
        z = F.conv2d(x, t["patch_embed.proj.weight"], t["patch_embed.proj.bias"], stride=(3, 2)).flatten(2).transpose(1, 2)
        cls = [t["cls_token"].expand(z.shape[0], -1, -1)] if class_token else []
        if no_embed_class:
            return torch.cat(cls + [z + t["pos_embed"]], dim=1)
        return torch.cat(cls + [z], dim=1) + t["pos_embed"]

    _parity(lambda a: vit_patch_embedding_forward(*_split(a), **cfg), vit_patch_embedding_backward, tfn, a)


def test_vit_patch_embedding_errors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 8))
    p = {"patch_embed.proj.weight": rng.standard_normal((4, 3, 2, 2)), "pos_embed": np.zeros((1, 10, 4)),
         "cls_token": np.zeros((1, 1, 4))}
    with pytest.raises(ValueError, match="multiple of the patch size"):
        vit_patch_embedding_forward(x, p)
    with pytest.raises(ValueError, match="pos_embed must have shape"):
        vit_patch_embedding_forward(x[:, :, :6], p)
    with pytest.raises(ValueError, match="input channels"):
        vit_patch_embedding_forward(x[:, :2, :6], p)
    with pytest.raises(ValueError, match="missing key 'patch_embed.proj.weight'"):
        vit_patch_embedding_forward(x, {})


# ----------------------------------------------------------------------------- PoolFormer


@pytest.mark.parametrize("layer_scale,k", [(True, 3), (False, 5)])
def test_poolformer_torch_parity(layer_scale, k):
    torch, F = _torch()
    rng = np.random.default_rng(1)
    a = {"x": rng.standard_normal((2, 4, 5, 6)), **pool_mod._params(rng, 4, 12, layer_scale)}

    def tfn(t):
        ls1 = t["layer_scale_1"][:, None, None] if layer_scale else 1.0
        ls2 = t["layer_scale_2"][:, None, None] if layer_scale else 1.0
        n1 = F.group_norm(t["x"], 1, t["norm1.weight"], t["norm1.bias"], 1e-5)
        y = t["x"] + ls1 * (F.avg_pool2d(n1, k, 1, k // 2, count_include_pad=False) - n1)
        n2 = F.group_norm(y, 1, t["norm2.weight"], t["norm2.bias"], 1e-5)
        m = F.conv2d(F.gelu(F.conv2d(n2, t["mlp.fc1.weight"], t["mlp.fc1.bias"])), t["mlp.fc2.weight"], t["mlp.fc2.bias"])
        return y + ls2 * m

    _parity(lambda a: poolformer_pooling_mixer_forward(*_split(a), pool_size=k, use_layer_scale=layer_scale),
            poolformer_pooling_mixer_backward, tfn, a)


def test_poolformer_errors():
    rng = np.random.default_rng(0)
    s = pool_mod._sample(rng, "tiny")
    with pytest.raises(ValueError, match="pool_size must be odd"):
        poolformer_pooling_mixer_forward(**s.inputs, params=s.params, pool_size=2)
    with pytest.raises(ValueError, match="mlp.fc1.weight"):
        poolformer_pooling_mixer_forward(**s.inputs, params={k: v for k, v in s.params.items() if k != "mlp.fc1.weight"})


# ----------------------------------------------------------------------------- FastViT RepMixer


def _torch_repmixer(t, k, nb, layer_scale, training):
    torch, F = _torch()
    x = t["x"]
    c = x.shape[1]

    def bn(h, pre):
        # clones: train-mode F.batch_norm updates the running statistics in place
        return F.batch_norm(h, t[f"{pre}.running_mean"].detach().clone(), t[f"{pre}.running_var"].detach().clone(),
                            t[f"{pre}.weight"], t[f"{pre}.bias"], training=training, eps=1e-5)

    mix = 0.0
    for sign, conv, pre, kk in repmixer_branches(k, nb):
        h = x if conv is None else F.conv2d(x, t[f"{conv}.weight"], padding=kk // 2, groups=c)
        mix = mix + sign * bn(h, pre)
    return x + (t["layer_scale"] * mix if layer_scale else mix)


@pytest.mark.parametrize("k,nb,layer_scale,training", [(3, 1, True, False), (5, 2, False, False),
                                                        (3, 1, True, True), (1, 1, True, True)])
def test_repmixer_torch_parity(k, nb, layer_scale, training):
    rng = np.random.default_rng(2)
    a = {"x": rng.standard_normal((2, 3, 5, 6)), **rep_mod._train_params(rng, 3, k, nb, layer_scale)}
    buffers = [n for n in a if "running" in n]
    cfg = {"kernel_size": k, "num_conv_branches": nb, "use_layer_scale": layer_scale, "training": training}
    # train-mode BN nearly cancels the 1x1 scale branch's weight gradient: a looser relative bound
    _parity(lambda a: fastvit_repmixer_forward(*_split(a), **cfg), fastvit_repmixer_backward,
            lambda t: _torch_repmixer(t, k, nb, layer_scale, training), a, no_grad=buffers,
            tol=1e-11 if training else TOL)


@pytest.mark.parametrize("k,nb,layer_scale", [(3, 1, True), (3, 0, False), (5, 3, True), (7, 1, False)])
def test_repmixer_reparameterisation_is_exact(k, nb, layer_scale):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 7, 6))
    p = rep_mod._train_params(rng, 4, k, nb, layer_scale)
    cfg = {"kernel_size": k, "num_conv_branches": nb, "use_layer_scale": layer_scale}
    q = fastvit_repmixer_reparameterize(p, **cfg)
    y, yi = fastvit_repmixer(x, p, **cfg), fastvit_repmixer(x, q, inference_mode=True, **cfg)
    assert float(np.abs(y - yi).max()) < 1e-13
    # the folded kernel is I_k + ls (K_m - K_n): its centre carries the identity
    assert q["reparam_conv.weight"].shape == (4, 1, k, k)


def test_repmixer_reparameterisation_needs_eval_mode():
    # In training mode (batch statistics) the folded conv is not the same function: the exactness
    # test above is not vacuous.
    rng = np.random.default_rng(4)
    x = 3.0 + rng.standard_normal((4, 3, 5, 5))
    p = rep_mod._train_params(rng, 3, 3)
    y_train = fastvit_repmixer(x, p, training=True)
    yi = fastvit_repmixer(x, fastvit_repmixer_reparameterize(p), inference_mode=True)
    assert float(np.abs(y_train - yi).max()) > 1e-2
    with pytest.raises(ValueError, match="training=True needs the train-time form"):
        fastvit_repmixer(x, fastvit_repmixer_reparameterize(p), inference_mode=True, training=True)


def test_repmixer_training_mode_gradcheck():
    rng = np.random.default_rng(5)
    s = Sample({"x": rng.standard_normal((3, 2, 3, 3))}, rep_mod._train_params(rng, 2, 3), {"training": True})
    gradcheck(fastvit_repmixer_forward, fastvit_repmixer_backward, s)


def test_repmixer_errors():
    rng = np.random.default_rng(0)
    p = rep_mod._train_params(rng, 2, 3)
    x = rng.standard_normal((2, 2, 4, 4))
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        fastvit_repmixer(x, p, kernel_size=2)
    bad = dict(p)
    bad["mixer.rbr_skip.running_var"] = -np.ones(2)
    with pytest.raises(ValueError, match="mixer.rbr_skip.running_var must be >= 0"):
        fastvit_repmixer(x, bad)
    with pytest.raises(ValueError, match="unknown keys"):
        fastvit_repmixer(x, {**p, "mixer.rbr_skip.num_batches_tracked": np.zeros(1)})


# ----------------------------------------------------------------------------- batch norm helper


@pytest.mark.parametrize("training", [False, True])
def test_batch_norm_helper_torch_parity_and_gradcheck(training):
    torch, F = _torch()
    rng = np.random.default_rng(6)
    a = {"x": rng.standard_normal((3, 4, 2, 5)), "bn.weight": 1 + 0.2 * rng.standard_normal(4),
         "bn.bias": rng.standard_normal(4), "bn.running_mean": rng.standard_normal(4),
         "bn.running_var": 0.5 + rng.random(4)}

    def fwd(x, params):
        return batch_norm_forward(params, "bn", x, training=training)

    def bwd(g, cache):
        grads = {}
        grads["x"] = batch_norm_backward(grads, a, g, cache)
        return grads

    def tfn(t):
        return F.batch_norm(t["x"], t["bn.running_mean"].detach().clone(), t["bn.running_var"].detach().clone(),
                            t["bn.weight"], t["bn.bias"], training=training, eps=1e-5)

    _parity(lambda a: fwd(*_split(a)), bwd, tfn, a, no_grad=["bn.running_mean", "bn.running_var"])
    s = Sample({"x": a["x"]}, {k: v for k, v in a.items() if k != "x"})
    # the running statistics' gradients (eval mode) are checked against finite differences here
    gradcheck(lambda x, params: fwd(x, params), lambda g, c: {**bwd(g, c)}, s)


# ----------------------------------------------------------------------------- Token Pooling


@pytest.mark.parametrize("method", tp_mod.TOKEN_POOLING_METHODS)
@pytest.mark.parametrize("weighted", [False, True])
def test_token_pooling_gradcheck_all_variants(method, weighted):
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.standard_normal((2, 1, 3)), tp_mod._blobs(rng, 2, 2, 3, 3)], axis=1)
    inputs = {"x": x}
    if weighted:
        inputs["scores"] = 0.5 + 0.1 * np.stack([rng.permutation(6) for _ in range(2)]) + rng.uniform(0, 0.01, (2, 6))
    s = Sample(inputs, None, {"num_clusters": 2, "method": method})
    gradcheck(token_pooling_forward, token_pooling_backward, s)


@pytest.mark.parametrize("method", tp_mod.TOKEN_POOLING_METHODS)
def test_token_pooling_clusters_against_brute_force_assignment(method):
    # Unstructured data, run to convergence: the selection satisfies the Lloyd optimality conditions,
    # checked by enumerating every (token, centre) pair and every medoid candidate.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 11, 4))
    w = rng.uniform(0.3, 2.0, (3, 10))
    y = token_pooling(x, w, num_clusters=3, method=method, num_iters=200)
    masks, assign = token_pooling_clusters(x, w, num_clusters=3, method=method, num_iters=200)
    for b in range(3):
        f, c = x[b, 1:], y[b, 1:]
        for i, j in itertools.product(range(10), range(3)):
            assert np.sum((f[i] - c[assign[b, i]]) ** 2) <= np.sum((f[i] - c[j]) ** 2) + 1e-12
        for j in range(3):
            members = np.flatnonzero(assign[b] == j)
            if method == "kmedoids":
                costs = [sum(w[b, i] * np.sum((f[i] - f[m]) ** 2) for i in members) for m in members]
                assert np.array_equal(c[j], f[members[int(np.argmin(costs))]])
                assert masks[b, j].sum() == 1
            else:
                assert np.array_equal(masks[b, j], assign[b] == j)


def test_token_pooling_objective_never_increases():
    # Lloyd's iterations cannot increase the weighted Chamfer objective.
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 15, 3))
    w = rng.uniform(0.5, 1.5, (2, 15))
    for method in tp_mod.TOKEN_POOLING_METHODS:
        prev = [np.inf, np.inf]
        for it in range(0, 6):
            y = token_pooling(x, w, num_clusters=4, method=method, num_iters=it, num_prefix_tokens=0)
            for b in range(2):
                obj = tp_mod._objective(x[b], w[b], y[b])
                assert obj <= prev[b] + 1e-12, f"{method}: objective rose at iteration {it}"
                prev[b] = obj


def test_token_pooling_torch_parity_with_fixed_selection():
    torch, _ = _torch()
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal((2, 1, 4)), tp_mod._blobs(rng, 2, 3, 4, 4)], axis=1)
    w = rng.uniform(0.5, 1.5, (2, 12))
    masks = token_pooling_forward(x, w, num_clusters=3, method="kmeans")[1]["masks"]
    m = torch.tensor(masks.astype(float))

    def tfn(t):
        aw = m * t["scores"][:, None, :]
        return torch.cat([t["x"][:, :1], aw @ t["x"][:, 1:] / aw.sum(-1, keepdim=True)], dim=1)

    _parity(lambda a: token_pooling_forward(a["x"], a["scores"], num_clusters=3, method="kmeans"),
            token_pooling_backward, tfn, {"x": x, "scores": w})


def test_token_pooling_errors_and_float32():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3))
    with pytest.raises(ValueError, match="num_clusters"):
        token_pooling(x, num_clusters=5)
    with pytest.raises(ValueError, match="scores must be > 0"):
        token_pooling(x, -np.ones((2, 4)), num_clusters=2)
    with pytest.raises(ValueError, match="scores must have shape"):
        token_pooling(x, np.ones((2, 5)), num_clusters=2)
    with pytest.raises(ValueError, match="method"):
        token_pooling(x, num_clusters=2, method="kmodes")
    y, cache = token_pooling_forward(x.astype(np.float32), np.ones((2, 4), np.float32), num_clusters=2,
                                     method="kmeans")
    g = token_pooling_backward(np.ones_like(y), cache)
    assert y.dtype == g["x"].dtype == g["scores"].dtype == np.float32


# ----------------------------------------------------------------------------- polyphase anchoring


def _brute_anchor(x, patch, invariance):
    ph, pw = patch
    out = []
    for i in range(x.shape[0]):
        norms = {(a, b): float(np.linalg.norm(x[i, :, a::ph, b::pw])) for a in range(ph) for b in range(pw)}
        a, b = max(norms, key=lambda k: (norms[k], -k[0] * pw - k[1]))  # first maximum, row-major
        if invariance:
            comp = x[i, :, a::ph, b::pw]
            tn = {(r, s): float(np.linalg.norm(comp[:, r, s])) for r in range(comp.shape[1]) for s in range(comp.shape[2])}
            r, s = max(tn, key=lambda k: (tn[k], -k[0] * comp.shape[2] - k[1]))
            a, b = a + r * ph, b + s * pw
        out.append((a, b))
    return np.array(out)


@pytest.mark.parametrize("invariance", [False, True])
def test_polyphase_anchor_against_brute_force(invariance):
    rng = np.random.default_rng(12)
    for patch, hw in [((2, 2), (6, 8)), ((3, 2), (6, 4)), ((4, 4), (8, 8))]:
        x = rng.standard_normal((4, 3) + hw)
        assert np.array_equal(polyphase_anchor(x, patch, invariance=invariance), _brute_anchor(x, patch, invariance))


def test_polyphase_shift_equivariance_every_shift_rectangular():
    # Random (not separated) images and a rectangular 3 x 4 grid of 2 x 3 patches: every circular
    # shift of the input circularly shifts the token grid by the matching whole number of patches.
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 2, 6, 12))
    p = {"proj.weight": rng.standard_normal((3, 2, 2, 3)), "proj.bias": rng.standard_normal(3)}
    t0 = polyphase_anchoring(x, p).reshape(2, 3, 4, 3)
    s0 = polyphase_anchor(x, (2, 3))
    for dy, dx in itertools.product(range(6), range(12)):
        t = polyphase_anchoring(np.roll(x, (dy, dx), axis=(2, 3)), p).reshape(2, 3, 4, 3)
        s = polyphase_anchor(np.roll(x, (dy, dx), axis=(2, 3)), (2, 3))
        for i in range(2):
            # the anchored sample moved by (dy, dx) - (new anchor - old anchor), a whole number of patches
            ry, rx = dy + s0[i, 0] - s[i, 0], dx + s0[i, 1] - s[i, 1]
            assert ry % 2 == 0 and rx % 3 == 0
            assert np.abs(np.roll(t0[i], (ry // 2, rx // 3), axis=(0, 1)) - t[i]).max() < 1e-12


def test_polyphase_invariance_and_gradient_under_shift():
    # invariance=True: tokens identical for every shift; the input gradient shifts with the input.
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 3, 8, 8))
    p = {"proj.weight": rng.standard_normal((4, 3, 4, 4))}
    t0, c0 = polyphase_anchoring_forward(x, p, invariance=True)
    g = rng.standard_normal(t0.shape)
    d0 = polyphase_anchoring_backward(g, c0)
    for dy, dx in [(1, 0), (3, 5), (7, 7)]:
        t, c = polyphase_anchoring_forward(np.roll(x, (dy, dx), axis=(2, 3)), p, invariance=True)
        assert np.abs(t - t0).max() < 1e-12
        d = polyphase_anchoring_backward(g, c)
        assert np.abs(d["x"] - np.roll(d0["x"], (dy, dx), axis=(2, 3))).max() < 1e-12
        assert np.abs(d["proj.weight"] - d0["proj.weight"]).max() < 1e-12


def test_polyphase_torch_parity():
    torch, F = _torch()
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, 3, 6, 6))
    shift = polyphase_anchor(x, (3, 3))
    a = {"x": x, "proj.weight": rng.standard_normal((4, 3, 3, 3)), "proj.bias": rng.standard_normal(4)}

    def tfn(t):
        rolled = torch.stack([torch.roll(t["x"][i], (-int(shift[i, 0]), -int(shift[i, 1])), dims=(1, 2))
                              for i in range(2)])
        return F.conv2d(rolled, t["proj.weight"], t["proj.bias"], stride=3).flatten(2).transpose(1, 2)

    _parity(lambda a: polyphase_anchoring_forward(*_split(a)), polyphase_anchoring_backward, tfn, a)


def test_polyphase_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="multiple of the patch size"):
        polyphase_anchoring(rng.standard_normal((2, 1, 5, 4)), {"proj.weight": rng.standard_normal((2, 1, 2, 2))})
    with pytest.raises(ValueError, match="p must be finite"):
        polyphase_anchoring(rng.standard_normal((2, 1, 4, 4)), {"proj.weight": rng.standard_normal((2, 1, 2, 2))}, p=0)


# ----------------------------------------------------------------------------- spatial transformer


def _torch_stn(t, kind, size, pad, align):
    torch, F = _torch()
    x = t["x"]
    h = x
    if kind == "conv":
        for name in ("localization.0", "localization.3"):
            h = F.relu(F.max_pool2d(F.conv2d(h, t[f"{name}.weight"], t[f"{name}.bias"]), 2, stride=2))
    h = h.reshape(x.shape[0], -1)
    h = F.relu(h @ t["fc_loc.0.weight"] + t["fc_loc.0.bias"])
    theta = (h @ t["fc_loc.2.weight"] + t["fc_loc.2.bias"]).view(-1, 2, 3)
    grid = F.affine_grid(theta, (x.shape[0], x.shape[1]) + tuple(size or x.shape[2:]), align_corners=align)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode=pad, align_corners=align)


@pytest.mark.parametrize("pad", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_spatial_transformer_torch_parity(pad, align):
    rng = np.random.default_rng(16)
    a = {"x": rng.standard_normal((2, 2, 12, 12)),
         "localization.0.weight": 0.3 * rng.standard_normal((3, 2, 3, 3)), "localization.0.bias": rng.standard_normal(3),
         "localization.3.weight": 0.3 * rng.standard_normal((4, 3, 2, 2)), "localization.3.bias": rng.standard_normal(4),
         "fc_loc.0.weight": 0.3 * rng.standard_normal((16, 5)), "fc_loc.0.bias": rng.standard_normal(5),
         "fc_loc.2.weight": 0.05 * rng.standard_normal((5, 6)),
         "fc_loc.2.bias": np.array([0.9, 0.2, 0.1, -0.15, 1.1, -0.05])}
    size = (7, 9)
    _parity(lambda a: spatial_transformer_forward(*_split(a), size=size, padding_mode=pad, align_corners=align),
            spatial_transformer_backward, lambda t: _torch_stn(t, "conv", size, pad, align), a, tol=1e-11)


def test_spatial_transformer_directional_conv_localization_other_size():
    # The conv localisation (max-pool arg-max held fixed) with an output size different from the
    # input's, every argument: the registry samples use the input size.
    rng = np.random.default_rng(17)
    s = stn_mod._sample(rng, "small")
    p = dict(s.params)
    # a quarter-pixel translation and an output grid of pitch 2: no source coordinate on a kink
    p["fc_loc.2.bias"] = np.array([1.0, 0.0, 0.25 / 6, 0.0, 1.0, 0.25 / 6])
    cfg = dict(s.config, size=(6, 6), align_corners=False)
    directional_check(spatial_transformer_forward, spatial_transformer_backward, Sample(s.inputs, p, cfg))


def test_spatial_transformer_errors():
    rng = np.random.default_rng(0)
    s = stn_mod._sample(rng, "tiny")
    with pytest.raises(ValueError, match="localization"):
        spatial_transformer(**s.inputs, params=s.params, localization="cnn")
    with pytest.raises(TypeError, match="size"):
        spatial_transformer(**s.inputs, params=s.params, localization="mlp", size=5)
    with pytest.raises(ValueError, match="too small for the localisation net"):
        spatial_transformer(rng.standard_normal((2, 1, 4, 4)), {"localization.0.weight": np.zeros((2, 1, 3, 3)),
                                                                "localization.3.weight": np.zeros((2, 2, 3, 3))})


# ----------------------------------------------------------------------------- LIT deformable merging


def _torch_dcn(x, offset, weight, bias, k):
    """DCN v1 (the CUDA kernel's bilinear rules: a point with h <= -1 or h >= H reads 0; corners
    outside read 0) written with torch ops, one tap at a time."""
    torch, _ = _torch()
    b, c, hh, ww = x.shape
    ho, wo = offset.shape[2:]
    flat = x.reshape(b, c, hh * ww)
    cols = []
    for i, j in itertools.product(range(k), range(k)):
        t = i * k + j
        h = (torch.arange(ho) * k + i)[:, None].double() + offset[:, 2 * t]
        w = (torch.arange(wo) * k + j)[None, :].double() + offset[:, 2 * t + 1]
        h, w = h.reshape(b, -1), w.reshape(b, -1)
        h0, w0 = torch.floor(h).long(), torch.floor(w).long()
        lh, lw = h - h0, w - w0
        val = 0.0
        for dh, wh in ((0, 1 - lh), (1, lh)):
            for dw, wt in ((0, 1 - lw), (1, lw)):
                r, s = h0 + dh, w0 + dw
                ok = ((r >= 0) & (r < hh) & (s >= 0) & (s < ww)).double()
                idx = (r.clamp(0, hh - 1) * ww + s.clamp(0, ww - 1))[:, None, :].expand(b, c, -1)
                val = val + (wh * wt * ok)[:, None] * torch.gather(flat, 2, idx)
        inside = ((h > -1) & (w > -1) & (h < hh) & (w < ww)).double()
        cols.append(val * inside[:, None])
    cols = torch.stack(cols, 2)
    y = torch.einsum("ock,bckp->bop", weight.reshape(weight.shape[0], c, -1), cols) + bias[None, :, None]
    return y.reshape(b, -1, ho, wo)


@pytest.mark.parametrize("training", [False, True])
def test_lit_deformable_merging_torch_parity(training):
    torch, F = _torch()
    rng = np.random.default_rng(18)
    k = 2
    a = {"x": rng.standard_normal((2, 3, 6, 4)), "dconv.weight": 0.4 * rng.standard_normal((5, 3, k, k)),
         "dconv.bias": rng.standard_normal(5), "dconv.conv_offset.weight": 0.4 * rng.standard_normal((8, 3, k, k)),
         "dconv.conv_offset.bias": rng.standard_normal(8), **lit_mod._bn_params(rng, 5)}

    def tfn(t):
        off = F.conv2d(t["x"], t["dconv.conv_offset.weight"], t["dconv.conv_offset.bias"], stride=k)
        y = _torch_dcn(t["x"], off, t["dconv.weight"], t["dconv.bias"], k)
        y = F.batch_norm(y, t["norm_layer.running_mean"].detach().clone(), t["norm_layer.running_var"].detach().clone(),
                         t["norm_layer.weight"], t["norm_layer.bias"], training=training, eps=1e-5)
        return F.gelu(y).flatten(2).transpose(1, 2)

    _parity(lambda a: deformable_token_merging_forward(*_split(a), training=training),
            deformable_token_merging_backward, tfn, a, no_grad=["norm_layer.running_mean", "norm_layer.running_var"],
            tol=1e-11)


def test_lit_deformable_merging_training_gradcheck():
    rng = np.random.default_rng(19)
    s = lit_mod._sample(rng, "tiny")
    gradcheck(deformable_token_merging_forward, deformable_token_merging_backward,
              Sample(s.inputs, s.params, {"training": True}))


def test_lit_offsets_move_the_reads():
    # A fractional offset interpolates between the two neighbouring pixels (and 0 past the border).
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    w = np.zeros((1, 1, 2, 2))
    w[0, 0, 0, 0] = 1.0  # read tap (0, 0) only
    off = np.zeros((1, 8, 2, 2))
    off[:, 1] = 0.25  # tap 0 column offset
    y, _ = deform_conv2d_apply(x, off, w, stride=2)
    assert np.allclose(y[0, 0], [[0.25, 2.25], [8.25, 10.25]])
    off[:, 1] = 3.5  # past the right border for the second column of outputs
    y, _ = deform_conv2d_apply(x, off, w, stride=2)
    assert np.allclose(y[0, 0, :, 1], 0.0) and np.allclose(y[0, 0, :, 0], [0.5 * 3, 0.5 * 11])


def test_vit_patchify_order_matches_conv_weight():
    # patchify's feature order is the conv weight's (C, P_h, P_w) flattening.
    rng = np.random.default_rng(20)
    x = rng.standard_normal((1, 2, 4, 6))
    w = rng.standard_normal((3, 2, 2, 3))
    from refattn.nn.conv import conv_apply

    y = conv_apply(x, w, stride=(2, 3)).reshape(1, 3, -1).transpose(0, 2, 1)
    assert np.abs(patchify(x, (2, 3)) @ w.reshape(3, -1).T - y).max() < 1e-13
