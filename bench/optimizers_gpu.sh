#!/usr/bin/env bash
# bench/optimizers.py on one GPU, one process per (method, seed) at once, then the summary.
#
#     bench/optimizers_gpu.sh OUT_DIR [STEPS] [SECONDS] [extra runs: "name|args" ...]
#
# Each run appends its outcome (with its validation curve) to OUT_DIR/<method>-<seed>.jsonl;
# the summary line is bench/optimizers.py --from-jsonl over them. Extra runs (variants of
# one method, e.g. "sl-outer1|--methods sparseloco --seeds 0 --outer-lr 1.0") write
# OUT_DIR/x-<name>.jsonl and stay out of the summary. SECONDS bounds every run.
set -u
out=${1:?OUT_DIR}; steps=${2:-1920}; limit=${3:-480}; shift 3 || shift $#
mkdir -p "$out"
epochs=$(( (steps + 479) / 480 ))
common=(--steps "$steps" --max-epochs "$epochs" --device "${DEVICE:-cuda}" --threads 1 --grid-points 1
        --eval-every $(( steps / 8 )))
export PYTHONUNBUFFERED=1
pids=()
for seed in 0 1 2; do
  for method in adamw distro distro_tuned sparseloco; do
    timeout "$limit" "${PYTHON:-python3}" -m bench.optimizers "${common[@]}" --methods "$method" \
      --seeds "$seed" --jsonl "$out/$method-$seed.jsonl" > "$out/$method-$seed.log" 2>&1 &
    pids+=($!)
  done
done
for extra in "$@"; do
  name=${extra%%|*}; args=${extra#*|}
  # shellcheck disable=SC2086  # the variant's arguments are words
  timeout "$limit" "${PYTHON:-python3}" -m bench.optimizers "${common[@]}" $args \
    --jsonl "$out/x-$name.jsonl" > "$out/x-$name.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
shopt -s nullglob  # a run cut short by SECONDS wrote no outcome
done_runs=("$out"/adamw-*.jsonl "$out"/distro-*.jsonl "$out"/distro_tuned-*.jsonl
           "$out"/sparseloco-*.jsonl)
if (( ${#done_runs[@]} )); then
  "${PYTHON:-python3}" -m bench.optimizers --from-jsonl "${done_runs[@]}"
else
  echo "no run finished within $limit s" >&2; exit 1
fi
