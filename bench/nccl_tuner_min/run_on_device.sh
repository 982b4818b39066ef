#!/usr/bin/env bash
# On the lent H200 machine, from the repo root:  bash bench/nccl_tuner_min/run_on_device.sh "$OUT"
# Writes env.txt (compiler, headers, versions), build.log, and one NCCL log per case:
#   a.log  NCCL_TUNER_PLUGIN=<the built .so> (and NCCL_TUNER_CONFIG_FILE=<a csv>, which this plugin ignores)
#   b.log  NCCL_TUNER_PLUGIN=/nonexistent/libx.so
#   c.log  no tuner variable
#   d.log  NCCL_TUNER_PLUGIN=<a .so that opens but exports no tuner struct>
set -u
OUTDIR=${1:?usage: run_on_device.sh OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=/tmp/nccl_tuner_min
mkdir -p "$OUTDIR" "$BUILD"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset NCCL_TUNER_PLUGIN NCCL_TUNER_CONFIG_FILE NCCL_DEBUG_FILE NCCL_ALGO NCCL_PROTO

{
  echo "## uname -m"; uname -m
  for c in gcc cc clang nvcc; do
    echo "## $c --version"; if command -v "$c" >/dev/null; then command -v "$c"; "$c" --version 2>&1 | head -4; else echo "$c: not found"; fi
  done
  echo "## python3 / torch / NCCL"
  python3 -c 'import torch; print(torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'
  echo "## pip show nvidia-nccl-cu13"; python3 -m pip show -f nvidia-nccl-cu13 2>&1 | grep -Ev '^(Home-page|Author|License|Summary):'
  echo "## headers named nccl*.h / tuner*.h under /usr /opt (NCCL's tuner header is nccl_tuner.h)"
  find /usr /opt -xdev \( -name 'nccl*.h' -o -name 'tuner*.h' \) 2>/dev/null | sort
  echo "## CUDA toolkit include dirs"; ls -d /usr/local/cuda*/include 2>&1
} >"$OUTDIR/env.txt" 2>&1

CC=""
for c in gcc cc clang; do command -v "$c" >/dev/null && { CC=$c; break; }; done
SO=$BUILD/libnccl-tuner-sglang-sweep-probe.so
NOSYM=$BUILD/libnccl-tuner-sglang-sweep-nosym.so
{
  if [ -n "$CC" ]; then
    set -x
    "$CC" -shared -fPIC -O2 -Wall -Wextra -Werror -o "$SO" "$HERE/sglang_sweep_probe_tuner.c"
    "$CC" -shared -fPIC -O2 -Wall -Wextra -Werror -DSGLANG_SWEEP_PROBE_NO_SYMBOL -o "$NOSYM" "$HERE/sglang_sweep_probe_tuner.c"
    set +x
    (command -v nm >/dev/null && nm -D --defined-only "$SO" "$NOSYM") || echo "nm: not found"
  else
    echo "no C compiler (gcc, cc, clang) on this machine: case a and d cannot be built"
  fi
} >"$OUTDIR/build.log" 2>&1
printf 'collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks\nallreduce,0,65536,ring,ll,-1,-1,-1\n' >"$BUILD/rules.csv"

one() {  # name port [VAR=value ...]
  local name=$1 port=$2; shift 2
  echo "## case $name: env $* NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING python3 pg_once.py $port" >"$OUTDIR/$name.log"
  env "$@" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,TUNING timeout 60 python3 "$HERE/pg_once.py" "$port" >>"$OUTDIR/$name.log" 2>&1
  echo "## exit $?" >>"$OUTDIR/$name.log"
}
[ -f "$SO" ] && one a 29611 NCCL_TUNER_PLUGIN="$SO" NCCL_TUNER_CONFIG_FILE="$BUILD/rules.csv"
one b 29612 NCCL_TUNER_PLUGIN=/nonexistent/libx.so
one c 29613
[ -f "$NOSYM" ] && one d 29614 NCCL_TUNER_PLUGIN="$NOSYM"
grep -h -e '^## ' -e 'TUNER' -e 'NCCL version' -e 'ALLREDUCE_OK' "$OUTDIR"/[abcd].log
