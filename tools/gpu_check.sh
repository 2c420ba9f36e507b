#!/usr/bin/env bash
# One-shot GPU check for issue 35: what folding buys XLA GPU on a ResNet-50-shaped model.
#
#   OUT=/some/dir bash tools/gpu_check.sh           # on a machine with a GPU (~3-6 minutes)
#   OUT=/tmp/x bash tools/gpu_check.sh --tiny       # anywhere, CPU included (seconds): checks the script
#
# Needs only jax (with its CUDA plugin for the GPU run) and numpy: no package index, no
# framework. bnfold comes from this checkout (PYTHONPATH=python). It generates the
# ResNet-50-shaped backbone of tools/downstream.py with plain jax (224x224, batch 1 and
# 32, f32 and bf16), folds each with bnfold, compiles the original and the folded
# module on the GPU with the weights lifted into arguments, counts the kernels of the
# optimized HLO and times them alternating (5 rounds of 30 back-to-back runs, median).
# Each case runs in its own process under its own time limit, so one failure or hang
# costs only that case; the whole stays under 8 minutes (the last, optional case runs
# only while time is left). BNFOLD_GPU_BUDGET (seconds, default 450) sets that total.
#
# Writes to $OUT (default: a new temporary directory, printed):
#   summary.md         the tables of every case, the environment, the elapsed time
#   <case>.md/.json    tools/downstream.py's table and raw samples (--json) per case
#   <case>.log         its stderr;  hlo/  the optimized HLO of every module
#   env.txt            jax/jaxlib/numpy versions, devices, nvidia-smi
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d -t bnfold-gpu-check-XXXX)}
mkdir -p "$OUT/hlo"
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-1}
PY=${PYTHON:-python3}
START=$(date +%s)
BUDGET=${BNFOLD_GPU_BUDGET:-450}   # seconds for everything; a lent GPU session allows 10 minutes a command
WORK=$(mktemp -d -t bnfold-gpu-models-XXXX)
trap 'rm -rf "$WORK"' EXIT

if [[ "${1:-}" == "--tiny" ]]; then
    COMMON=(--size tiny --rounds 2 --runs 2)
    BATCHES=(1 2)
    PER_CASE=120
    OPTIONAL=30
else
    unset JAX_PLATFORMS      # a CPU-forcing environment would hide the GPU
    COMMON=(--size full --rounds 5 --runs 30 --platform gpu)
    BATCHES=(1 32)
    PER_CASE=150
    OPTIONAL=120    # an optional case starts only with this much time left
fi

{
    echo "# bnfold GPU check (issue 35), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "XLA_FLAGS=${XLA_FLAGS:-}  JAX_PLATFORMS=${JAX_PLATFORMS:-}"
    "$PY" - <<'EOF'
import jax, jaxlib, numpy, platform
print(f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {numpy.__version__}")
print(f"default backend: {jax.default_backend()}; devices: {jax.devices()}")
import bnfold
print(f"bnfold from {bnfold.__file__}")
EOF
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    fi
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [[ "${1:-}" != "--tiny" ]] && ! grep -q "default backend: gpu" "$OUT/env.txt"; then
    echo "gpu_check: jax sees no GPU (see $OUT/env.txt); use --tiny to check the script on CPU" >&2
    exit 1
fi

CASES=()
run_case() {  # name, seconds it needs at least, extra downstream.py arguments...
    local name=$1 need=$2; shift 2
    CASES+=("$name")
    local left=$(( BUDGET - ($(date +%s) - START) ))
    if (( left < need )); then
        echo "gpu_check: skipped $name (${left}s left)" | tee -a "$OUT/skipped.txt" >&2
        return
    fi
    local limit=$(( left < PER_CASE ? left : PER_CASE ))
    echo "gpu_check: $name (limit ${limit}s)" >&2
    timeout --kill-after=10 "$limit" "$PY" tools/downstream.py --models resnet50 "${COMMON[@]}" \
        --workdir "$WORK" --keep-hlo "$OUT/hlo" --json "$OUT/$name.json" "$@" \
        > "$OUT/$name.md" 2> "$OUT/$name.log"
    local rc=$?
    (( rc == 0 )) || echo "gpu_check: $name exited $rc (see $OUT/$name.log)" | tee -a "$OUT/failed.txt" >&2
    cat "$OUT/$name.md"
}

for dtype in f32 bf16; do
    for batch in "${BATCHES[@]}"; do
        run_case "resnet50-b$batch-$dtype" 30 --batch "$batch" --dtype "$dtype"
    done
done
# Optional, while time is left: every parameter an argument (the original then computes its
# batch-norm vectors on every call), and the weights left as constants.
run_case "resnet50-b${BATCHES[-1]}-f32-lift-all" "$OPTIONAL" --batch "${BATCHES[-1]}" --dtype f32 --lift all
run_case "resnet50-b1-f32-lift-none" "$OPTIONAL" --batch 1 --dtype f32 --lift none

{
    cat "$OUT/env.txt"
    echo
    first=1
    for name in "${CASES[@]}"; do
        f="$OUT/$name.md"
        [[ -s "$f" ]] || continue
        if (( first )); then grep '^| ' "$f"; first=0; else grep '^| ' "$f" | tail -n +3; fi
        sed -n 's/^\([0-9]\+ rounds.*\)$/  \1/p' "$f" | sed "s|^|$(basename "$f" .md):|"
    done
    [[ -f "$OUT/failed.txt" ]] && { echo; cat "$OUT/failed.txt"; }
    [[ -f "$OUT/skipped.txt" ]] && { echo; cat "$OUT/skipped.txt"; }
    echo
    echo "elapsed: $(( $(date +%s) - START )) s"
} > "$OUT/summary.md"
echo
cat "$OUT/summary.md"
echo "gpu_check: results in $OUT"
