"""Draw the home page's figure, ``docs/assets/home-attention-maps.png``.

The same causal attention logits seen by softmax attention and by differential attention: a
shared "noise" pattern spreads softmax attention over every earlier token, while the difference
of two softmax maps, $A_1 - \\lambda A_2$, cancels the part both maps share and keeps the
relevant keys. The maps come from refattn's own functions (``refattn.nn.softmax.softmax``).

usage (from the repository root): python scripts/make_home_figure.py
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from refattn.nn.softmax import softmax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
n, lam = 24, 0.8
rng = np.random.default_rng(4)
causal = np.tril(np.ones((n, n), dtype=bool))
noise = 1.5 * rng.standard_normal((n, n))                 # what both maps see
signal = np.zeros((n, n))
targets = (np.arange(n) * 7 // 10)                        # each query's relevant key
signal[np.arange(n), targets] = 4.0
a1 = softmax(signal + noise, mask=causal)
a2 = softmax(noise, mask=causal)
diff = a1 - lam * a2

fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.9), constrained_layout=True)
panels = [(a1, "softmax attention  $A_1$", "Blues", 0, a1.max()),
          (diff, r"differential attention  $A_1 - \lambda A_2$", "RdBu_r", -np.abs(diff).max(), np.abs(diff).max())]
for ax, (m, title, cmap, lo, hi) in zip(axes, panels):
    im = ax.imshow(np.where(causal, m, np.nan), cmap=cmap, vmin=lo, vmax=hi)
    ax.scatter(targets, np.arange(n), s=14, facecolors="none", edgecolors="k", linewidths=0.7)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    fig.colorbar(im, ax=ax, shrink=0.85)
fig.suptitle(f"One causal score pattern, two mechanisms (circles: the relevant key, $\\lambda$ = {lam})", fontsize=10)
out = ROOT / "docs" / "assets" / "home-attention-maps.png"
fig.savefig(out, dpi=110)
print(out)
