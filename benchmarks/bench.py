"""``refattn bench``: NumPy reference vs Numba CPU kernels vs PyTorch CPU, in one process.

Cases (float32, ``B=1``, ``H=4``, ``d=64`` by default, ``N`` from ``--sizes``):

* ``sdpa``: forward and forward+backward, causal and not — NumPy reference
  (:func:`refattn.attention.softmax.sdpa_forward`), the fused Numba kernel
  (:mod:`refattn.kernels.cpu.flash`) and ``torch.nn.functional.scaled_dot_product_attention``;
* ``diff``: differential attention core (``dv = 2d``) — NumPy reference, the fused Numba kernel and
  the torch composition ``sdpa(q1, k1, v) - lam * sdpa(q2, k2, v)`` (two SDPA calls);
* ``linear``: causal linear attention — NumPy reference scan vs the Numba chunked scan.

Every case runs twice in the same process:

1. **single thread** (the like-for-like comparison): Numba, torch and every BLAS library at one
   thread, timed in *process CPU time*, which moves much less than wall time on a shared machine;
2. **all cores** (``--threads``, default all): the same thread count for Numba, torch and NumPy's
   BLAS, timed in wall-clock time.

Both modes report the sgemm rate of the same run (NumPy and torch, ``2048^3``) and which BLAS
kernel ran (``threadpoolctl``), medians of interleaved rounds (each round calls every
implementation once, so a burst of outside load hits all of them), speed ratios as medians of the
per-round ratios, GFLOP/s (``4BHN^2d`` forward, x0.5 causal, x3.5 forward+backward) and the
kernel's share of the same run's sgemm. A sample that takes less than ``--min-sample-ms`` repeats
the call until it does, so that the small sizes of ``--quick`` are not dominated by timer and
thread wake-up noise. Also measured: peak extra memory per head at ``--memory-n`` (tracemalloc,
which sees NumPy's allocations and those of Numba-compiled code alike; the kernels' scratch is
also given analytically) and, with
``--cold-start``, the one-time compile cost of the kernels in a fresh process with an empty
cache and the load time from the on-disk cache in a second one.

torch is optional and imported lazily. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment
change NumPy's BLAS; run the benchmark with them unset (``benchmarks/run.py`` says how).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

__all__ = ["main", "run"]


# --------------------------------------------------------------------------------------------
# Machine information and thread control


def blas_info() -> list[dict]:
    """Every BLAS / OpenMP library loaded in the process (threadpoolctl), with its kernel
    ("architecture") and thread count; empty when threadpoolctl is not installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return [{k: lib.get(k) for k in ("user_api", "internal_api", "version", "architecture", "num_threads",
                                     "threading_layer", "filepath")} for lib in threadpool_info()]


def set_threads(n: int, torch) -> None:
    """Numba, torch and every BLAS library at ``n`` threads (the kernels pin the BLAS they call
    to one thread per Numba worker themselves)."""
    import numba

    numba.set_num_threads(n)
    if torch is not None:
        torch.set_num_threads(n)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(n, user_api="blas")


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _clock(mode: str):
    return time.process_time if mode == "1thread" else time.perf_counter


def _sample(fn, clock, min_s: float) -> float:
    """Time of one call: the mean over enough back-to-back calls to take ``min_s``."""
    t0 = clock()
    fn()
    dt = clock() - t0
    if dt >= min_s:
        return dt
    reps = min(1000, int(min_s / max(dt, 1e-6)) + 1)
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps


