"""Single-thread cost per attention-score entry, measured in process CPU time.

On a shared machine wall-clock medians move with other processes' load; the CPU time of a
single-threaded process moves much less. This script pins torch, Numba and OpenBLAS to one thread
and reports nanoseconds of CPU per score entry (B*H*N*M, halved when causal) for the forward and
the forward+backward of the Numba flash kernel and torch SDPA, best of ``--repeats``.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/per_entry.py [--n 1024]

Writes benchmarks/results/per_entry.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numba  # noqa: E402
import numpy as np  # noqa: E402
from bench import blas_info  # noqa: E402

from refattn.kernels.cpu.flash import flash_attention_backward, flash_attention_forward  # noqa: E402


def _cpu_best(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def _row(causal, q, k, v, g, torch, entries, repeats):
    def nb_fwd():
        return flash_attention_forward(q, k, v, is_causal=causal)

    def nb_fb():
        return flash_attention_backward(g, flash_attention_forward(q, k, v, is_causal=causal)[1])

    row = {"causal": causal, "numba_fwd_ns": _cpu_best(nb_fwd, repeats), "numba_fwd_bwd_ns": _cpu_best(nb_fb, repeats)}
    if torch is not None:
        F = torch.nn.functional
        tq, tk, tv, tg = (torch.from_numpy(x) for x in (q, k, v, g))

        def t_fwd():
            with torch.inference_mode():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        def t_fb():
            xs = [x.detach().requires_grad_() for x in (tq, tk, tv)]
            return torch.autograd.grad(F.scaled_dot_product_attention(*xs, is_causal=causal), xs, tg)

        row["torch_fwd_ns"] = _cpu_best(t_fwd, repeats)
        row["torch_fwd_bwd_ns"] = _cpu_best(t_fb, repeats)
    for key in [k_ for k_ in row if k_.endswith("_ns")]:
        row[key] = row[key] / entries * 1e9
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    a = p.parse_args(argv)
    numba.set_num_threads(1)
    info = blas_info(1)
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, a.heads, a.n, a.d), dtype=np.float32) for _ in range(4))
    x = rng.standard_normal((1024, 1024), dtype=np.float32)
    sgemm = {"numpy": 2 * 1024**3 / _cpu_best(lambda: x @ x, a.repeats) / 1e9}
    if torch is not None:
        tx = torch.from_numpy(x)
        sgemm["torch"] = 2 * 1024**3 / _cpu_best(lambda: tx @ tx, a.repeats) / 1e9
    rows = [_row(causal, q, k, v, g, torch, a.heads * a.n * a.n * (0.5 if causal else 1.0), a.repeats)
            for causal in (False, True)]
    report = {"n": a.n, "heads": a.heads, "d": a.d, "threads": 1, "blas": info, "sgemm_1thread_gflops": sgemm,
              "loadavg": os.getloadavg(), "rows": rows}
    lines = [f"Single thread, float32, B=1, H={a.heads}, N=M={a.n}, d={a.d}: CPU ns per score entry "
             f"(best of {a.repeats}; load average {tuple(round(x, 2) for x in report['loadavg'])}).", "",
             f"Single-thread sgemm (1024³, CPU time): NumPy ({info.get('openblas_core')}) {sgemm['numpy']:.0f} GFLOP/s"
             + (f", torch {sgemm['torch']:.0f} GFLOP/s" if "torch" in sgemm else "") + ". "
             "At 4d flops per entry (QKᵀ and PV, d = 64), 1 ns per entry is 256 GFLOP/s.", "",
             "| causal | Numba fwd | torch fwd | Numba fwd+bwd | torch fwd+bwd | Numba speed vs torch, fwd | fwd+bwd |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        tf, tb = r.get("torch_fwd_ns"), r.get("torch_fwd_bwd_ns")
        lines.append(f"| {r['causal']} | {r['numba_fwd_ns']:.2f} | {tf:.2f} | {r['numba_fwd_bwd_ns']:.2f} | {tb:.2f} | "
                     f"{tf / r['numba_fwd_ns']:.2f}x | {tb / r['numba_fwd_bwd_ns']:.2f}x |" if tf else
                     f"| {r['causal']} | {r['numba_fwd_ns']:.2f} | — | {r['numba_fwd_bwd_ns']:.2f} | — | — | — |")
    md = "\n".join(lines)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "per_entry.json").write_text(json.dumps(report, indent=1))
    (a.out / "per_entry.md").write_text(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
