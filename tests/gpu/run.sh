#!/usr/bin/env bash
# The GPU check: one command of at most 9 minutes on the lent GPU machine (one H100 or H200, Python 3.12,
# torch 2.11 CUDA 13, transformers 5.17, lightning 2.6.6; no network; no vllm, decord, av,
# hydra-core or omegaconf). It unpacks the wheel folder's archive (tests/gpu/wheels.txt: what is
# in it and the commands that make it), then runs tests/gpu/stages.py: single-rank NCCL collectives, one
# GRPOModule step of the Qwen3-VL-8B config under FSDP2 on one rank (random weights, 2 and 4
# layers, 64-frame clip, 4k/16k tokens; finite loss and gradients, peak memory against the memory
# plan), the transformers engine's own copy of an fp32-master policy (dtype, bytes), the
# transformers engine, the `gpu` tests; each stage under its own timeout with a JSON record in
# $OUT, and one summary table (also in $OUT/summary.txt). Within 9 minutes in all, and with the
# machine's start within the session's 15 (tests/gpu/stages.py: each stage's limit and expected time).
#   bash tests/gpu/run.sh [WHEEL_DIR] [stages.py options, e.g. --stages nccl,step]
# Not run yet: it waits for a GPU (docs/development.md, "What is verified where").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}
WHEELS=${1:-gpu-wheels}
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA GPU"' || {
  echo "tests/gpu/run.sh needs a CUDA GPU visible to $PY" >&2
  exit 2
}
# The wheels travel unpacked into one xz archive (the wheels themselves, 62.3 MiB, and the
# working tree would pass the 64 MiB a call carries): unpacked here, imported from $SITE.
SITE=${SITE:-/tmp/paravt-gpu-site}
if [ -f "$WHEELS/site.tar.xz" ]; then
  mkdir -p "$SITE"
  timeout 50 tar -xJf "$WHEELS/site.tar.xz" -C "$SITE"
else
  echo "no site.tar.xz in $WHEELS (see tests/gpu/wheels.txt); stages needing it will fail" >&2
fi
# Qwen's vocabulary (paravt.models.qwen_vocab) travels as this one file, not as its package.
if [ -f "$WHEELS/qwen.tiktoken.xz" ]; then export PARAVT_QWEN_TIKTOKEN="$WHEELS/qwen.tiktoken.xz"; fi
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"
timeout 480 "$PY" tests/gpu/stages.py --out "$OUT" "${@:2}"
