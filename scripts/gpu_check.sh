#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and its driver: the `gpu`-marked tests, then the one-process
# saturation benches (cycles, heartbeats, the array against HyperQueue) with the machine's cores
# given to the load. Everything it prints also goes to $OUT (default build/gpu-check).
#   scripts/gpu_check.sh            tests and benches
#   scripts/gpu_check.sh tests      the gpu tests only
# Expects the `[server,test]` dependencies importable (pip install -e '.[server,test]'), and bwrap,
# umoci and busybox on PATH for the sandbox and image tests (they skip, saying why, without them).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-build/gpu-check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u; nproc; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,mig.mode.current --format=csv
  python3 --version; command -v bwrap umoci busybox
} 2>&1 | tee "$OUT/machine.txt"

# -s: test_health_reads_clean_and_a_task_sees_its_device prints what the CUDA task saw
python3 -m pytest -q -p no:cacheprovider -m gpu -s -rs --timeout 300 \
  tests/agent/test_agent_inventory.py tests/agent/test_agent_gpu_stats.py tests/agent/test_agent_images.py \
  tests/integration/test_gpu_real.py tests/integration/test_sandbox.py 2>&1 | tee "$OUT/gpu-tests.txt"
[ "${1:-}" = tests ] && exit 0

cores=$(nproc)
procs=$(( cores / 4 > 2 ? cores / 4 : 2 ))
python3 scripts/bench_http.py --only cycles --finish-next --transports tls --procs "$procs" --threads 8 --duration 8 --jobs 12000 --json \
  2>&1 | tee "$OUT/cycles.txt"
python3 scripts/bench_http.py --only heartbeats --transports tls --hb-workers 2000 --procs "$procs" --threads 16 --json \
  2>&1 | tee "$OUT/heartbeats.txt"
python3 scripts/bench_vs_hyperqueue.py --rounds 2 --json 2>&1 | tee "$OUT/vs-hyperqueue.txt"
