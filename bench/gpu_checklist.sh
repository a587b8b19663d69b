#!/usr/bin/env bash
# The GPU checklist in one command, for a lent GPU machine (the device tool) or any CUDA machine.
#
# `bash bench/gpu_checklist.sh speed`: the ViT-B/16 speed switches, each against its baseline side by side, in one call
# of under 4 minutes (3 min 45 s with every step at its limit; docs/BENCHMARKS.md, "GPU"):
#   1. mem bench train --variants eager,bf16-targets,blocks: pretraining and finetuning at the preset's sizes in one
#      process, each variant's images/s beside eager's (a line per measurement as it comes)
#   2. mem bench live --variants eager,bf16-weights,bf16-weights+cuda-graph --no-server: the predictor alone with
#      ViT-B/16 and the 8192-token dVAE, p50 / p95 of a window
#   3. the switches' GPU test: the CUDA graph against the eager predictor
#   4. the server with the predictor `mem serve` runs on a GPU, bf16-weights+cuda-graph (latency p50 / p95; needs
#      pyzmq); off by default
#   5. pretraining with the whole model compiled (--variants compile); off by default (its compilation does not fit)
# LIMITS="160 40 25 45 100" runs all five. On a card of less than 100 GB (an H100) both stages take batch 384:
# finetuning's 1024 does not fit 80 GB.
#
# `bash bench/gpu_checklist.sh` (or `full`): the checklist, sized for one call of under 10 minutes (about 9 with
# every step at its limit):
#   1. mem bench train at a paper preset's sizes and batches (SDPA), with a torch.profiler table per stage
#      and the host waits of one more step per stage (torch.cuda.set_sync_debug_mode("warn")): each listed with the
#      MEM code that caused it; a step should have none
#   2. pretraining and finetuning again with FlexAttention (MEM_FLEX_ATTENTION=1), to compare with step 1
#   3. every paper preset's first steps on CUDA (tests/test_train.py's CUDA cases: RandAugment, crop, EMA, ...),
#      compiled FlexAttention against SDPA, outputs and gradients (tests/test_scale.py), and the GPU's histograms
#      against the CPU's (tests/test_representation.py)
#   4. mem bench live with the paper's ViT-B/16 on CUDA, without the Qt viewer (the machine has no Qt)
#   5. the same server under a 3 Mev/s source (what the in-process 30 Mev/s source costs the latency); off by default
#   6. finetuning with torch.compile (SDPA)
# Each step has its own time limit, so a slow one cannot take the others' time. Logs, JSON and profiles are packed
# after every step into $OUT/gpu-checklist.tgz (one file: the device tool returns at most 8).
#
# On the device tool's machines (python3 with torch, timm, h5py, numba, rich, typer; no hdf5plugin, lz4, zstandard,
# pyzmq or pydantic), the missing packages travel unpacked in .dev/site.tgz (see docs/BENCHMARKS.md, "GPU"), or as the
# wheels of .gpu/wheels that `bash bench/gpu_evidence.sh prepare` downloads (enough for the speed mode).
# Environment: PRESET (paper-ncars), DEVICE (cuda), LIVE_MODEL (vit-b), LIVE_STARTS (1), PY (python3), TESTS (step 3's
# pytest -k), LIMITS in seconds per step in the order above (full: "180 80 100 90 0 90", speed: "160 40 25 0 0"; 0
# skips a step), STEPS (speed: timed steps per stage and variant, 4), BATCH_SIZE (speed: every stage's batch; default
# the preset's, 384 on a card of less than 100 GB).
set -u
MODE=${1:-full}
case "$MODE" in
  full | speed) ;;
  *)
    echo "usage: bash bench/gpu_checklist.sh [full | speed]" >&2
    exit 2
    ;;
esac
OUT=${OUT:-out/gpu-checklist}
PRESET=${PRESET:-paper-ncars}
DEVICE=${DEVICE:-cuda}
LIVE_MODEL=${LIVE_MODEL:-vit-b}
LIVE_STARTS=${LIVE_STARTS:-1}
PY=${PY:-python3}
TESTS=${TESTS:-(paper_preset_runs_its_code_paths and cuda) or generator_drives or on_a_gpu}
STEPS=${STEPS:-4}
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 QT_QPA_PLATFORM=offscreen
if ! $PY -c 'import hdf5plugin, lz4.frame, zstandard, zmq, pydantic, timm.models.beit as b, inspect; assert "use_fc_norm" in inspect.signature(b.Beit).parameters' 2>/dev/null && [ -f .dev/site.tgz ]; then
  mkdir -p /tmp/site && tar xzf .dev/site.tgz -C /tmp/site && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# else the wheels bench/gpu_evidence.sh installs (.gpu/wheels: pydantic, timm), where no evidence call on this machine has
