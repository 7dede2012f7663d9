#!/usr/bin/env bash
# The GPU check, in one go on a fresh CUDA machine (run from anywhere). UNTESTED ON HARDWARE: written and
# exercised on a CPU only (the Python halves under Triton's interpreter). It must finish in under 8 minutes on one
# H100/H200: every step's time limit is cut to what is left of a 450 s budget (DEADLINE_S), so the whole script
# stops by then however the steps fare (installing missing packages comes first and counts too).
#
#   scripts/gpu_check.sh [OUT]        # OUT defaults to benchmarks/results/gpu-<UTC time>
#
# 1. installs what is missing (torch with CUDA, triton, flash-linear-attention, test tools) with pip, never
#    replacing a torch that already sees the GPU; linattn itself runs from src/ (no install);
# 2. the CUDA test subset, compiled on the device: tests/test_kernels_triton.py (default subset; the slow sweep
#    too when RUN_SLOW=1) and tests/test_perf_cuda.py;                                       limit 120 s
# 3. `linattn bench --device cuda` (bfloat16, H=8, D=64, L=512/2048/8192, warmup 10, repeats 100, every rule)
#    and its validation against the result schema;                                           limits 80 + 10 s
# 4. scripts/gpu_check.py decode: SDPA decode over the KV cache against the torch-op state step and the fused
#    Triton step, per rule and L (CUDA events, torch.cuda.max_memory_allocated);             limit 50 s
# 5. `linattn perf --device cuda`: linattn's Triton chunk kernels against fla's (chunk_linear_attn,
#    chunk_simple_gla, chunk_gla, chunk_delta_rule, chunk_gated_delta_rule) and SDPA, forward and forward+backward,
#    at fla's shapes and the course chapter's, with the device's measured matmul rate and copy bandwidth: 66 cases, about
#    8 s of timed calls at an assumed 50 TFLOP/s (`--list` prints the plan), the rest compilation and fla's
#    autotuning; no case starts after 170 s (--budget-s), limit 190 s.
# Every step's log and result goes under OUT; a failing step is logged and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-benchmarks/results/gpu-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
unset TRITON_INTERPRET
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-450}
status=0
step() {  # step NAME TIMEOUT_S CMD...: run with a time limit (cut to the time left), log to OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    local left=$(( DEADLINE_S - ($(date +%s) - START) ))
    if (( left < 10 )); then echo "== $name: SKIPPED (the ${DEADLINE_S}s budget is used up)"; status=1; return; fi
    (( limit > left )) && limit=$left
    echo "== $name (limit ${limit}s, at +$(( $(date +%s) - START ))s)"
    if timeout "$limit" "$@" >"$OUT/$name.log" 2>&1; then echo "   ok"; else echo "   FAILED ($?): see $OUT/$name.log"; status=1; fi
    tail -n 25 "$OUT/$name.log"
}

{ nvidia-smi || true; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"; } \
    >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# 1. Dependencies: only what is missing. A torch without CUDA is replaced by the default (CUDA) wheel.
if ! python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    step install-torch 300 python3 -m pip install -q --upgrade torch
fi
missing=()
for mod in triton:triton fla:flash-linear-attention numpy:numpy pytest:pytest hypothesis:hypothesis \
           jsonschema:jsonschema click:click tqdm:tqdm matplotlib:matplotlib; do
    python3 -c "import ${mod%%:*}" 2>/dev/null || missing+=("${mod#*:}")
done
if [[ ${#missing[@]} -gt 0 ]]; then step install 300 python3 -m pip install -q "${missing[@]}"; fi
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')" || exit 1

# 2. The Triton tests on the device (compiled; each kernel variant compiles once, which is most of the time).
marker="not slow"; [[ "${RUN_SLOW:-0}" == 1 ]] && marker="slow or not slow"
step tests 120 python3 -m pytest -q -m "$marker" tests/test_kernels_triton.py tests/test_perf_cuda.py \
    --junitxml="$OUT/tests.xml"

# 3. linattn bench on CUDA, every rule, validated against the schema.
step bench 80 python3 -m linattn.tools.cli bench --device cuda --rules accumulate,gated,delta,gated_delta \
    --output "$OUT/bench_cuda.json" --plot "$OUT/bench_cuda.png"
step bench-schema 10 python3 - "$OUT/bench_cuda.json" <<'PY'
import json, sys
from importlib.resources import files
import jsonschema
schema = json.loads(files("linattn").joinpath("schemas/bench_result.schema.json").read_text())
jsonschema.validate(json.load(open(sys.argv[1])), schema)
print("bench_cuda.json validates against bench_result.schema.json")
PY

# 4. Decode step against the KV baseline.
step decode 50 python3 scripts/gpu_check.py decode --out "$OUT"

# 5. Chunk kernels against fla's and SDPA (the result is validated against perf_cuda.schema.json when written).
step perf 190 python3 -m linattn.tools.cli perf --device cuda --budget-s 170 \
    --output "$OUT/perf_cuda.json" --markdown "$OUT/perf_cuda.md"

echo "== done in $(( $(date +%s) - START ))s; results under $OUT"
exit $status