def sgemm_gflops(mode: str, torch, n: int = 2048, repeats: int = 5) -> dict:
    """float32 GEMM rate (NumPy BLAS and torch) at ``n^3`` in the clock of ``mode``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    clock = _clock(mode)
    fns = {"numpy": lambda: a @ b}
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        fns["torch"] = lambda: ta @ tb
    out = {}
    for name, fn in fns.items():
        fn()
        out[name] = 2 * n**3 / statistics.median(_sample(fn, clock, 0.0) for _ in range(repeats)) / 1e9
    return out


def memory_bandwidth_gbs(mode: str) -> float:
    """Copy bandwidth (read + write bytes / s) of a 64 MiB float32 array: the memory roof."""
    a = np.ones(16 << 20, dtype=np.float32)
    b = np.empty_like(a)
    clock = _clock(mode)
    np.copyto(b, a)
    t = statistics.median(_sample(lambda: np.copyto(b, a), clock, 0.0) for _ in range(5))
    return 2 * a.nbytes / t / 1e9


def _peak_numpy_bytes(fn) -> int:
    """tracemalloc peak of the allocations of one call: NumPy's, and Numba's inside the kernels
    (Numba's runtime allocates through Python's raw allocator, which tracemalloc traces)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    res = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del res
    return int(peak)


# --------------------------------------------------------------------------------------------
# Timing


def _measure(impls: dict, *, mode: str, repeats: int, min_s: float, flops: float, fb_factor: float,
             ref: str) -> dict:
    """Time every implementation's forward and forward+backward, interleaved: each round runs
    every implementation once, and the ratios ``t_ref / t_impl`` are medians of the per-round
    ratios. One warm-up call each first."""
    clock = _clock(mode)
    for f_fwd, f_fb in impls.values():
        f_fwd()
        f_fb()
    t = {name: {"fwd": [], "fb": []} for name in impls}
    for _ in range(repeats):
        for key, idx in (("fwd", 0), ("fb", 1)):
            for name, fns in impls.items():
                t[name][key].append(_sample(fns[idx], clock, min_s))
    rows = {}
    for name in impls:
        tf, tb = t[name]["fwd"], t[name]["fb"]
        row = {"fwd_s": statistics.median(tf), "fwd_bwd_s": statistics.median(tb),
               "fwd_min_s": min(tf), "fwd_bwd_min_s": min(tb)}
        row["fwd_gflops"] = flops / row["fwd_s"] / 1e9
        row["fwd_bwd_gflops"] = fb_factor * flops / row["fwd_bwd_s"] / 1e9
        for other in impls:
            if other != name:
                row[f"fwd_speed_vs_{other}"] = statistics.median(a / b for a, b in zip(t[other]["fwd"], tf))
                row[f"fwd_bwd_speed_vs_{other}"] = statistics.median(a / b for a, b in zip(t[other]["fb"], tb))
        rows[name] = row
    return rows


