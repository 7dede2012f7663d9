#!/usr/bin/env bash
# One-go CUDA run of `linattn bench` (run from the repository root on a machine with a CUDA GPU).
#
#   scripts/bench_cuda.sh [LABEL] [extra linattn bench flags...]
#
# 1. dry run: fails fast (non-zero exit, nothing written) if CUDA, bfloat16 or the memory is missing;
# 2. the decode benchmark's workload on the GPU: bfloat16 tokens, float32 state, L = 512,2048,8192 (+ plot);
# 3. the same with a bfloat16 state, the original experiment's setting (+ plot);
# 4. both files side by side, with the CPU reference when it is there, and a combined plot.
# Results: benchmarks/results/arch-linear-recurrence-v2_<LABEL>[-bf16-state].{json,png}. Existing files are
# refused; pass --overwrite among the extra flags to replace them.
set -euo pipefail

LABEL="${1:-cuda-$(date -u +%Y%m%dT%H%M%SZ)}"
shift || true
DIR=benchmarks/results
STEM="$DIR/arch-linear-recurrence-v2_${LABEL}"

python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

linattn bench --device cuda --dry-run --run-label "$LABEL" "$@"
linattn bench --device cuda --run-label "$LABEL" --plot "$STEM.png" "$@"
linattn bench --device cuda --state-dtype bfloat16 --run-label "${LABEL}-bf16-state" \
  --plot "$STEM-bf16-state.png" "$@"

FILES=("$STEM.json" "$STEM-bf16-state.json")
CPU_REF="$DIR/arch-linear-recurrence-v2_cpu-reference.json"
[[ -f "$CPU_REF" ]] && FILES+=("$CPU_REF")
OVERWRITE=()
for arg in "$@"; do [[ "$arg" == "--overwrite" ]] && OVERWRITE=(--overwrite); done
linattn bench show "${FILES[@]}" --plot "$STEM-compare.png" "${OVERWRITE[@]}"
