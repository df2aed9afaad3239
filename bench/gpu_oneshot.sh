#!/usr/bin/env bash
# The GPU validation recorded in docs/benchmarks.md: a full oneshot, a second run of the
# quicker stages, `nsa-run compare` between them and the report. Run from the checkout root
# on a CUDA machine whose python3 already has torch (nothing is replaced).
#   OUT=<folder for logs>  ART=<artifacts root>  bash bench/gpu_oneshot.sh
set -uo pipefail
OUT=${OUT:-/tmp/nsa-gpu-logs}; ART=${ART:-/tmp/nsa-gpu-art}
mkdir -p "$OUT" "$ART"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
  || { echo "pip install -e . failed:"; tail -5 "$OUT/install.log"; exit 2; }
run() { python3 -m nsa_runner.cli "$@"; }
run oneshot --profile full --out "$ART" 2>&1 | tee "$OUT/oneshot1.log"; rc1=${PIPESTATUS[0]}
run oneshot --profile full --out "$ART" --only env-pairing,sanity,selection-map,triton-fwd,decode-bench,summary \
  2>&1 | tee "$OUT/oneshot2.log"; rc2=${PIPESTATUS[0]}
A=$(ls "$ART" | grep -v '\.' | head -1)
run compare "$A" "$A.2" --out "$ART" --markdown > "$OUT/compare.md" 2> "$OUT/compare.err"; rcc=$?
run compare "$A" "$A.2" --out "$ART" --only-changed 2>&1 | tail -40
tar czf "$OUT/runs.tgz" -C "$ART" .
echo "oneshot full rc=$rc1  oneshot quick-stages rc=$rc2  compare rc=$rcc  run=$A"
