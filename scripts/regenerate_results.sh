#!/usr/bin/env bash
# Re-run every committed result under benchmarks/results/ with the current code (replacing the files).
# Timings are only meaningful on a quiet machine: run nothing else meanwhile. About 45 minutes on 2 cores (MQAR
# training, when its checkpoints are missing, adds up to an hour);
# the perf step needs the optional peers: pip install -c constraints.txt ".[peers]".
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
export MPLBACKEND=Agg
linattn bench --no-progress --run-label cpu-reference --overwrite --plot "$R/arch-linear-recurrence-v2_cpu-reference.png"
linattn memory --preset qwen3-next-80b-a3b --overwrite \
  --output "$R/memory_qwen3-next-80b-a3b.json" --plot "$R/memory_qwen3-next-80b-a3b.png"
linattn stability --no-progress --overwrite --output "$R/stability_cpu.json" --plot "$R/stability_cpu.png"
linattn stability --no-progress --overwrite --form recurrent --lengths 256,1024,4096,16384 \
  --output "$R/stability_cpu_recurrent.json" --plot "$R/stability_cpu_recurrent.png"
linattn stability --no-progress --overwrite --state-dtype float32 --dtype bfloat16 --dtype float16 \
  --output "$R/stability_cpu_state-float32.json" --plot "$R/stability_cpu_state-float32.png"
linattn recall --no-progress --overwrite --output "$R/recall_d64.json" --plot "$R/recall_d64.png"
# Every case against the peers at 1 and 2 threads (two passes of up to 9 minutes each):
linattn perf --no-progress --overwrite -o "$R/perf_cpu.json" --markdown "$R/perf_cpu.md"
linattn sp-bench --ranks 2 --repeats 3 --overwrite -o "$R/sp_bench_cpu.json" --plot "$R/sp_bench_cpu.png"
# The compiled CPU kernels at the target shape, 1 and 2 threads and the scaling between them (docs/performance.md):
linattn perf --no-progress --no-memory --only 'fwd/*/B1_T8192,fwdbwd/*/B1_T8192,decode/*' --overwrite \
  -o "$R/perf_cpu_kernels.json" --markdown "$R/perf_cpu_kernels.md"
linattn bench --no-progress --rules accumulate,gated_delta --sequence-lengths 128,512,2048,8192 \
  --run-label cpu-compiled-step --overwrite --plot "$R/arch-linear-recurrence-v2_cpu-compiled-step.png"
python scripts/qwen3_next_bench.py --T 4096 --threads 1 --out "$R/qwen3_next_cpu.json" --overwrite
# (printed tables: written to a temporary file first, so a failed run leaves the committed one as it was)
python scripts/compiled_backward_cost.py --threads 1 --T 8192 --repeats 3 > "$R/compiled_backward_cost_cpu.txt.tmp"
mv "$R/compiled_backward_cost_cpu.txt.tmp" "$R/compiled_backward_cost_cpu.txt"
python scripts/packing_cost.py --threads 1 --repeats 5 > "$R/packing_cost_cpu.txt.tmp"
mv "$R/packing_cost_cpu.txt.tmp" "$R/packing_cost_cpu.txt"
# The chunk form's ceiling against the token loop, and the numba chunk experiment (docs/performance.md, perf.md):
python scripts/chunk_ceiling.py > "$R/chunk_ceiling_cpu.txt.tmp"
mv "$R/chunk_ceiling_cpu.txt.tmp" "$R/chunk_ceiling_cpu.txt"
python scripts/chunk_vs_token_loop.py --threads 1 --T 8192 --chunks 16,32,64 --repeats 7 \
  > "$R/chunk_vs_token_loop_cpu.txt.tmp"
mv "$R/chunk_vs_token_loop_cpu.txt.tmp" "$R/chunk_vs_token_loop_cpu.txt"
# GLA's per-channel backward, compiled against torch, alone and in a training step; torch's OpenMP wait policy:
python scripts/compiled_backward_cost.py --threads 1 --T 8192 --repeats 5 --variants gated_head,gated_channel \
  --no-peers > "$R/compiled_backward_gated_cpu.txt.tmp"
mv "$R/compiled_backward_gated_cpu.txt.tmp" "$R/compiled_backward_gated_cpu.txt"
python scripts/train_step_ab.py --threads 1 --rounds 9 --overwrite --output "$R/train_step_ab_gated_cpu.txt"
python scripts/omp_wait_ab.py --rounds 4 --overwrite --output "$R/omp_wait_ab_cpu.txt"
# Against llama.cpp's ggml CPU ops (docs/performance.md), when its library is built (scripts/ggml_build.sh DIR,
# then GGML_LIB_DIR=DIR/build/src); skipped otherwise:
if [[ -n "${GGML_LIB_DIR:-}" ]]; then
  OMP_WAIT_POLICY=PASSIVE python scripts/ggml_bench.py --lib "$GGML_LIB_DIR" --overwrite \
    --out "$R/ggml_side_by_side_cpu.json"
  OMP_WAIT_POLICY=PASSIVE python scripts/mamba2_decode_ggml_ab.py --lib "$GGML_LIB_DIR" --overwrite \
    --out "$R/mamba2_decode_ggml_ab_cpu.txt"
fi
# Mamba-2's scan as grouped matmuls against the token loop (and ggml's, when built); the policy's thresholds:
OMP_WAIT_POLICY=PASSIVE python scripts/ssd_prefill_ab.py ${GGML_LIB_DIR:+--lib "$GGML_LIB_DIR"} --chunks 32 64 \
  --repeats 9 --overwrite --out "$R/ssd_prefill_ab_cpu.txt"
python scripts/ssd_prefill_ab.py ${GGML_LIB_DIR:+--lib "$GGML_LIB_DIR"} --chunks 32 --repeats 3 --skip sweep \
  --threads 2 --busy-core --overwrite --out "$R/ssd_prefill_busy_core_cpu.txt"
# MQAR: why the sweep's attention has a convolution and length 256 a mixture; Gated DeltaNet's decay at init.
OMP_NUM_THREADS=1 python scripts/mqar_ablation.py --overwrite --output "$R/mqar_ablation_cpu.txt"
# MQAR: the grid in stages (training takes 10-60 minutes; see the script), then the latency pass alone.
OVERWRITE=1 scripts/mqar_grid.sh train eval summary latency
