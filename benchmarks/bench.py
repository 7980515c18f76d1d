"""``refattn bench``: NumPy reference vs Numba CPU kernels vs PyTorch CPU, in one process.

Cases (float32, ``B=1, H=8, d=64`` by default, ``N`` from ``--sizes``):

* ``sdpa``: forward and forward+backward, causal and not — NumPy reference
  (:func:`refattn.attention.softmax.sdpa_forward`), the fused Numba kernel
  (:mod:`refattn.kernels.cpu.flash`) and ``torch.nn.functional.scaled_dot_product_attention``;
* ``diff``: differential attention core (``dv = 2d``) — NumPy reference, the fused Numba kernel and
  the torch composition ``sdpa(q1, k1, v) - lam * sdpa(q2, k2, v)``;
* ``linear``: causal linear attention — NumPy reference scan vs the Numba scan kernels.

torch and Numba run with the same thread count (``torch.set_num_threads`` /
``numba.set_num_threads``); the OpenBLAS under NumPy is set to it too where it can be reached
(numpy's bundled ``scipy_openblas``). Reported: median wall time, ratios, GFLOP/s (``4BHN^2d``
forward, x0.5 causal, backward x2.5), the measured sgemm GFLOP/s of the machine, which BLAS kernel
ran, and peak extra memory: ``tracemalloc`` peak of NumPy arrays allocated by the call (the kernels'
outputs, caches and partial buffers) plus an analytic count of the Numba kernels' per-thread tile
scratch (NRT allocations are not seen by tracemalloc).

torch is optional and imported lazily. OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the environment
change NumPy's BLAS; run the benchmark with them unset (``benchmarks/run.py`` says how).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

__all__ = ["main", "run"]


# --------------------------------------------------------------------------------------------
# Machine information


def _openblas():
    """ctypes handle of NumPy's bundled OpenBLAS, or None."""
    import ctypes
    import glob

    libdir = Path(np.__file__).parent.parent / "numpy.libs"
    for path in glob.glob(str(libdir / "libscipy_openblas*.so")):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def blas_info(threads: int | None = None) -> dict:
    """Which BLAS NumPy uses, its core type and thread count (sets the threads when asked)."""
    import ctypes

    info = {"env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                                   "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "OMP_WAIT_POLICY")}}
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        info["numpy_blas"] = f"{cfg.get('name')} {cfg.get('version')}"
    except Exception as exc:  # pragma: no cover - depends on the numpy build
        info["numpy_blas"] = f"unknown ({exc})"
    lib = _openblas()
    if lib is not None:
        for sym in ("scipy_openblas_get_corename64_", "openblas_get_corename"):
            if hasattr(lib, sym):
                fn = getattr(lib, sym)
                fn.restype = ctypes.c_char_p
                info["openblas_core"] = fn().decode()
                break
        for sym in ("scipy_openblas_get_config64_", "openblas_get_config"):
            if hasattr(lib, sym):
                fn = getattr(lib, sym)
                fn.restype = ctypes.c_char_p
                info["openblas_config"] = fn().decode()
                break
        if threads is not None and hasattr(lib, "scipy_openblas_set_num_threads64_"):
            lib.scipy_openblas_set_num_threads64_(ctypes.c_int(threads))
        if hasattr(lib, "scipy_openblas_get_num_threads64_"):
            info["openblas_threads"] = int(lib.scipy_openblas_get_num_threads64_())
    return info


def sgemm_gflops(n: int = 2048, repeats: int = 5) -> dict:
    """Measured float32 GEMM rate (NumPy BLAS and, when installed, torch) at n x n x n."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = {"n": n, "numpy": 2 * n**3 / _median(lambda: a @ b, repeats) / 1e9}
    torch = _torch()
    if torch is not None:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        out["torch"] = 2 * n**3 / _median(lambda: ta @ tb, repeats) / 1e9
    return out


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _median(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``repeats`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _peak_numpy_bytes(fn) -> int:
    """tracemalloc peak of the Python-visible (NumPy) allocations of one call."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    res = fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    del res
    return int(peak)