def kernel_scratch_bytes(kind: str, *, threads: int, d: int, dv: int, r: int = 1, bq: int | None = None,
                         bk: int | None = None, itemsize: int = 4, softcap: bool = False, m: int = 0,
                         heads: int = 1) -> int:
    """Analytic scratch of the Numba attention kernels: the tiles (allocated per work item inside
    the parallel loop, so at most ``threads`` at a time; default tile sizes unless given) plus, for
    ``m`` keys of ``heads`` kv heads, the built-in products' panels of the K tiles (and in the
    backward of the V tiles), packed once per call (zero-padded to whole panels)."""
    from refattn.kernels.cpu._common import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q
    from refattn.kernels.cpu._gemm import KC, panel_width

    bq = DEFAULT_BLOCK_Q if bq is None else bq
    bk = DEFAULT_BLOCK_K if bk is None else bk
    th = bq * bk if softcap else 0  # the tanh tile, allocated only under a softcap
    if kind == "fwd":  # s, P V, acc, m, row sums, row maxima (+ th) + float64 l, alpha
        per = (bq * bk + bq * dv + r * bq * dv + r * bq + 2 * bq + th) * itemsize + (r * bq + bq) * 8
    else:  # s, dp, ds, tile products, 2 row vectors (+ th) + float64 dK, dV accumulators
        per = (3 * bq * bk + max(bq, bk) * max(d, dv) + 2 * bq + th) * itemsize + (r * d + dv) * bk * 8
    nr = panel_width(np.float32 if itemsize == 4 else np.float64)
    per += ((bq if kind == "fwd" else max(bq, bk)) + KC) * nr * itemsize  # the products' work buffer
    tiles = -(-m // bk) if m else 0
    padded = tiles * -(-min(bk, m) // nr) * nr if m else 0
    panels = heads * padded * (r * d + (dv if kind != "fwd" else 0)) * itemsize
    return per * threads + panels


# --------------------------------------------------------------------------------------------
# Cases


def _blas_variants(fwd, fb) -> dict:
    """The Numba implementations of a case (``runtime.set_blas``): ``numba`` with the built-in tile
    products (the default), ``numba_openblas`` with SciPy's BLAS and, where oneMKL can be loaded,
    ``numba_mkl``; each call sets its choice and restores the previous one."""
    from refattn.kernels.cpu import runtime

    def under(name, fn):
        def call():
            prev = runtime.get_blas()
            runtime.set_blas(name)
            try:
                return fn()
            finally:
                runtime.set_blas(prev)
        return call

    out = {"numba": (under("builtin", fwd), under("builtin", fb)),
           "numba_openblas": (under("scipy", fwd), under("scipy", fb))}
    if runtime.mkl_available():
        out["numba_mkl"] = (under("mkl", fwd), under("mkl", fb))
    return out


def _sdpa_flops(b, h, n, d, causal):
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def _case_sdpa(n, *, b, h, d, causal, numpy_max, torch):
    from refattn.attention.softmax import sdpa_backward, sdpa_forward
    from refattn.kernels.cpu.flash import flash_attention_backward, flash_attention_forward

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(3))
    g = rng.standard_normal((b, h, n, d), dtype=np.float32)

    def nb_fwd():
        return flash_attention_forward(q, k, v, is_causal=causal)

    def nb_fb():
        return flash_attention_backward(g, flash_attention_forward(q, k, v, is_causal=causal)[1])

    impls = _blas_variants(nb_fwd, nb_fb)
    if n <= numpy_max:
        def np_fwd():
            return sdpa_forward(q, k, v, is_causal=causal)

        def np_fb():
            return sdpa_backward(g, sdpa_forward(q, k, v, is_causal=causal)[1])

        impls["numpy"] = (np_fwd, np_fb)
    if torch is not None:
        F = torch.nn.functional
        tq, tk, tv, tg = (torch.from_numpy(a) for a in (q, k, v, g))

        def t_fwd():
            with torch.inference_mode():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        def t_fb():
            xs = [x.detach().requires_grad_() for x in (tq, tk, tv)]
            return torch.autograd.grad(F.scaled_dot_product_attention(*xs, is_causal=causal), xs, tg)

        impls["torch"] = (t_fwd, t_fb)
    # minimum bytes a forward must move: q, k, v, out (float32) and the LSE
    return impls, _sdpa_flops(b, h, n, d, causal), 3.5, "torch", 4 * b * h * n * (4 * d + 1)


def _case_diff(n, *, b, h, d, causal, numpy_max, torch):
    from refattn.attention.differential import diff_attention_core_backward, diff_attention_core_forward
    from refattn.kernels.cpu.differential import diff_attention_backward, diff_attention_forward

    rng = np.random.default_rng(n + 1)
    q1, k1, q2, k2 = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(4))
    v = rng.standard_normal((b, h, n, 2 * d), dtype=np.float32)
    g = rng.standard_normal((b, h, n, 2 * d), dtype=np.float32)
    lam = np.full((h, 1), 0.6, dtype=np.float32)
    cfg = {"is_causal": causal, "causal_alignment": "top_left"}

    def nb_fwd():
        return diff_attention_forward(q1, k1, q2, k2, v, lam, **cfg)

    def nb_fb():
        return diff_attention_backward(g, diff_attention_forward(q1, k1, q2, k2, v, lam, **cfg)[1])

    impls = _blas_variants(nb_fwd, nb_fb)
    if n <= numpy_max:
        def np_fwd():
            return diff_attention_core_forward(q1, k1, q2, k2, v, lam, **cfg)

        def np_fb():
            return diff_attention_core_backward(g, diff_attention_core_forward(q1, k1, q2, k2, v, lam, **cfg)[1])

        impls["numpy"] = (np_fwd, np_fb)
    if torch is not None:
        F = torch.nn.functional
        t = [torch.from_numpy(a) for a in (q1, k1, q2, k2, v, g)]
        tl = torch.from_numpy(lam)[None, :, :, None]

        def comp(a1, b1, a2, b2, vv):
            return (F.scaled_dot_product_attention(a1, b1, vv, is_causal=causal)
                    - tl * F.scaled_dot_product_attention(a2, b2, vv, is_causal=causal))

        def t_fwd():
            with torch.inference_mode():
                return comp(*t[:5])

        def t_fb():
            xs = [x.detach().requires_grad_() for x in t[:5]]
            return torch.autograd.grad(comp(*xs), xs, t[5])

        impls["torch_two_sdpa"] = (t_fwd, t_fb)
    # two maps: QK^T at d and PV at dv = 2d each
    fl = 2 * (_sdpa_flops(b, h, n, d, causal) + _sdpa_flops(b, h, n, 2 * d, causal)) / 2
    return impls, fl, 3.5, "torch_two_sdpa", 4 * b * h * n * (4 * d + 4 * d + 2)


