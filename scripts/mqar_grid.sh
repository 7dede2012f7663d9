#!/usr/bin/env bash
# The committed MQAR grid (README, "linattn mqar"): seeds 0, 1, 2 of vocab 48, T = 48, pairs 2/4/8, 4000 steps,
# one model at a time on one thread. Every stage can be stopped and run again: training resumes from the
# checkpoints bit for bit, so the accuracies depend on the seed only, never on the machine's load.
#
#   scripts/mqar_grid.sh train     train every (seed, mixer) not yet at 4000 steps into $CK/steps4000_seed<S>/
#   scripts/mqar_grid.sh eval      one result per seed from the finished checkpoints (controls, no latency)
#   scripts/mqar_grid.sh summary   mean and min-max over the seeds
#   scripts/mqar_grid.sh latency   only the decode-latency pass of seed 0's trained models: run on a quiet machine
#
# Environment: CK (checkpoints, default runs/ck), SEEDS (default "0 1 2"), OVERWRITE=1 to replace result files.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 NUMBA_NUM_THREADS=1 MPLBACKEND=Agg
CK=${CK:-runs/ck}
SEEDS=${SEEDS:-0 1 2}
R=benchmarks/results
NAME=mqar_cpu_4000steps
MIXERS="attention accumulate-elu1 accumulate-taylor2 gated delta gated_delta hybrid"
OW=$([ "${OVERWRITE:-0}" = 1 ] && echo --overwrite || true)
# The training budget is far above any model's time (about 1.5 minutes idle, 10 under heavy load), so no model
# is cut short: every record must say stop_reason "steps" and steps_done 4000.
COMMON=(--steps 4000 --budget-s 3600 --threads 1 --no-progress)

finished() {  # the mixers of seed $1 whose checkpoint is at step 4000
  python - "$CK/steps4000_seed$1" $MIXERS <<'EOF'
import sys
from pathlib import Path
from safetensors import safe_open
done = []
for m in sys.argv[2:]:
    p = Path(sys.argv[1]) / f"{m}.safetensors"
    if p.is_file():
        with safe_open(str(p), "pt") as fh:
            if fh.metadata()["step"] == "4000":
                done.append(m)
print(",".join(done))
EOF
}

for stage in "$@"; do
  case $stage in
    train)
      for S in $SEEDS; do for M in $MIXERS; do
        echo "== train seed $S $M $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
        python -m linattn.tools.cli mqar "${COMMON[@]}" --mixers "$M" --seed "$S" --checkpoint-dir "$CK/steps4000_seed$S" \
          --resume --no-latency --no-controls
      done; done ;;
    eval)
      for S in $SEEDS; do
        DONE=$(finished "$S")
        if [ -z "$DONE" ]; then echo "== seed $S: no finished model, skipped"; continue; fi
        echo "== eval seed $S: $DONE"
        python -m linattn.tools.cli mqar "${COMMON[@]}" --mixers "$DONE" --seed "$S" --checkpoint-dir "$CK/steps4000_seed$S" \
          --resume --no-latency $OW --output "$R/${NAME}_seed$S.json" --plot "$R/${NAME}_seed$S.png"
      done ;;
    summary)
      ARGS=()
      for S in $SEEDS; do [ -f "$R/${NAME}_seed$S.json" ] && ARGS+=(--summarize "$R/${NAME}_seed$S.json"); done
      python -m linattn.tools.cli mqar "${ARGS[@]}" $OW --output "$R/${NAME}_seeds.json" --plot "$R/${NAME}_seeds.png" ;;
    latency)
      python -m linattn.tools.cli mqar --latency-from "$R/${NAME}_seed0.json" --checkpoint-dir "$CK/steps4000_seed0" \
        --threads 1 --no-progress $OW --output "$R/${NAME}_seed0_latency.json" --plot "$R/${NAME}_seed0_latency.png" ;;
    *) echo "unknown stage $stage (train, eval, summary, latency)"; exit 2 ;;
  esac
done
