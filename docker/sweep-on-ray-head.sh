#!/bin/sh
# The ray-head service of docker/compose.yaml: start the Ray head, then run the sweep driver in this same
# container (same Python and Ray as the workers; `--ray-address auto` finds the local head, no token to share).
# A restart resumes the sweep whose work directory the runs volume still holds.
set -eu
# Workers (and the SGLang servers they launch) at niceness 0, a deployment's, not Ray's default 15 (docs/cluster.md).
export RAY_worker_niceness=0
ray start --head --port=6379 --num-gpus="${RAY_NUM_GPUS:-8}" --include-dashboard=false --disable-usage-stats
workdir="runs/${SWEEP_NAME:?set SWEEP_NAME to the experiment name}"
if [ -f "$workdir/sweep.json" ]; then set -- --resume; else set --; fi
exec sweep run "${SWEEP_EXPERIMENT:?set SWEEP_EXPERIMENT}" --workdir "$workdir" --timeout "${SWEEP_TIMEOUT:-8h}" \
  --ray-address auto "$@"