def _measure(impls: dict, repeats: int, flops: float, fb_factor: float, ref: str, mem_names=()) -> dict:
    """Time every implementation's forward and forward+backward, *interleaved*: each round runs
    every implementation once, so load from other processes hits them alike; the speed ratios
    are medians of the per-round ratios ``t_ref / t_impl``. One warm-up call each first."""
    for f_fwd, f_fb in impls.values():
        f_fwd()
        f_fb()
    t = {name: {"fwd": [], "fb": []} for name in impls}
    for _ in range(repeats):
        for key, idx in (("fwd", 0), ("fb", 1)):
            for name, fns in impls.items():
                t0 = time.perf_counter()
                fns[idx]()
                t[name][key].append(time.perf_counter() - t0)
    rows = {}
    for name, (_, f_fb) in impls.items():
        tf, tb = t[name]["fwd"], t[name]["fb"]
        row = {"fwd_s": statistics.median(tf), "fwd_bwd_s": statistics.median(tb), "fwd_min_s": min(tf),
               "fwd_bwd_min_s": min(tb)}
        row["fwd_gflops"] = flops / row["fwd_s"] / 1e9
        row["fwd_bwd_gflops"] = fb_factor * flops / row["fwd_bwd_s"] / 1e9
        if ref in t:
            row[f"fwd_speed_vs_{ref}"] = statistics.median(a / b for a, b in zip(t[ref]["fwd"], tf))
            row[f"fwd_bwd_speed_vs_{ref}"] = statistics.median(a / b for a, b in zip(t[ref]["fb"], tb))
        if name in mem_names:
            row["fwd_bwd_peak_numpy_bytes"] = _peak_numpy_bytes(f_fb)
        rows[name] = row
    return rows


def kernel_scratch_bytes(kind: str, *, threads: int, d: int, dv: int, r: int = 1, bq: int | None = None,
                         bk: int | None = None, itemsize: int = 4) -> int:
    """Analytic tile scratch of the Numba attention kernels (allocated per work item inside the
    parallel loop, so at most ``threads`` at a time), default tile sizes unless given."""
    from refattn.kernels.cpu._common import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q

    bq = DEFAULT_BLOCK_Q if bq is None else bq
    bk = DEFAULT_BLOCK_K if bk is None else bk
    if kind == "fwd":  # s, th, kt, e2, acc, m, l
        per = (2 * bq * bk + d * bk + bk + r * bq * dv + 2 * r * bq) * itemsize
    else:  # s, th, dp, e2, kt, vt, dkt, dvt, dqt + float64 dka, dva
        per = (3 * bq * bk + bk + 2 * (d + dv) * bk + bq * d) * itemsize + (d + dv) * bk * 8
    return per * threads


# --------------------------------------------------------------------------------------------
# Cases


def _sdpa_flops(b, h, n, d, causal):
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def _bench_sdpa(n, *, b, h, d, causal, repeats, numpy_max, torch, results, mem):
    from refattn.attention.softmax import sdpa_backward, sdpa_forward
    from refattn.kernels.cpu.flash import flash_attention_backward, flash_attention_forward

    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(3))
    g = rng.standard_normal((b, h, n, d), dtype=np.float32)
    fl = _sdpa_flops(b, h, n, d, causal)
    def nb_fwd():
        return flash_attention_forward(q, k, v, is_causal=causal)

    def nb_fb():
        o, c = flash_attention_forward(q, k, v, is_causal=causal)
        return flash_attention_backward(g, c)

    impls = {"numba": (nb_fwd, nb_fb)}
    if n <= numpy_max:
        def np_fwd():
            return sdpa_forward(q, k, v, is_causal=causal)

        def np_fb():
            o, c = sdpa_forward(q, k, v, is_causal=causal)
            return sdpa_backward(g, c)

        impls["numpy"] = (np_fwd, np_fb)
    if torch is not None:
        F = torch.nn.functional
        tq, tk, tv, tg = (torch.from_numpy(a) for a in (q, k, v, g))

        def t_fwd():
            with torch.inference_mode():
                return F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)

        def t_fb():
            qq, kk, vv = (x.detach().requires_grad_() for x in (tq, tk, tv))
            o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
            return torch.autograd.grad(o, (qq, kk, vv), tg)

        impls["torch"] = (t_fwd, t_fb)
    rows = _measure(impls, repeats, fl, 3.5, "torch", ("numba", "numpy") if mem else ())
    results.append({"case": "sdpa", "N": n, "B": b, "H": h, "d": d, "causal": causal, "impl": rows})


