"""PyTorch re-statements of upstream neural-operator modules, for ``tests/test_interop_ops_b.py``.

Each class restates the cited upstream module (upstream parameter names and shapes, the forward's
math) compactly in plain PyTorch; it is not a copy of the upstream code. Deviations common to all:
dropout is omitted (eval mode) and hard-coded float32 / complex64 (or complex128) dtypes follow the
input's dtype instead, so that float64 stays float64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------------------------
# nec-research/CAPE-ML4Sci@8ae7d64 CAPE/models/PrmEmbd/PrmEmbd.py: PrmEmb_Block_1d, PrmEmb_Block_2d
# (SpectralConv1d, SpectralConv2d_fast). Deviation: upstream allocates the spectral weights and the
# output spectrum as torch.cdouble; here the spectrum follows the input's dtype.


class _CapeSpectral(nn.Module):
    def __init__(self, cin, cout, modes, nd):
        super().__init__()
        self.nd, self.cout, self.modes = nd, cout, modes
        scale = 1 / (cin * cout)
        shape = (cin, cout) + (modes,) * nd
        self.weights1 = nn.Parameter(scale * torch.rand(shape, dtype=torch.cdouble))
        if nd == 2:
            self.weights2 = nn.Parameter(scale * torch.rand(shape, dtype=torch.cdouble))

    def forward(self, x):
        m = self.modes
        if self.nd == 1:
            xf = torch.fft.rfft(x)
            out = torch.zeros(x.shape[0], self.cout, x.size(-1) // 2 + 1, dtype=xf.dtype)
            out[:, :, :m] = torch.einsum("bix,iox->box", xf[:, :, :m], self.weights1)
            return torch.fft.irfft(out, n=x.size(-1))
        xf = torch.fft.rfft2(x)
        out = torch.zeros(x.shape[0], self.cout, x.size(-2), x.size(-1) // 2 + 1, dtype=xf.dtype)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.weights1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -m:, :m], self.weights2)
        return torch.fft.irfft2(out, s=(x.size(-2), x.size(-1)))


class PrmEmbBlock(nn.Module):
    """``PrmEmb_Block_1d`` (nd=1) / ``PrmEmb_Block_2d`` (nd=2); forward([x, x_p]) -> [out, x_p]."""

    def __init__(self, widening_factor=16, kernel_size=5, num_params=1, if_11cnv=False, num_channels=1,
                 num_channels_PrmEmb=1, modes=16, normed_dim=(128,), nd=1):
        super().__init__()
        conv = nn.Conv1d if nd == 1 else nn.Conv2d
        w, h = widening_factor, widening_factor // 2
        self.nd, self.num_channels_PrmEmb = nd, num_channels_PrmEmb
        self.CNN_0 = conv(num_channels, h, kernel_size=kernel_size, bias=False, padding="same")
        self.avpool = (nn.AvgPool1d if nd == 1 else nn.AvgPool2d)(4, 4)
        self.CNN_SC = _CapeSpectral(h, w, modes, nd)
        self.CNN_AD = conv(h, w, kernel_size=kernel_size, bias=False, padding="same", groups=h)
        self.CNN_1 = conv(h, w, kernel_size=1)
        self.CNN_AC = conv(h, w, kernel_size=1)
        if if_11cnv:
            self.CNN_2 = conv(w, num_channels * num_channels_PrmEmb, kernel_size=1)
        else:
            self.CNN_2 = conv(w, num_channels * num_channels_PrmEmb, kernel_size=kernel_size, bias=False,
                              padding="same")
        for i in range(3):
            setattr(self, f"fc{i}a", nn.Linear(num_params, h))
            setattr(self, f"fc{i}b", nn.Linear(h, w))
        self.LN = nn.LayerNorm(list(normed_dim))

    def forward(self, inputs):
        x, x_p = inputs
        pi = x_p if self.nd == 1 else torch.sigmoid(torch.log(x_p))
        tail = (None,) * self.nd
        e = [getattr(self, f"fc{i}b")(F.gelu(getattr(self, f"fc{i}a")(pi)))[(slice(None), slice(None)) + tail]
             for i in range(3)]
        y = F.gelu(self.CNN_0(x))
        y0 = F.interpolate(self.CNN_SC(self.avpool(y)) * e[0], scale_factor=4)
        y = F.gelu(y0 + self.CNN_AC(y) * e[1] + self.CNN_AD(y) * e[2] + self.CNN_1(y))
        y = self.CNN_2(y)
        xt = x.repeat((1, self.num_channels_PrmEmb) + (1,) * self.nd)
        return [xt + self.LN(y) if self.nd == 1 else xt * (1.0 + self.LN(y)), x_p]
