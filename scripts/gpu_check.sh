#!/usr/bin/env bash
# One prepared GPU check for refattn's numba.cuda kernels, for a machine with an NVIDIA GPU and no
# internet: install what the local package sources allow, record the GPU, run tests/cuda at real
# sizes, and benchmark the kernels against torch CUDA SDPA. Every step's outcome is recorded in the
# output directory; a failing step never stops the next one. Budget: under 8 minutes on an H200.
#
#   bash scripts/gpu_check.sh [OUTDIR]          (default ./gpu-results)
#
# Writes OUTDIR/summary.md (+ summary.json), nvidia-smi.txt, env.txt, install.log, cuda-tests.log,
# cuda-tests.xml, bench.log, bench.json, bench.md.
# Environment knobs: PYTHON (interpreter), TOTAL_BUDGET_S (default 450: every step's timeout is cut to
# what is left of it), TEST_TIMEOUT_S (default 220), BENCH_TIMEOUT_S (default 150), SKIP_INSTALL=1,
# TEST_SIZE (default real), BENCH_ARGS (extra gpu_bench.py arguments). A dry run of the
# whole script on a machine without a GPU, under the CUDA simulator:
#   NUMBA_ENABLE_CUDASIM=1 SKIP_INSTALL=1 TEST_SIZE=toy BENCH_ARGS="--toy --torch-cpu" bash scripts/gpu_check.sh /tmp/dry
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT="${1:-./gpu-results}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
T0=$(date +%s)
STEPS=()

BUDGET="${TOTAL_BUDGET_S:-450}"
now() { echo $(( $(date +%s) - T0 )); }
left() {  # left WANTED [RESERVE]: WANTED capped to what the budget leaves after RESERVE seconds, >= 10
    local l=$(( BUDGET - $(now) - ${2:-0} ))
    [ "$l" -gt "$1" ] && l=$1
    [ "$l" -lt 10 ] && l=10
    echo "$l"
}
say() { echo "[gpu_check +$(now)s] $*"; }
record() {  # record NAME RC DETAIL
    STEPS+=("$1|$2|$3")
    if [ "$2" = "0" ]; then say "step $1: ok ($3)"; else say "step $1: FAILED rc=$2 ($3)"; fi
}

# ------------------------------------------------------------------ interpreter
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    PY="$(command -v python3 || command -v python)"
fi
say "python: $PY ($("$PY" --version 2>&1))"

# ------------------------------------------------------------------ 1. GPU
say "nvidia-smi"
timeout 30 nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
rc=$?
record nvidia-smi "$rc" "$(grep -m1 -o 'NVIDIA [A-Z0-9 -]*' "$OUT/nvidia-smi.txt" 2>/dev/null || echo 'see nvidia-smi.txt')"

# ------------------------------------------------------------------ 2. install (offline-tolerant)
: > "$OUT/install.log"
if [ "${SKIP_INSTALL:-0}" = "1" ]; then
    record install 0 "skipped (SKIP_INSTALL=1)"
else
    say "pip install -e .[test,cuda] (falls back to the existing environment)"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    # Never let the install replace an installed (CUDA) torch: pin whatever torch is there.
    : > "$OUT/constraints.txt"
    TORCH_VER="$(timeout 60 "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
    if [ -n "$TORCH_VER" ]; then echo "torch==$TORCH_VER" > "$OUT/constraints.txt"; fi
    echo "constraints: $(cat "$OUT/constraints.txt")" >> "$OUT/install.log"
    if timeout "$(left 60 380)" "$PY" -m pip install --retries 0 --timeout 10 --no-build-isolation \
        -c "$OUT/constraints.txt" -e ".[test,cuda]" >> "$OUT/install.log" 2>&1; then
        record install 0 "pip install -e .[test,cuda]"
    elif timeout "$(left 30 380)" "$PY" -m pip install --retries 0 --timeout 10 --no-build-isolation --no-deps -e . >> "$OUT/install.log" 2>&1; then
        record install 1 "full install failed; installed refattn alone (--no-deps); see install.log"
    else
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        record install 1 "pip failed; using the existing environment with PYTHONPATH=repo; see install.log"
    fi
