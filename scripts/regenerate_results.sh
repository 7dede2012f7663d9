#!/usr/bin/env bash
# Re-run every committed result under benchmarks/results/ with the current code (replacing the files).
# Timings are only meaningful on a quiet machine: run nothing else meanwhile. About 15 minutes on 2 cores;
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
linattn perf --overwrite --output "$R/perf_cpu.json" --markdown "$R/perf_cpu.md"
linattn sp-bench --ranks 2 --repeats 3 --overwrite --output "$R/sp_bench_cpu.json"
