#!/usr/bin/env bash
# On a machine with a CUDA GPU and vLLM installed (`pip install -e '.[vllm]'`, docs/vllm.md):
# the `gpu` tests (CUDA paths, vLLM sleep/sync) and the engine benchmark, in under 10 minutes.
#   bash tests/gpu/run.sh [MODEL_DIR]   # MODEL_DIR: a real Qwen3-VL checkpoint for the benchmark
# Not run yet: no GPU was lent to the sessions that wrote it.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
"$PY" -c 'import torch, vllm; assert torch.cuda.is_available(), "no CUDA GPU"' || {
  echo "tests/gpu/run.sh needs a CUDA GPU and vLLM in $PY (pip install -e '.[vllm]')" >&2
  exit 2
}
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
timeout 360 "$PY" -m pytest tests/gpu -m gpu -q -p no:cacheprovider -s | tee "$OUT/gpu_tests.txt"
if [ $# -ge 1 ]; then
  BENCH=(--model "$1" --dtype bfloat16 --prompts 8 --group 8 --budget 32 --new-tokens 256)
else
  BENCH=(--prompts 8 --group 8 --new-tokens 128)
fi
timeout 220 "$PY" benchmarks/rollout_engines.py "${BENCH[@]}" | tee "$OUT/rollout_engines.txt"