fi

# ------------------------------------------------------------------ 3. environment
say "environment"
timeout "$(left 45 360)" "$PY" - > "$OUT/env.txt" 2>&1 <<'PYEOF'
import importlib, platform
print("python", platform.python_version())
for m in ("numpy", "numba", "torch", "pytest", "refattn"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
    except Exception as exc:
        print(m, "IMPORT FAILED:", exc)
try:
    from importlib.metadata import version
    print("numba-cuda", version("numba-cuda"))
except Exception as exc:
    print("numba-cuda: not installed:", exc)
try:
    import torch
    print("torch.cuda.is_available", torch.cuda.is_available(), torch.version.cuda)
except Exception as exc:
    print("torch:", exc)
from refattn.kernels.cuda import cuda_available, simulator_enabled
print("refattn cuda_available", cuda_available(), "simulator", simulator_enabled())
from numba import cuda
cuda.detect()
PYEOF
rc=$?
record environment "$rc" "$(grep -m1 'refattn cuda_available' "$OUT/env.txt" || echo 'see env.txt')"

# ------------------------------------------------------------------ 4. CUDA tests at real sizes
TT=$(left "${TEST_TIMEOUT_S:-220}" 100)
say "tests/cuda at ${TEST_SIZE:-real} sizes (timeout ${TT}s)"
REFATTN_CUDA_TEST_SIZE="${TEST_SIZE:-real}" timeout "$TT" "$PY" -m pytest tests/cuda -q -p no:cacheprovider \
    -o addopts="" -rfE --durations=10 --junitxml="$OUT/cuda-tests.xml" > "$OUT/cuda-tests.log" 2>&1
rc=$?
record cuda-tests "$rc" "$(grep -E '(passed|failed|error)' "$OUT/cuda-tests.log" | tail -1)"

# ------------------------------------------------------------------ 5. benchmark
BT=$(left "${BENCH_TIMEOUT_S:-150}" 5)
say "benchmark vs torch CUDA SDPA (timeout ${BT}s)"
# shellcheck disable=SC2086
timeout "$BT" "$PY" scripts/gpu_bench.py --out "$OUT" --budget-s $(( BT > 60 ? BT - 30 : BT / 2 )) ${BENCH_ARGS:-} \
    2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
record benchmark "$rc" "$(tail -1 "$OUT/bench.log")"

# ------------------------------------------------------------------ summary
TOTAL=$(now)
{
    echo "# refattn GPU check"
    echo
    echo "Date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); total ${TOTAL}s; git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    echo
    echo "| step | rc | detail |"
    echo "| --- | ---: | --- |"
    for s in "${STEPS[@]}"; do
        IFS='|' read -r name code detail <<< "$s"
        echo "| $name | $code | ${detail//|//} |"
    done
    echo
    if [ -f "$OUT/bench.md" ]; then sed 's/^# /## /' "$OUT/bench.md"; fi
} > "$OUT/summary.md"
"$PY" - "$OUT" "${STEPS[@]}" <<'PYEOF' || true
import json, sys
out, steps = sys.argv[1], sys.argv[2:]
rows = [dict(zip(("step", "rc", "detail"), s.split("|", 2))) for s in steps]
json.dump({"steps": rows}, open(f"{out}/summary.json", "w"), indent=2)
PYEOF
say "done in ${TOTAL}s; results in $OUT (summary.md)"
FAILED=0
for s in "${STEPS[@]}"; do
    IFS='|' read -r name code detail <<< "$s"
    if [ "$name" = "cuda-tests" ] || [ "$name" = "benchmark" ]; then
        [ "$code" = "0" ] || FAILED=1
    fi
done
exit $FAILED