def _bench_diff(n, *, b, h, d, causal, repeats, numpy_max, torch, results, mem):
    from refattn.attention.differential import diff_attention_core_backward, diff_attention_core_forward
    from refattn.kernels.cpu.differential import diff_attention_backward, diff_attention_forward

    rng = np.random.default_rng(n + 1)
    q1, k1, q2, k2 = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(4))
    v = rng.standard_normal((b, h, n, 2 * d), dtype=np.float32)
    g = rng.standard_normal((b, h, n, 2 * d), dtype=np.float32)
    lam = np.full((h, 1), 0.6, dtype=np.float32)
    align = {"causal_alignment": "top_left"}
    fl = 2 * (_sdpa_flops(b, h, n, d, causal) + _sdpa_flops(b, h, n, 2 * d, causal)) / 2  # QK^T at d, PV at 2d
    def nb_fwd():
        return diff_attention_forward(q1, k1, q2, k2, v, lam, is_causal=causal, **align)

    def nb_fb():
        o, c = diff_attention_forward(q1, k1, q2, k2, v, lam, is_causal=causal, **align)
        return diff_attention_backward(g, c)

    impls = {"numba": (nb_fwd, nb_fb)}
    if n <= numpy_max:
        def np_fwd():
            return diff_attention_core_forward(q1, k1, q2, k2, v, lam, is_causal=causal, **align)

        def np_fb():
            o, c = diff_attention_core_forward(q1, k1, q2, k2, v, lam, is_causal=causal, **align)
            return diff_attention_core_backward(g, c)

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
    rows = _measure(impls, repeats, fl, 3.5, "torch_two_sdpa", ("numba", "numpy") if mem else ())
    results.append({"case": "diff", "N": n, "B": b, "H": h, "d": d, "dv": 2 * d, "causal": causal, "impl": rows})


def _bench_linear(n, *, b, h, d, repeats, results, mem):
    from refattn.attention.linear import causal_linear_attention_backward, causal_linear_attention_forward
    from refattn.kernels.cpu import linear as kl

    rng = np.random.default_rng(n + 2)
    q, k, v = (rng.standard_normal((b, h, n, d), dtype=np.float32) for _ in range(3))
    g = rng.standard_normal((b, h, n, d), dtype=np.float32)
    fl = 4.0 * b * h * n * d * d + 2.0 * b * h * n * d  # state update + readout + denominator
    impls = {
        "numba": (lambda: kl.causal_linear_attention_forward(q, k, v),
                  lambda: kl.causal_linear_attention_backward(g, kl.causal_linear_attention_forward(q, k, v)[1])),
        "numpy": (lambda: causal_linear_attention_forward(q, k, v),
                  lambda: causal_linear_attention_backward(g, causal_linear_attention_forward(q, k, v)[1])),
    }
    rows = _measure(impls, repeats, fl, 3.0, "numpy", ("numba", "numpy") if mem else ())
    results.append({"case": "linear_causal", "N": n, "B": b, "H": h, "d": d, "causal": True, "impl": rows})


def memory_per_head(n: int, *, d: int = 64, threads: int = 1) -> dict:
    """Measured peak NumPy allocations of one head's Numba forward and forward+backward at length
    ``n`` (float32), plus the analytic kernel scratch, in MiB per head."""
    from refattn.kernels.cpu.flash import flash_attention_backward, flash_attention_forward

    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((1, 1, n, d), dtype=np.float32) for _ in range(4))
    # warm up (loading the compiled kernels allocates Python objects that tracemalloc would count)
    flash_attention_backward(g[..., :8, :], flash_attention_forward(q[..., :8, :], k[..., :8, :], v[..., :8, :])[1])
    inputs = 4 * n * d * 4
    t = time.perf_counter()
    fwd = _peak_numpy_bytes(lambda: flash_attention_forward(q, k, v))
    fb = _peak_numpy_bytes(lambda: flash_attention_backward(g, flash_attention_forward(q, k, v)[1]))
    mib = 1 << 20
    return {"N": n, "d": d, "fwd_numpy_peak_MiB": fwd / mib, "fwd_bwd_numpy_peak_MiB": fb / mib,
            "kernel_scratch_MiB": kernel_scratch_bytes("bwd", threads=threads, d=d, dv=d) / mib,
            "inputs_MiB": inputs / mib, "dense_scores_MiB_for_comparison": n * n * 4 / mib,
            "seconds": time.perf_counter() - t}


