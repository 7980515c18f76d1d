"""nn.Module wrappers for the functional upstream transcriptions of ``tests/_upstream_ops.py``, so
that ``refattn.interop.torch.check_module`` can run them (tests/test_interop_fidelity.py).

:class:`FunctionalModule` holds parameters under the upstream state-dict names (``nn.Linear``
weights stored ``(out, in)`` as upstream, so that ``module.state_dict()`` is the upstream one) and
calls a transcription that reads them ``(in, out)``. :class:`CodomainCore` re-states neuraloperator
``neuralop/layers/coda_layer.py`` @ 93d3f06 ``CODALayer.compute_attention`` after ``Key``,
``Query`` and ``Value`` (PyPI 2.0.0 has the same lines).
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

nn = torch.nn


class FunctionalModule(nn.Module):
    """``params`` (refattn layout) as parameters named like the upstream state_dict; the names
    matching ``linear`` (a full-match regex) are stored transposed, ``(out, in)``. ``forward(*args)``
    returns ``fn(p, *args)`` with ``p`` the parameters in refattn's layout (autograd flows through
    the transposes). ``attrs`` become attributes (heads ..., read by check_module)."""

    def __init__(self, params: dict, fn, linear: str = r"(?!)", **attrs):
        super().__init__()
        self._names, self._fn, self._linear = list(params), fn, linear
        for name, a in params.items():
            *path, leaf = name.split(".")
            mod = self
            for part in path:
                if part not in mod._modules:
                    mod.add_module(part, nn.Module())
                mod = mod._modules[part]
            a = np.asarray(a, dtype=np.float64)
            mod.register_parameter(leaf, nn.Parameter(torch.tensor(a.T if re.fullmatch(linear, name) else a)))
        for k, v in attrs.items():
            setattr(self, k, v)

    def forward(self, *args, **kwargs):
        sd = dict(self.named_parameters())
        p = {n: sd[n].T if re.fullmatch(self._linear, n) else sd[n] for n in self._names}
        return self._fn(p, *args, **kwargs)


class CodomainCore(nn.Module):
    """``forward(q, k, v)``: ``(b, heads, t, d, *grid)`` each (q and k on one grid, v on its own);
    scores over tokens ``q·k / (sqrt(d·|grid_qk|) · temperature)``, softmax, then the mix of v."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.temperature = temperature

    def forward(self, q, k, v):
        b, h, t = q.shape[:3]
        qf, kf, vf = (x.reshape(b, h, t, -1) for x in (q, k, v))
        score = qf @ kf.transpose(-1, -2) / (math.sqrt(kf.shape[-1]) * self.temperature)
        return (torch.softmax(score, dim=-1) @ vf).reshape(v.shape)


class SimpleAttention(nn.Module):
    """scaomath/galerkin-transformer ``libs/layers.py`` @ 2c9d23e ``SimpleAttention`` (norm_type='layer',
    eval): ``forward(query, key, value, pos=None)`` returns ``(out, None)``; ``fc`` exists only for
    coordinates (``pos_dim > 0``), as upstream builds it."""
    def __init__(self, n_head, d_model, pos_dim=1, attention_type="galerkin", eps=1e-5):
        super().__init__()
        self.n_head, self.d_k, self.attention_type = n_head, d_model // n_head, attention_type
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        norms = ("K", "V") if attention_type == "galerkin" else ("Q", "K")
        for t in norms:
            ln = nn.ModuleList([nn.LayerNorm(self.d_k, eps=eps) for _ in range(n_head)])
            for m in ln:  # non-trivial affine so that the stacking order matters
                nn.init.normal_(m.weight, 1.0, 0.3)
                nn.init.normal_(m.bias, 0.0, 0.3)
            setattr(self, f"norm_{t}", ln)
        if pos_dim > 0:
            self.fc = nn.Linear(d_model + n_head * pos_dim, d_model)

    def _norm(self, norms, x):
        return torch.stack([norm(x[:, i]) for i, norm in enumerate(norms)], dim=1)

    def forward(self, query, key, value, pos=None):
        bsz = query.size(0)
        query, key, value = (lin(x).view(bsz, -1, self.n_head, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value)))
        if self.attention_type == "galerkin":
            key, value = self._norm(self.norm_K, key), self._norm(self.norm_V, value)
        else:
            key, query = self._norm(self.norm_K, key), self._norm(self.norm_Q, query)
        if pos is not None:
            pos = pos.unsqueeze(1).repeat([1, self.n_head, 1, 1])
            query, key, value = (torch.cat([pos, x], dim=-1) for x in (query, key, value))
        if self.attention_type == "galerkin":  # linear_attention: seq_len = query.size(-2)
            x = query @ (key.transpose(-2, -1) @ value / query.size(-2))
        else:  # attention(): scores / seq_len with seq_len = scores.size(-1), the key length
            scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))
            x = (scores / scores.size(-1)) @ value
        out = x.transpose(1, 2).contiguous().view(bsz, -1, self.n_head * x.size(-1))
        return (self.fc(out) if pos is not None else out), None
