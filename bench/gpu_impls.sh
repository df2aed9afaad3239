#!/usr/bin/env bash
# Issue 15 on the GPU: the implementations under test side by side. One device call (H100, torch
# 2.11, no internet), from a checkout with the wheels in $WHL (carry .whl: fla-core, einops,
# platformdirs, junitparser, + filelock / psutil when the device lacks them):
#   OUT=<logs> WHL=.whl bash bench/gpu_impls.sh
# STAGES limits the oneshot when one call's 10 minutes are too short, e.g.
#   STAGES=env-pairing,sanity,selection-map,triton-fwd,triton-bwd,summary   (call 1)
#   STAGES=env-pairing,prefill-bench,summary                                 (call 2)
set -uo pipefail
OUT=${OUT:-/tmp/nsa-gpu-logs}; WHL=${WHL:-.whl}; STAGES=${STAGES:-}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl > "$OUT/pip.log" 2>&1 \
  || { echo "wheel install failed"; tail -5 "$OUT/pip.log"; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/pip.log" 2>&1 \
  || { echo "pip install -e . failed"; tail -5 "$OUT/pip.log"; exit 2; }
run() { python3 -m nsa_runner.cli "$@"; }
run list --impls --device cuda 2>&1 | tee "$OUT/impls.txt"
only=(); [ -n "$STAGES" ] && only=(--only "$STAGES")
timeout 560 python3 -m nsa_runner.cli oneshot --profile full --impl nsa_core,fla "${only[@]}" --out "$OUT/art" \
  > "$OUT/oneshot.log" 2>&1; rc=$?
tail -25 "$OUT/oneshot.log"
RUN=$(ls -d "$OUT"/art/*/ 2>/dev/null | tail -1)
[ -n "$RUN" ] && python3 bench/impls_table.py "$RUN" | tee "$OUT/impls_table.md"
tar czf "$OUT/art.tgz" -C "$OUT" art 2>/dev/null
echo "oneshot --impl nsa_core,fla rc=$rc run=$RUN"