# --------------------------------------------------------------------------------------------
# Reporting


def _fmt_s(x):
    return f"{x * 1e3:.1f}" if x is not None else "—"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        "# refattn benchmark",
        "",
        f"- CPU: {m['cpu']}, threads used: {m['threads']} (torch and Numba)",
        f"- NumPy {m['numpy']} BLAS: {m['blas'].get('numpy_blas')}, core `{m['blas'].get('openblas_core')}`, "
        f"threads {m['blas'].get('openblas_threads')}; env {m['blas']['env']}",
        f"- Numba {m['numba']} (threading layer {m.get('numba_threading_layer')}), torch {m.get('torch')}",
        f"- load average before/after (other processes share this machine): {m.get('loadavg_before')} / "
        f"{m.get('loadavg_after')}",
        f"- measured sgemm (n={m['sgemm']['n']}): NumPy {m['sgemm']['numpy']:.1f} GFLOP/s"
        + (f", torch {m['sgemm']['torch']:.1f} GFLOP/s" if "torch" in m["sgemm"] else ""),
        "",
        "Times are medians in ms (minimum in brackets); implementations are timed interleaved (one call "
        "of each per round) and the speed ratios are medians of the per-round ratios; GFLOP/s use the "
        "median times; FLOPs are "
        "4BHN²d (x0.5 causal) forward and x3.5 for forward+backward (differential: both maps, dv = 2d).",
        "",
    ]
    for case in ("sdpa", "diff", "linear_causal"):
        rows = [r for r in report["results"] if r["case"] == case]
        if not rows:
            continue
        ref = "torch_two_sdpa" if case == "diff" else ("torch" if case == "sdpa" else "numpy")
        lines += [f"## {case}", "",
                  "| N | causal | impl | fwd ms (min) | fwd GFLOP/s | fwd+bwd ms (min) | fwd+bwd GFLOP/s | "
                  f"speed vs {ref} fwd | vs {ref} fwd+bwd | peak NumPy MiB (fwd+bwd) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            for name, x in r["impl"].items():
                sp_f = x.get(f"fwd_speed_vs_{ref}")
                sp_b = x.get(f"fwd_bwd_speed_vs_{ref}")
                sp_f = f"{sp_f:.2f}x" if sp_f is not None else "—"
                sp_b = f"{sp_b:.2f}x" if sp_b is not None else "—"
                mem = x.get("fwd_bwd_peak_numpy_bytes")
                mem = f"{mem / 2**20:.1f}" if mem is not None else "—"
                lines.append(f"| {r['N']} | {r['causal']} | {name} | {_fmt_s(x['fwd_s'])} ({_fmt_s(x['fwd_min_s'])}) | "
                             f"{x['fwd_gflops']:.1f} | {_fmt_s(x['fwd_bwd_s'])} ({_fmt_s(x['fwd_bwd_min_s'])}) | "
                             f"{x['fwd_bwd_gflops']:.1f} | {sp_f} | {sp_b} | {mem} |")
        lines.append("")
    if report.get("memory"):
        mm = report["memory"]
        lines += ["## Memory per head (Numba flash kernel, float32)", "",
                  f"N={mm['N']}, d={mm['d']}: forward peak NumPy allocations {mm['fwd_numpy_peak_MiB']:.1f} MiB, "
                  f"forward+backward {mm['fwd_bwd_numpy_peak_MiB']:.1f} MiB (tracemalloc, includes outputs, "
                  f"LSE, caches and gradients), kernel tile scratch {mm['kernel_scratch_MiB']:.2f} MiB (analytic), "
                  f"inputs {mm['inputs_MiB']:.1f} MiB; a dense N×N score matrix would be "
                  f"{mm['dense_scores_MiB_for_comparison']:.0f} MiB.", ""]
    return "\n".join(lines)


def plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cases = [("sdpa", False), ("sdpa", True), ("diff", False), ("linear_causal", True)]
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 3.6))
    for ax, (case, causal) in zip(axes, cases):
        rows = [r for r in report["results"] if r["case"] == case and r["causal"] == causal]
        names = sorted({n for r in rows for n in r["impl"]})
        for ci, name in enumerate(names):
            color = f"C{ci}"
            pts = [(r["N"], r["impl"][name]["fwd_bwd_s"]) for r in rows if name in r["impl"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=color, label=f"{name} fwd+bwd")
            pts = [(r["N"], r["impl"][name]["fwd_s"]) for r in rows if name in r["impl"]]
            if pts:
                ax.plot(*zip(*pts), marker="x", linestyle="--", color=color, label=f"{name} fwd")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel("seconds (median)")
        ax.set_title(f"{case}{' causal' if causal and case != 'linear_causal' else ''}")
        if ax.get_legend_handles_labels()[0]:  # panels of cases that were not run stay empty
            ax.legend(fontsize=6)
    fig.suptitle(f"refattn CPU benchmark, {report['machine']['threads']} threads, float32, B=1 H=8 d=64")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
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


def run(*, sizes, threads, repeats, cases, numpy_max, memory_n, b=1, h=8, d=64, mem=True, log=print) -> dict:
    import numba

    numba.set_num_threads(threads)
    torch = _torch()
    if torch is not None:
        torch.set_num_threads(threads)
    machine = {"cpu": _cpu_name(), "cores": os.cpu_count(), "threads": threads, "numpy": np.__version__,
               "numba": numba.__version__, "numba_threading_layer": None, "python": sys.version.split()[0],
               "torch": None if torch is None else torch.__version__, "blas": blas_info(threads)}
    machine["loadavg_before"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    machine["sgemm"] = sgemm_gflops()
    log(f"sgemm: {machine['sgemm']}; BLAS core {machine['blas'].get('openblas_core')}")
    results: list = []
    for n in sizes:
        for causal in (False, True):
            if "sdpa" in cases:
                _bench_sdpa(n, b=b, h=h, d=d, causal=causal, repeats=repeats, numpy_max=numpy_max, torch=torch,
                            results=results, mem=mem)
                log(json.dumps(results[-1]))
            if "diff" in cases and not causal:
                _bench_diff(n, b=b, h=h, d=d, causal=causal, repeats=repeats, numpy_max=numpy_max, torch=torch,
                            results=results, mem=mem)
                log(json.dumps(results[-1]))
        if "linear" in cases:
            _bench_linear(n, b=b, h=h, d=d, repeats=repeats, results=results, mem=mem)
            log(json.dumps(results[-1]))
    try:
        machine["numba_threading_layer"] = numba.threading_layer()
    except ValueError:
        pass
    machine["loadavg_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    report = {"machine": machine, "results": results}
    if memory_n:
        report["memory"] = memory_per_head(memory_n, d=d, threads=threads)
        log(json.dumps(report["memory"]))
    return report


def main(argv: list[str] | None = None) -> int:
    """``refattn bench [--sizes 512 1024 ...] [--threads T] [--repeats R] [--quick] [--out DIR]``."""
    p = argparse.ArgumentParser(prog="refattn bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[512, 1024, 2048, 4096], help="sequence lengths N")
    p.add_argument("--quick", action="store_true", help="N in {128, 256}, 3 repeats, no memory run")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for torch, Numba and BLAS")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cases", nargs="+", default=["sdpa", "diff", "linear"], choices=["sdpa", "diff", "linear"])
    p.add_argument("--numpy-max", type=int, default=4096, help="skip the NumPy reference above this N")
    p.add_argument("--memory-n", type=int, default=16384, help="N of the per-head memory measurement (0: skip)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output directory")
    args = p.parse_args(argv)
    # torch (its bundled libgomp) and Numba's "omp" threading layer each keep an OpenMP pool in
    # this process; with the default active spin-wait the idle pool's workers steal the cores from
    # the busy one (measured: torch SDPA at N=128 went from ~3 ms to ~80 ms on 2 cores). Passive
    # waiting is set before either runtime starts unless the caller chose a policy.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if args.threads < 1 or args.repeats < 1 or any(n < 1 for n in args.sizes):
        p.error("--threads, --repeats and --sizes must be positive")
    if args.quick:
        args.sizes, args.repeats, args.memory_n = [128, 256], 3, 0
    report = run(sizes=args.sizes, threads=args.threads, repeats=args.repeats, cases=args.cases,
                 numpy_max=args.numpy_max, memory_n=args.memory_n, log=lambda s: print(s, file=sys.stderr))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    md = markdown(report)
    (args.out / "bench.md").write_text(md + "\n")
    plotted = plot(report, args.out / "bench.png")
    print(md)
    print(f"\nwrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + (f", {args.out / 'bench.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