def _case_linear(n, *, b, h, d, causal, numpy_max, torch):
    from refattn.attention.linear import causal_linear_attention_backward, causal_linear_attention_forward
    from refattn.kernels.cpu import linear as kl

    rng = np.random.default_rng(n + 2)
    q, k, v = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(3))
    g = rng.standard_normal((b, h, n, d), dtype=np.float32)
    impls = {
        "numba": (lambda: kl.causal_linear_attention_forward(q, k, v),
                  lambda: kl.causal_linear_attention_backward(g, kl.causal_linear_attention_forward(q, k, v)[1])),
        "numpy": (lambda: causal_linear_attention_forward(q, k, v),
                  lambda: causal_linear_attention_backward(g, causal_linear_attention_forward(q, k, v)[1])),
    }
    fl = 4.0 * b * h * n * d * d + 2.0 * b * h * n * d  # state update + readout + denominator (scan form)
    return impls, fl, 3.0, "numpy", 4 * b * h * n * 4 * d


_CASES = {"sdpa": _case_sdpa, "diff": _case_diff, "linear": _case_linear}


def memory_per_head(n: int, *, d: int = 64, threads: int = 1) -> dict:
    """Measured peak NumPy allocations of one head's Numba forward and forward+backward at length
    ``n`` (float32), plus the analytic kernel scratch (tiles and the built-in products' K and V
    panels), in MiB per head."""
    from refattn.kernels.cpu.flash import flash_attention_backward, flash_attention_forward

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 1, n, d), dtype=np.float32) for _ in range(4))
    # warm up (loading the compiled kernels allocates Python objects that tracemalloc would count)
    flash_attention_backward(g[..., :8, :], flash_attention_forward(q[..., :8, :], k[..., :8, :], v[..., :8, :])[1])
    mib = 1 << 20
    fwd = _peak_numpy_bytes(lambda: flash_attention_forward(q, k, v))
    fb = _peak_numpy_bytes(lambda: flash_attention_backward(g, flash_attention_forward(q, k, v)[1]))
    from refattn.kernels.cpu._common import bwd_block_k, sdpa_blocks

    bq, bk = sdpa_blocks(n, False)  # the tiles flash_attention_forward picks for this case
    bk = bwd_block_k(-1, bk)  # ... and the backward's key tiles with the built-in products
    scratch = kernel_scratch_bytes("bwd", threads=threads, d=d, dv=d, bq=bq, bk=bk, m=n)
    return {"N": n, "d": d, "fwd_numpy_peak_MiB": fwd / mib, "fwd_bwd_numpy_peak_MiB": fb / mib,
            "kernel_scratch_MiB": scratch / mib, "fwd_bwd_total_MiB": fb / mib,
            "inputs_MiB": 4 * n * d * 4 / mib, "dense_scores_MiB_for_comparison": n * n * 4 / mib}


