#!/usr/bin/env bash
# Start SGLang with the configuration `sweep export --format env` wrote.
#   CHAMPION_ENV  path of the exported env file (default /config/champion.env)
#   MODEL_PATH    target model directory (required)
#   PORT          server port (default 30000); HOST (default 0.0.0.0 inside a container)
#   SGLANG_PYTHON interpreter that has sglang (default python3)
# Extra arguments are appended to SGLang's argv. The env file is the only source of NCCL variables:
# anything NCCL_* already in the container's environment is dropped first, so what runs is exactly
# what was measured.
set -euo pipefail
env_file="${CHAMPION_ENV:-/config/champion.env}"
if [[ ! -r "$env_file" ]]; then
  echo "entrypoint: cannot read the champion env file $env_file (set CHAMPION_ENV or mount it)" >&2
  exit 2
fi
if [[ -z "${MODEL_PATH:-}" ]]; then
  echo "entrypoint: MODEL_PATH is not set (the target model directory)" >&2
  exit 2
fi
for var in $(compgen -e | grep '^NCCL_' || true); do
  [[ "$var" == NCCL_NVLS_ENABLE ]] || unset "$var"
done
set -a
# shellcheck disable=SC1090
. "$env_file"
set +a
# SGLANG_SWEEP_ARGS is one shell-quoted line; let bash split it exactly as the exporter quoted it.
eval "sweep_args=(${SGLANG_SWEEP_ARGS:-})"
unset SGLANG_SWEEP_ARGS
exec "${SGLANG_PYTHON:-python3}" -m sglang.launch_server \
  --model-path "$MODEL_PATH" --host "${HOST:-0.0.0.0}" --port "${PORT:-30000}" \
  "${sweep_args[@]}" "$@"
