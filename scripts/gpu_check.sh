#!/usr/bin/env bash
# GPU check for a lent GPU: each part of scripts/gpu_check.py runs on its own, under its own time
# limit, so one failure still prints the others' figures. A few minutes in all on one H100/H200.
#
#   bash scripts/gpu_check.sh              # on the GPU machine, from the repository root
#   bash scripts/gpu_check.sh --cpu-smoke  # check the script's logic on a CPU-only machine
#
# Parts: env (versions, device), stream (the streamed paths on the GPU against in memory and a copy),
# calib (bf16 vs fp32 calibration: tokens/s, rank agreement),
# zero3 (DeepSpeed ZeRO-3 fit on one GPU, then AIMER / RouterDelta, prune, export, verify),
# kernels (Triton kernels compiled and tested for real when lightprune.width.kernels exists),
# prefill (MWOP: dense vs path-sparse / compact FFN prefill on the paper's 7B shapes).
set -u
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
SMOKE="${1:-}"
if [ -n "$SMOKE" ] && [ "$SMOKE" != "--cpu-smoke" ]; then
    echo "usage: $0 [--cpu-smoke]" >&2
    exit 2
fi
FAILED=()
run_part() {  # name, time limit in seconds
    local name="$1" limit="$2" start=$SECONDS rc
    echo "=== $name (limit ${limit}s) ==="
    timeout --kill-after=10 "$limit" python scripts/gpu_check.py "$name" $SMOKE
    rc=$?
    if [ "$rc" -ne 0 ]; then
        FAILED+=("$name(rc=$rc)")
        echo "=== $name FAILED with exit status $rc after $((SECONDS - start))s ==="
    else
        echo "=== $name done in $((SECONDS - start))s ==="
    fi
}
[ -z "$SMOKE" ] && { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true; }
run_part env 60
run_part stream 420
run_part calib 180
run_part zero3 240
run_part kernels 240
run_part prefill 240
if [ "${#FAILED[@]}" -gt 0 ]; then
    echo "gpu_check: failed parts: ${FAILED[*]}"
    exit 1
fi
echo "gpu_check: all parts ran"
