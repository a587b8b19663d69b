#!/usr/bin/env bash
# GPU evidence in one prepared device call (bench/gpu_evidence.py says what each mode does):
#   bash bench/gpu_evidence.sh prepare   # here: pack ncars-dev and the missing wheels into .gpu/, print the sizes
#   bash bench/gpu_evidence.sh run       # on the device, with .gpu carried and a 570-s limit; results to $OUT
#   bash bench/gpu_evidence.sh smoke     # here: the same run at a tiny scale on the CPU
#   bash bench/gpu_evidence.sh assemble PARTS --out RUN   # a pretraining run from the parts a call returned
# `run` uses the machine's python3 (PY) and installs the wheels of .gpu/wheels only when its packages lack them.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case "$mode" in
  run)
    PY=${PY:-python3}
    export PYTHONUNBUFFERED=1
    if ! $PY -c 'import pydantic, inspect, timm.models.beit as b; assert "use_fc_norm" in inspect.signature(b.Beit).parameters' 2>/dev/null; then
      $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-evidence-site .gpu/wheels/*.whl
      export PYTHONPATH=/tmp/gpu-evidence-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    mkdir -p "${OUT:-out/gpu-evidence}"
    $PY -m bench.gpu_evidence "$@" 2>&1 | tee "${OUT:-out/gpu-evidence}/run.log"
    ;;
  prepare | smoke | assemble)
    exec uv run python -m bench.gpu_evidence "$@"
    ;;
  *)
    echo "usage: bash bench/gpu_evidence.sh prepare | run | smoke | assemble PARTS --out RUN" >&2
    exit 2
    ;;
esac
