#!/usr/bin/env bash
# The GPU checklist in one command, for a lent GPU machine (the device tool) or any CUDA machine, sized for one call
# of under 10 minutes (about 9 with every step at its limit):
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
# pyzmq or pydantic), the missing packages travel unpacked in .dev/site.tgz (see docs/BENCHMARKS.md, "GPU").
# Environment: PRESET (paper-ncars), DEVICE (cuda), LIVE_MODEL (vit-b), LIVE_STARTS (1), PY (python3), TESTS (step 3's
# pytest -k), LIMITS in seconds per step in the order above ("180 80 100 90 0 90"; 0 skips a step).
set -u
OUT=${OUT:-out/gpu-checklist}
PRESET=${PRESET:-paper-ncars}
DEVICE=${DEVICE:-cuda}
LIVE_MODEL=${LIVE_MODEL:-vit-b}
LIVE_STARTS=${LIVE_STARTS:-1}
PY=${PY:-python3}
TESTS=${TESTS:-(paper_preset_runs_its_code_paths and cuda) or generator_drives or on_a_gpu}
read -r L_TRAIN L_FLEX L_TESTS L_LIVE L_LIVE_LOW L_COMPILE <<<"${LIMITS:-180 80 100 90 0 90}"
WORK=$(mktemp -d)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 QT_QPA_PLATFORM=offscreen
if ! $PY -c 'import hdf5plugin, lz4.frame, zstandard, zmq, pydantic, timm.models.beit as b, inspect; assert "use_fc_norm" in inspect.signature(b.Beit).parameters' 2>/dev/null && [ -f .dev/site.tgz ]; then
  mkdir -p /tmp/site && tar xzf .dev/site.tgz -C /tmp/site && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

BENCH=(-c 'from bench.cli import app; app()')  # `$PY "${BENCH[@]}"`: `mem bench` without installing the entry point
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

step train "$L_TRAIN" $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" --json "$WORK/train.json" \
  --profile "$WORK/profile" --sync-check
step train-flex "$L_FLEX" env MEM_FLEX_ATTENTION=1 $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" \
  --stages pretrain,finetune --no-loader --json "$WORK/train-flex.json"
step tests-cuda "$L_TESTS" $PY -m pytest -q -p no:cacheprovider tests/test_train.py tests/test_scale.py \
  tests/test_representation.py -k "$TESTS"
step live "$L_LIVE" $PY "${BENCH[@]}" live --model "$LIVE_MODEL" --device "$DEVICE" --no-viewer --starts "$LIVE_STARTS" \
  --json "$WORK/live.json"
step live-3mev "$L_LIVE_LOW" $PY "${BENCH[@]}" live --model "$LIVE_MODEL" --device "$DEVICE" --no-viewer --starts 0 \
  --rate 3 --json "$WORK/live-3mev.json"
step train-compile "$L_COMPILE" $PY "${BENCH[@]}" train --device "$DEVICE" --preset "$PRESET" --compile \
  --stages finetune --no-loader --json "$WORK/train-compile.json"
echo "=== packed into $OUT/gpu-checklist.tgz"
