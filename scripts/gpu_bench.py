"""Benchmark refattn's numba.cuda kernels against PyTorch CUDA on one GPU; writes JSON + Markdown.

* SDPA: refattn ``flash_attention_forward``/``backward`` vs ``torch.nn.functional.scaled_dot_product_attention``
  (float32), B=1, H=8, d=64, N in {512, 1024, 2048, 4096}, causal and not, forward and forward+backward;
* differential attention: the fused refattn kernel vs the two-SDPA composition
  ``sdpa(q1, k1, v) - lam * sdpa(q2, k2, v)`` (dv = 2d as unilm), causal;
* causal linear attention: the refattn scan alone (no torch counterpart).

Timings are medians over ``--reps`` runs after one warm-up run (which includes compilation), with
``cuda.synchronize()`` / ``torch.cuda.synchronize()`` around each. Inputs stay on the device (no
host transfers in the timings). Every benchmark is guarded: a failure is recorded and the rest goes on.

``--toy`` runs tiny sizes so the script can be tested end to end under the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``), where torch CUDA is absent and only the refattn kernels run.

Usage: ``python scripts/gpu_bench.py --out gpu-results [--toy] [--reps 5] [--budget-s 200]``
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def log(msg: str) -> None:
    print(f"[gpu_bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _torch(allow_cpu: bool = False):
    try:
        import torch

        return torch if (torch.cuda.is_available() or allow_cpu) else None
    except Exception:  # noqa: BLE001
        return None


def _median_time(fn, sync, reps: int) -> tuple[float, float]:
    """(first call incl. compilation, median of ``reps`` later calls), seconds."""
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times)


def sdpa_flops(b, h, n, m, d, dv, causal, mode):
    """FlashAttention's convention: forward 2*N*M*(d + dv) per head (halved when causal, N = M),
    backward 2.5x the forward."""
    f = 2.0 * b * h * n * m * (d + dv)
    if causal:
        f /= 2
    return f * (1.0 if mode == "fwd" else 3.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu-results")
    ap.add_argument("--toy", action="store_true", help="tiny sizes (CUDA simulator)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=200.0, help="skip remaining cases after this many seconds")
    ap.add_argument("--torch-cpu", action="store_true",
                    help="with --toy and no GPU: run the torch side on the CPU (tests this script's torch code)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()

    from refattn.kernels.cuda import _device
    from refattn.kernels.cuda import differential as kd
    from refattn.kernels.cuda import flash as kf
    from refattn.kernels.cuda import linear as kl

    cuda = _device.cuda
    toy = args.toy
    torch = _torch(allow_cpu=args.torch_cpu and toy)
    tdev = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    reps = args.reps if args.reps is not None else (1 if toy else 5)
    if toy:
        B, H, D = 1, 2, 8
        sizes = [8, 16]
        diff_sizes = [8]
        lin_sizes = [8, 16]
    else:
        B, H, D = 1, 8, 64
        sizes = [512, 1024, 2048, 4096]
        diff_sizes = [512, 1024, 2048, 4096]
        lin_sizes = [1024, 4096]

    info = {
        "python": platform.python_version(), "numpy": np.__version__, "toy": toy, "reps": reps,
        "simulator": _device.simulator_enabled(), "cuda_available": _device.cuda_available(),
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
    }
    try:
        import numba

        info["numba"] = numba.__version__
        try:
            from importlib.metadata import version

            info["numba_cuda"] = version("numba-cuda")
        except Exception:  # noqa: BLE001
            pass
        if not info["simulator"] and info["cuda_available"]:
            dev = cuda.get_current_device()
            info["device"] = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
            info["compute_capability"] = list(dev.compute_capability)
    except Exception as exc:  # noqa: BLE001
        info["device_error"] = repr(exc)
    def tsync():
        if tdev == "cuda":
            torch.cuda.synchronize()

    if torch is not None:
        info["torch_device"] = torch.cuda.get_device_name(0) if tdev == "cuda" else "cpu"
        try:
            info["torch_sdp_backends_enabled"] = {
                "flash": torch.backends.cuda.flash_sdp_enabled(),
                "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                "math": torch.backends.cuda.math_sdp_enabled()}
        except Exception:  # noqa: BLE001
            pass
        try:  # the machine's float32 GEMM rate (no TF32) as the yardstick for the GFLOP/s figures
            torch.backends.cuda.matmul.allow_tf32 = False
            sz = 4096 if tdev == "cuda" else 256
            a = torch.randn(sz, sz, device=tdev)
            _, med = _median_time(lambda: a @ a, tsync, 5)
            info["sgemm_gflops"] = round(2 * sz**3 / med / 1e9, 1)
            info["torch_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        except Exception as exc:  # noqa: BLE001
            info["sgemm_error"] = repr(exc)
    log(f"environment: {info}")

    def csync():
        cuda.synchronize()


    results = []
    errors = []
    outputs = {}
    agreement = []

    def over_budget() -> bool:
        return time.monotonic() - t_start > args.budget_s

    def record(kind, impl, n, causal, mode, first, med, flops):
        row = {"bench": kind, "impl": impl, "N": n, "causal": causal, "mode": mode,
               "first_call_s": round(first, 4), "median_ms": round(med * 1e3, 4),
               "gflops": round(flops / med / 1e9, 2) if med > 0 else None}
        results.append(row)
        log(f"{kind:7s} {impl:22s} N={n:5d} causal={causal!s:5s} {mode:7s} median {med * 1e3:9.3f} ms "
            f"({row['gflops']} GFLOP/s; first call {first:.2f} s)")

    def guarded(label, fn):
        if over_budget():
            errors.append({"case": label, "error": "skipped: time budget exhausted"})
            log(f"SKIP {label}: time budget exhausted")
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            errors.append({"case": label, "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()[-3000:]})
            log(f"FAIL {label}: {type(exc).__name__}: {exc}")

    rng = np.random.default_rng(0)

    # ------------------------------------------------------------------ SDPA
    for n in sizes:
        q, k, v = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(3))
        g = rng.standard_normal((B, H, n, D)).astype(np.float32)
        for causal in (False, True):
            def run_refattn(q=q, k=k, v=v, g=g, n=n, causal=causal):
                qd, kd_, vd, gd = (cuda.to_device(a) for a in (q, k, v, g))

                def fwd():
                    return kf.flash_attention_forward(qd, kd_, vd, is_causal=causal)

                def fwdbwd():
                    _, c = fwd()
                    return kf.flash_attention_backward(gd, c)

                first, med = _median_time(fwd, csync, reps)
                record("sdpa", "refattn.cuda", n, causal, "fwd", first, med,
                       sdpa_flops(B, H, n, n, D, D, causal, "fwd"))
                first, med = _median_time(fwdbwd, csync, reps)
                record("sdpa", "refattn.cuda", n, causal, "fwd+bwd", first, med,
                       sdpa_flops(B, H, n, n, D, D, causal, "fwd+bwd"))
                out, c = fwd()
                grads = kf.flash_attention_backward(gd, c)
                outputs[("sdpa", n, causal)] = [out.copy_to_host()] + [grads[x].copy_to_host() for x in "qkv"]

            guarded(f"sdpa refattn N={n} causal={causal}", run_refattn)
            if torch is None:
                continue

            def run_torch(q=q, k=k, v=v, g=g, n=n, causal=causal):
                F = torch.nn.functional
                qt, kt, vt = (torch.tensor(a, device=tdev, requires_grad=True) for a in (q, k, v))
                gt = torch.tensor(g, device=tdev)

                def fwd():
                    with torch.no_grad():
                        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

                def fwdbwd():
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    return torch.autograd.grad(o, (qt, kt, vt), gt)

                first, med = _median_time(fwd, tsync, reps)
                record("sdpa", "torch.sdpa", n, causal, "fwd", first, med, sdpa_flops(B, H, n, n, D, D, causal, "fwd"))
                first, med = _median_time(fwdbwd, tsync, reps)
                record("sdpa", "torch.sdpa", n, causal, "fwd+bwd", first, med,
                       sdpa_flops(B, H, n, n, D, D, causal, "fwd+bwd"))
                mine = outputs.get(("sdpa", n, causal))
                if mine is not None:  # agreement of the two implementations at this size
                    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    theirs = [o.detach()] + list(torch.autograd.grad(o, (qt, kt, vt), gt))
                    diffs = {name: float(np.abs(a - t.cpu().numpy()).max())
                             for name, a, t in zip(("out", "dq", "dk", "dv"), mine, theirs)}
                    agreement.append({"bench": "sdpa", "N": n, "causal": causal, "max_abs_diff": diffs})
                    log(f"sdpa N={n} causal={causal}: max |refattn - torch| {diffs}")

            guarded(f"sdpa torch N={n} causal={causal}", run_torch)

    # ------------------------------------------------------------------ differential attention
    DV = 2 * D
    for n in diff_sizes:
        q1, q2, k1, k2 = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(4))
        v = rng.standard_normal((B, H, n, DV)).astype(np.float32)
        lam = np.full((1,), 0.5, dtype=np.float32)
        g = rng.standard_normal((B, H, n, DV)).astype(np.float32)
        flops_f = 2 * sdpa_flops(B, H, n, n, D, DV, True, "fwd")
        flops_b = 2 * sdpa_flops(B, H, n, n, D, DV, True, "fwd+bwd")

        def run_refattn_diff(q1=q1, q2=q2, k1=k1, k2=k2, v=v, g=g, n=n, lam=lam, flops_f=flops_f, flops_b=flops_b):
            devs = [cuda.to_device(a) for a in (q1, k1, q2, k2, v)]
            gd = cuda.to_device(g)

            def fwd():
                return kd.diff_attention_forward(*devs, lam, is_causal=True)

            def fwdbwd():
                _, c = fwd()
                return kd.diff_attention_backward(gd, c)

            first, med = _median_time(fwd, csync, reps)
            record("diff", "refattn.cuda fused", n, True, "fwd", first, med, flops_f)
            first, med = _median_time(fwdbwd, csync, reps)
            record("diff", "refattn.cuda fused", n, True, "fwd+bwd", first, med, flops_b)

        guarded(f"diff refattn N={n}", run_refattn_diff)
        if torch is None:
            continue

        def run_torch_diff(q1=q1, q2=q2, k1=k1, k2=k2, v=v, g=g, n=n, lam=lam, flops_f=flops_f, flops_b=flops_b):
            F = torch.nn.functional
            ts = [torch.tensor(a, device=tdev, requires_grad=True) for a in (q1, k1, q2, k2, v)]
            lt = torch.tensor(lam, device=tdev, requires_grad=True)
            gt = torch.tensor(g, device=tdev)

            def comp():
                a, b_, c, d_, vv = ts
                return F.scaled_dot_product_attention(a, b_, vv, is_causal=True) - \
                    lt * F.scaled_dot_product_attention(c, d_, vv, is_causal=True)

            def fwd():
                with torch.no_grad():
                    return comp()

            def fwdbwd():
                return torch.autograd.grad(comp(), ts + [lt], gt)

            first, med = _median_time(fwd, tsync, reps)
            record("diff", "torch 2x sdpa", n, True, "fwd", first, med, flops_f)
            first, med = _median_time(fwdbwd, tsync, reps)
            record("diff", "torch 2x sdpa", n, True, "fwd+bwd", first, med, flops_b)

        guarded(f"diff torch N={n}", run_torch_diff)

    # ------------------------------------------------------------------ causal linear attention
    for n in lin_sizes:
        q, k, v, g = (rng.standard_normal((B, H, n, D)).astype(np.float32) for _ in range(4))

        def run_lin(q=q, k=k, v=v, g=g, n=n):
            qd, kd_, vd, gd = (cuda.to_device(a) for a in (q, k, v, g))

            def fwd():
                return kl.causal_linear_attention_forward(qd, kd_, vd)

            def fwdbwd():
                _, c = fwd()
                return kl.causal_linear_attention_backward(gd, c)

            fl = 4.0 * B * H * n * D * D
            first, med = _median_time(fwd, csync, reps)
            record("linear", "refattn.cuda scan", n, True, "fwd", first, med, fl)
            first, med = _median_time(fwdbwd, csync, reps)
            record("linear", "refattn.cuda scan", n, True, "fwd+bwd", first, med, 3 * fl)

        guarded(f"linear refattn N={n}", run_lin)

    # ------------------------------------------------------------------ report
    ratios = []
    by = {(r["bench"], r["impl"], r["N"], r["causal"], r["mode"]): r for r in results}
    for (bench, impl, n, causal, mode), r in by.items():
        other = {"refattn.cuda": "torch.sdpa", "refattn.cuda fused": "torch 2x sdpa"}.get(impl)
        o = by.get((bench, other, n, causal, mode)) if other else None
        if o is not None and o["median_ms"] > 0:
            ratios.append({"bench": bench, "N": n, "causal": causal, "mode": mode,
                           "refattn_over_torch": round(r["median_ms"] / o["median_ms"], 3)})
    elapsed = time.monotonic() - t_start
    report = {"info": info, "results": results, "ratios": ratios, "agreement": agreement, "errors": errors,
              "elapsed_s": round(elapsed, 1)}
    (out_dir / "bench.json").write_text(json.dumps(report, indent=2))
    lines = ["# refattn CUDA kernels: benchmark", "",
             f"Environment: `{json.dumps(info)}`", "",
             f"Medians of {reps} runs after a warm-up (first call includes compilation); float32; "
             f"B={B}, H={H}, d={D} (differential: dv={DV}). GFLOP/s use FlashAttention's FLOP count.", "",
             "| bench | impl | N | causal | mode | median ms | GFLOP/s | first call s |",
             "| --- | --- | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in results:
        lines.append(f"| {r['bench']} | {r['impl']} | {r['N']} | {r['causal']} | {r['mode']} | {r['median_ms']} | "
                     f"{r['gflops']} | {r['first_call_s']} |")
    if ratios:
        lines += ["", "## refattn time / torch time", "", "| bench | N | causal | mode | ratio |",
                  "| --- | ---: | --- | --- | ---: |"]
        lines += [f"| {x['bench']} | {x['N']} | {x['causal']} | {x['mode']} | {x['refattn_over_torch']} |"
                  for x in ratios]
    if agreement:
        lines += ["", "## max |refattn - torch| (float32, same inputs)", "", "| N | causal | out | dq | dk | dv |",
                  "| ---: | --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {a['N']} | {a['causal']} | " + " | ".join(f"{a['max_abs_diff'][x]:.2e}" for x in
                                                            ("out", "dq", "dk", "dv")) + " |" for a in agreement]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e['case']}: {e['error']}" for e in errors]
    lines += ["", f"Total benchmark time: {elapsed:.1f} s", ""]
    (out_dir / "bench.md").write_text("\n".join(lines))
    log(f"wrote {out_dir / 'bench.json'} and {out_dir / 'bench.md'} ({len(results)} timings, {len(errors)} errors, "
        f"{elapsed:.1f} s)")
    if not math.isfinite(elapsed):  # pragma: no cover
        return 2
    return 1 if errors and not results else 0


if __name__ == "__main__":
    sys.exit(main())