_COLD_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy as np
from refattn.kernels.cpu import flash, linear
t_import = time.perf_counter() - t0
rng = np.random.default_rng(0)
q, k, v, g = (rng.standard_normal((1, 2, 64, 16), dtype=np.float32) for _ in range(4))
t = time.perf_counter(); out, c = flash.flash_attention_forward(q, k, v); t_fwd = time.perf_counter() - t
t = time.perf_counter(); flash.flash_attention_backward(g, c); t_bwd = time.perf_counter() - t
t = time.perf_counter(); lo, lc = linear.causal_linear_attention_forward(q, k, v); t_lf = time.perf_counter() - t
t = time.perf_counter(); linear.causal_linear_attention_backward(g, lc); t_lb = time.perf_counter() - t
print(json.dumps({"import_s": t_import, "sdpa_fwd_first_call_s": t_fwd, "sdpa_bwd_first_call_s": t_bwd,
                  "linear_fwd_first_call_s": t_lf, "linear_bwd_first_call_s": t_lb}))
"""


def cold_start() -> dict:
    """First-call times of the float32 kernels in a fresh process with an empty cache folder
    (``NUMBA_CACHE_DIR``: compile + write), then in a second fresh process (load from the cache)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = {}
    with tempfile.TemporaryDirectory(prefix="refattn-cold-") as tmp:
        env["NUMBA_CACHE_DIR"] = tmp
        for label in ("compile", "cached"):
            t = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", _COLD_SCRIPT], env=env, capture_output=True, text=True,
                                 timeout=900)
            if res.returncode != 0:
                return {"error": res.stderr[-2000:]}
            out[label] = json.loads(res.stdout.strip().splitlines()[-1])
            out[label]["process_s"] = time.perf_counter() - t
            out[label]["stderr"] = res.stderr.strip()
    return out


# --------------------------------------------------------------------------------------------
# Reporting


def _fmt_ms(x):
    return f"{x * 1e3:.1f}" if x is not None else "—"


def _ratio(x):
    return f"{x:.2f}x" if x is not None else "—"