if ! $PY -c 'import pydantic, inspect, timm.models.beit as b; assert "use_fc_norm" in inspect.signature(b.Beit).parameters' 2>/dev/null; then
  if [ ! -d /tmp/gpu-evidence-site ] && ls .gpu/wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-evidence-site \
      .gpu/wheels/*.whl
  fi
  [ -d /tmp/gpu-evidence-site ] && export PYTHONPATH=/tmp/gpu-evidence-site${PYTHONPATH:+:$PYTHONPATH}
fi

BENCH=(-c 'import app.cli; from bench.cli import app; app()')  # `mem bench` without the entry point (app.cli first:
# where `mem` is installed, its plugin loading imports bench.cli, which a first import of bench.cli would circle into)
pack() { tar czf "$OUT/gpu-checklist.tgz" -C "$WORK" .; }
step() {  # step NAME LIMIT COMMAND...: run with a time limit, log to $WORK/NAME.log, print its end
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  [ "$limit" -gt 0 ] || { echo "=== $name: skipped"; return; }
  echo "=== $name (limit ${limit} s)"
  timeout -k 5 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s"
  grep -v -e '^\s*$' "$WORK/$name.log" | tail -n 30
  pack
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  $PY -c 'import sys, torch, timm, numpy; print(sys.version.split()[0], "torch", torch.__version__, "timm",
timm.__version__, "numpy", numpy.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name())'
  nproc
} >"$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt"

if [ "$MODE" = speed ]; then
  read -r L_TRAIN L_LIVE L_TESTS L_SERVER L_WHOLE <<<"${LIMITS:-160 40 25 0 0}"
  memory=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  if [ -z "${BATCH_SIZE:-}" ] && [ "${memory:-0}" -lt 100000 ] 2>/dev/null; then
    BATCH_SIZE=384
  fi
  TRAIN=(train --device "$DEVICE" --preset "$PRESET" --steps "$STEPS" --no-loader --stages pretrain,finetune)
  [ -n "${BATCH_SIZE:-}" ] && TRAIN+=(--batch-size "$BATCH_SIZE")
  LIVE=(live --size "$LIVE_MODEL" --device "$DEVICE" --no-viewer --starts 0)
  if [ "$L_SERVER" -gt 0 ] && ! $PY -c 'import zmq' 2>/dev/null; then
    echo "=== live-server: pyzmq is missing, left out"
    L_SERVER=0
  fi
  step train-switches "$L_TRAIN" $PY "${BENCH[@]}" "${TRAIN[@]}" \
    --variants eager,bf16-targets,blocks --json-out "$WORK/train-switches.json"
  step live-switches "$L_LIVE" $PY "${BENCH[@]}" "${LIVE[@]}" --no-server \
    --variants eager,bf16-weights,bf16-weights+cuda-graph --json-out "$WORK/live-switches.json"
  step tests-switches "$L_TESTS" $PY -m pytest -q -p no:cacheprovider tests/test_inference.py \
    -k "on_a_gpu and cuda_graph"
  step live-server "$L_SERVER" $PY "${BENCH[@]}" "${LIVE[@]}" --serve-with bf16-weights+cuda-graph \
    --json-out "$WORK/live-server.json"
  step train-whole "$L_WHOLE" $PY "${BENCH[@]}" "${TRAIN[@]}" --stages pretrain --variants compile \
    --json-out "$WORK/train-whole.json"
  echo "=== packed into $OUT/gpu-checklist.tgz"
  exit 0
fi

read -r L_TRAIN L_FLEX L_TESTS L_LIVE L_LIVE_LOW L_COMPILE <<<"${LIMITS:-180 80 100 90 0 90}"
step train "$L_TRAIN" $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" --json-out "$WORK/train.json" \
  --profile "$WORK/profile" --sync-check
step train-flex "$L_FLEX" env MEM_FLEX_ATTENTION=1 $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" \
  --stages pretrain,finetune --no-loader --json-out "$WORK/train-flex.json"
step tests-cuda "$L_TESTS" $PY -m pytest -q -p no:cacheprovider tests/test_train.py tests/test_scale.py \
  tests/test_representation.py -k "$TESTS"
step live "$L_LIVE" $PY "${BENCH[@]}" live --size "$LIVE_MODEL" --device "$DEVICE" --no-viewer --starts "$LIVE_STARTS" \
  --json-out "$WORK/live.json"
step live-3mev "$L_LIVE_LOW" $PY "${BENCH[@]}" live --size "$LIVE_MODEL" --device "$DEVICE" --no-viewer --starts 0 \
  --rate 3 --json-out "$WORK/live-3mev.json"
step train-compile "$L_COMPILE" $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" --compile \
  --stages finetune --no-loader --json-out "$WORK/train-compile.json"
echo "=== packed into $OUT/gpu-checklist.tgz"
