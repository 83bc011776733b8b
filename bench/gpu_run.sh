#!/usr/bin/env bash
# The GPU check of issue #26, as one prepared run: the same floor and load benchmarks as on the CPU, with the
# query encoder (and, in the cascade configurations, the cross-encoder) on ONNX Runtime's CUDA provider.
#
#   bash bench/gpu_run.sh DATA_DIR OUT_DIR [QUICK]
#
# DATA_DIR holds the BEIR folder scifact/; OUT_DIR receives the JSON results and the logs. The models must exist
# first (models/minilm-fp16, models/ce-minilm-l6-fp16: see bench/configs/gpu-default.toml). QUICK=1 shortens
# every step (a plumbing check on a machine without a GPU: the CUDA provider then falls back to the CPU with a
# log line, which is itself one of the checks). Each step has its own time limit and a failed step does not stop
# the next: a device lease is short, and partial figures are better than none.
set -uo pipefail
cd "$(dirname "$0")/.."
DATA=${1:?DATA_DIR}
OUTD=${2:?OUT_DIR}
QUICK=${3:-0}
mkdir -p "$OUTD"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# bm25s imports jax when it is installed (the device image has it); jax then grabs the GPU and fails in the
# bench's subprocesses. The BM25 side is CPU code either way.
export JAX_PLATFORMS=cpu
PY=${PYTHON:-python3}
DS=${DS:-$DATA/scifact}  # DS=data/sample for a quick plumbing check
IDX=${IDX:-indexes/$(basename "$DS")-gpu}
if [ "$QUICK" = 1 ]; then DUR=3; WARM=1; LEVELS=1,4; FLOORQ=10; LIMIT=40; BURSTS=1
else DUR=8; WARM=2; LEVELS=1,16,64; FLOORQ=50; LIMIT=0; BURSTS=3; fi
step() {  # step NAME SECONDS CMD...: run with a limit, log to OUT_DIR/NAME.log, report the exit code and time
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUTD/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc, $((SECONDS - t0)) s"
  tail -n 25 "$OUTD/$name.log"
}

step machine 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc;
  '"$PY"' -c "import onnxruntime as o, faiss, numpy; print(\"onnxruntime\", o.__version__, o.get_available_providers(), \"faiss\", faiss.__version__, \"numpy\", numpy.__version__)"'
step gpu_check 90 "$PY" -m bench.gpu_check --models models --json "$OUTD/gpu-check.json"
if [ ! -f "$IDX/CURRENT" ]; then
  step build 150 "$PY" -m hybridrag build --corpus "$DS" --out "$IDX" --config bench/configs/gpu-default.toml
fi
configs=(--config gpu-default=bench/configs/gpu-default.toml --config gpu-default-4proc=bench/configs/gpu-default-4proc.toml
         --config gpu-cascade=bench/configs/gpu-cascade.toml --config gpu-cascade-fast=bench/configs/gpu-cascade-fast.toml)
extra=()
[ "$LIMIT" -gt 0 ] && extra=(--limit "$LIMIT")
step cascade_load 300 "$PY" -m bench.cascade_load --index "$IDX" --dataset "$DS" "${configs[@]}" --concurrency "$LEVELS" \
  --duration "$DUR" --warmup "$WARM" --floor-queries "$FLOORQ" --client-procs 4 "${extra[@]}" \
  --json "$OUTD/gpu-cascade-load.json"
step burst 120 "$PY" -m bench.burst --index "$IDX" --dataset "$DS" --config bench/configs/gpu-default.toml \
  --bursts "$BURSTS" --label gpu-default --json "$OUTD/gpu-burst.json"
echo "== done in $SECONDS s"