def markdown(report: dict) -> str:
    m = report["machine"]
    blas = "; ".join(f"{lib['internal_api']} {lib['version']} kernel `{lib['architecture']}` "
                     f"({Path(lib['filepath']).name})" for lib in m["blas"] if lib.get("user_api") == "blas")
    lines = [
        "# refattn benchmark",
        "",
        f"- CPU: {m['cpu']} ({m['cores']} cores); Python {m['python']}, NumPy {m['numpy']}, Numba {m['numba']} "
        f"(threading layer {m.get('numba_threading_layer')}), torch {m.get('torch')}",
        f"- BLAS kernels in use (threadpoolctl): {blas or 'threadpoolctl not installed'}; `numba` rows: the "
        f"kernels' tile products are {m.get('kernel_products')}; `numba_openblas` rows: the same kernels with "
        f"SciPy's BLAS ({m.get('kernel_blas')}), which the causal linear scan always uses"
        + (f"; `numba_mkl` rows: with oneMKL's tile products, {m['kernel_blas_mkl']}"
           if m.get("kernel_blas_mkl") else ""),
        f"- environment: {m['env']}",
        f"- load average (1, 5, 15 min; other processes share this machine) before / after: "
        f"{m.get('loadavg_before')} / {m.get('loadavg_after')}",
        f"- B={m['B']}, H={m['H']}, d={m['d']}, float32; {m['repeats']} interleaved rounds, samples of at least "
        f"{m['min_sample_ms']} ms; times are medians (minimum in brackets), speed ratios medians of per-round "
        "ratios; FLOPs 4BHN²d forward (x0.5 causal), x3.5 forward+backward (differential: both maps, dv = 2d).",
        "",
    ]
    for mode in report["modes"]:
        mr = report["modes"][mode]
        sg = mr["sgemm"]
        title = ("Single thread, process CPU time" if mode == "1thread"
                 else f"All cores ({mr['threads']} threads), wall-clock time")
        lines += [f"## {title}", "",
                  f"sgemm 2048³ in this run: NumPy {sg['numpy']:.1f} GFLOP/s"
                  + (f", torch {sg['torch']:.1f} GFLOP/s" if "torch" in sg else "")
                  + f"; copy bandwidth {mr['bandwidth_gbs']:.1f} GB/s.", ""]
        for case in ("sdpa", "diff", "linear"):
            rows = [r for r in mr["results"] if r["case"] == case]
            if not rows:
                continue
            ref = rows[0]["ref"]
            lines += [f"### {case}", "",
                      f"| N | causal | impl | fwd ms | fwd GFLOP/s (% sgemm) | fwd+bwd ms | fwd+bwd GFLOP/s | "
                      f"speed vs {ref}: fwd | fwd+bwd | speed vs NumPy: fwd | fwd+bwd |",
                      "|---|---|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                for name, x in r["impl"].items():
                    pct = 100 * x["fwd_gflops"] / sg["numpy"]
                    lines.append(
                        f"| {r['N']} | {r['causal']} | {name} | {_fmt_ms(x['fwd_s'])} ({_fmt_ms(x['fwd_min_s'])}) | "
                        f"{x['fwd_gflops']:.1f} ({pct:.0f} %) | {_fmt_ms(x['fwd_bwd_s'])} ({_fmt_ms(x['fwd_bwd_min_s'])}) | "
                        f"{x['fwd_bwd_gflops']:.1f} | {_ratio(x.get(f'fwd_speed_vs_{ref}'))} | "
                        f"{_ratio(x.get(f'fwd_bwd_speed_vs_{ref}'))} | {_ratio(x.get('fwd_speed_vs_numpy'))} | "
                        f"{_ratio(x.get('fwd_bwd_speed_vs_numpy'))} |")
            lines.append("")
    if report.get("memory"):
        mm = report["memory"]
        lines += ["## Memory per head (Numba flash kernel, float32)", "",
                  f"N={mm['N']}, d={mm['d']}: forward {mm['fwd_numpy_peak_MiB']:.1f} MiB, forward+backward "
                  f"{mm['fwd_bwd_total_MiB']:.1f} MiB at the peak (tracemalloc, which sees NumPy's and the compiled "
                  f"kernels' allocations: outputs, LSE, caches, gradients, dQ partials, tiles, K and V panels; the "
                  f"kernel scratch alone, analytic: {mm['kernel_scratch_MiB']:.2f} MiB); inputs "
                  f"{mm['inputs_MiB']:.1f} MiB; a dense N×N score matrix "
                  f"would be {mm['dense_scores_MiB_for_comparison']:.0f} MiB.", ""]
    if report.get("cold_start"):
        cs = report["cold_start"]
        if "error" in cs:
            lines += ["## Cold start", "", f"failed: {cs['error']}", ""]
        else:
            lines += ["## Cold start (fresh process, float32, first call of each kernel)", "",
                      "| | import | SDPA fwd | SDPA bwd | linear fwd | linear bwd | whole process |",
                      "|---|---|---|---|---|---|---|"]
            for label in ("compile", "cached"):
                c = cs[label]
                lines.append(f"| {'empty cache (compile)' if label == 'compile' else 'from the on-disk cache'} | "
                             f"{c['import_s']:.1f} s | {c['sdpa_fwd_first_call_s']:.1f} s | "
                             f"{c['sdpa_bwd_first_call_s']:.1f} s | {c['linear_fwd_first_call_s']:.1f} s | "
                             f"{c['linear_bwd_first_call_s']:.1f} s | {c['process_s']:.1f} s |")
            lines += ["", "Messages printed during the compiling run:", "", "```",
                      cs["compile"]["stderr"] or "(none)", "```", ""]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> bool:
    """Roofline chart: achieved GFLOP/s of every implementation against the algorithmic arithmetic
    intensity of its case, under the same run's sgemm (compute roof) and copy bandwidth (memory
    roof), one panel per thread mode."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    modes = list(report["modes"])
    fig, axes = plt.subplots(1, len(modes), figsize=(6.4 * len(modes), 4.8), squeeze=False)
    markers = {"sdpa": "o", "diff": "s", "linear": "^"}
    colors = {"numba": "C0", "numba_openblas": "C4", "numba_mkl": "C3", "torch": "C1", "torch_two_sdpa": "C1", "numpy": "C2"}
    for ax, mode in zip(axes[0], modes):
        mr = report["modes"][mode]
        peak = mr["sgemm"]["numpy"]
        bw = mr["bandwidth_gbs"]
        xs = np.logspace(-1, 4, 200)
        ax.plot(xs, np.minimum(peak, bw * xs), color="k", lw=1.2)
        ax.axhline(peak, color="k", lw=0.6, ls=":")
        ax.text(1.5e3, peak * 1.06, f"sgemm {peak:.0f} GFLOP/s (this run)", fontsize=7, ha="right")
        ax.text(0.15, bw * 0.25, f"copy {bw:.0f} GB/s", fontsize=7, rotation=38)
        seen = set()
        for r in mr["results"]:
            ai = r["flops"] / r["min_bytes"]
            for name, x in r["impl"].items():
                label = f"{name} {r['case']}" + (" causal" if r["causal"] and r["case"] != "linear" else "")
                fill = "none" if r["causal"] else colors.get(name, "C3")
                ax.scatter([ai], [x["fwd_gflops"]], marker=markers[r["case"]], s=22 + r["N"] / 160,
                           edgecolors=colors.get(name, "C3"), facecolors=fill,
                           label=label if label not in seen else None)
                seen.add(label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(0.5, peak * 2)
        ax.set_xlabel("arithmetic intensity, forward (flop per byte of q, k, v, out)")
        ax.set_ylabel("achieved GFLOP/s, forward")
        ax.set_title("single thread (CPU time)" if mode == "1thread" else f"{mr['threads']} threads (wall time)")
        ax.legend(fontsize=6, loc="lower right", ncol=2)
    fig.suptitle(f"refattn CPU kernels vs this run's sgemm — float32, B={report['machine']['B']}, "
                 f"H={report['machine']['H']}, d={report['machine']['d']}, N in "
                 f"{sorted({r['N'] for m in report['modes'].values() for r in m['results']})} (bigger = larger N)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# --------------------------------------------------------------------------------------------
# Entry points


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _loadavg():
    return tuple(round(x, 2) for x in os.getloadavg()) if hasattr(os, "getloadavg") else None


def run(*, sizes, threads, repeats, cases, numpy_max, memory_n, b=1, h=4, d=64, modes=("1thread", "allcore"),
        min_sample_ms=20.0, cold=False, log=print) -> dict:
    import numba

    from refattn.kernels.cpu import runtime

    torch = _torch()
    machine = {"cpu": _cpu_name(), "cores": os.cpu_count(), "numpy": np.__version__, "numba": numba.__version__,
               "python": sys.version.split()[0], "torch": None if torch is None else torch.__version__,
               "B": b, "H": h, "d": d, "repeats": repeats, "min_sample_ms": min_sample_ms,
               "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS",
                                                      "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "NUMBA_NUM_THREADS")},
               "loadavg_before": _loadavg(), "kernel_blas": "; ".join(runtime.blas_libraries()) or "unknown"}
    machine["kernel_blas_mkl"] = runtime.mkl_description() if runtime.mkl_available() else None
    prev = runtime.get_blas()
    runtime.set_blas("builtin")
    machine["kernel_products"] = runtime.blas_description()
    runtime.set_blas(prev)
    report = {"machine": machine, "modes": {}}
    for mode in modes:
        nthreads = 1 if mode == "1thread" else threads
        set_threads(nthreads, torch)
        mr = {"threads": nthreads, "sgemm": sgemm_gflops(mode, torch), "bandwidth_gbs": memory_bandwidth_gbs(mode),
              "results": []}
        log(f"[{mode}] sgemm {mr['sgemm']}, copy {mr['bandwidth_gbs']:.1f} GB/s, load {_loadavg()}")
        for n in sizes:
            for case in cases:
                for causal in ((True,) if case == "linear" else (False, True)):
                    impls, fl, fb_factor, ref, min_bytes = _CASES[case](
                        n, b=b, h=h, d=d, causal=causal, numpy_max=numpy_max, torch=torch)
                    rows = _measure(impls, mode=mode, repeats=repeats, min_s=min_sample_ms / 1e3, flops=fl,
                                    fb_factor=fb_factor, ref=ref)
                    mr["results"].append({"case": case, "N": n, "causal": causal, "ref": ref, "flops": fl,
                                          "min_bytes": min_bytes, "impl": rows})
                    log(f"[{mode}] {case} N={n} causal={causal}: " + ", ".join(
                        f"{k} fwd {v['fwd_s'] * 1e3:.1f} ms ({v['fwd_gflops']:.0f} GF)" for k, v in rows.items()))
        report["modes"][mode] = mr
    blas = blas_info()  # after the runs: every library is loaded and threads are as last set
    machine["blas"] = blas
    try:
        machine["numba_threading_layer"] = numba.threading_layer()
    except ValueError:
        pass
    if memory_n and "sdpa" in cases:  # the memory figure is the flash kernel's
        report["memory"] = memory_per_head(memory_n, d=d, threads=threads)
        log(json.dumps(report["memory"]))
    if cold:
        report["cold_start"] = cold_start()
        log(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "stderr"} if isinstance(v, dict) else v
                        for k, v in report["cold_start"].items()}))
    machine["loadavg_after"] = _loadavg()
    return report


def main(argv: list[str] | None = None) -> int:
    """``refattn bench [--sizes 1024 2048 4096] [--threads T] [--repeats R] [--quick] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="refattn bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths N")
    p.add_argument("--quick", action="store_true",
                   help="N in {512, 1024}, 3 rounds, no memory or cold-start run (ratios at small N are "
                        "still measured like-for-like, samples of at least --min-sample-ms)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of the all-core run")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--min-sample-ms", type=float, default=20.0, help="repeat short calls up to this time per sample")
    p.add_argument("--modes", nargs="+", default=["1thread", "allcore"], choices=["1thread", "allcore"])
    p.add_argument("--cases", nargs="+", default=["sdpa", "diff", "linear"], choices=["sdpa", "diff", "linear"])
    p.add_argument("--numpy-max", type=int, default=2048, help="skip the NumPy reference above this N")
    p.add_argument("--memory-n", type=int, default=16384,
                   help="N of the per-head memory measurement of the SDPA kernel (0: skip; runs with --cases sdpa)")
    p.add_argument("--cold-start", action="store_true",
                   help="also time the first calls in fresh processes (empty cache: compile; then cached)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output directory")
    args = p.parse_args(argv)
    # torch (its bundled libgomp) and Numba's "omp" threading layer each keep an OpenMP pool in
    # this process; with the default active spin-wait the idle pool's workers steal the cores from
    # the busy one (measured: torch SDPA at N=128 went from ~3 ms to ~80 ms on 2 cores). Passive
    # waiting is set before either runtime starts unless the caller chose a policy.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.threads < 1 or args.repeats < 1 or any(n < 1 for n in args.sizes):
        p.error("--threads, --repeats and --sizes must be positive")
    cold = args.cold_start
    if args.quick:
        args.sizes, args.repeats, args.memory_n, cold = [512, 1024], 3, 0, False
    report = run(sizes=args.sizes, threads=args.threads, repeats=args.repeats, cases=args.cases,
                 numpy_max=args.numpy_max, memory_n=args.memory_n, h=args.heads, modes=tuple(args.modes),
                 min_sample_ms=args.min_sample_ms, cold=cold, log=lambda s: print(s, file=sys.stderr, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (args.out / "bench.md").write_text(md + "\n")
    plotted = plot(report, args.out / "roofline.png")
    print(md)
    print(f"\nwrote {args.out / 'bench.json'}, {args.out / 'bench.md'}"
          + (f", {args.out / 'roofline.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
