#!/usr/bin/env bash
# Issue 11 on the GPU (one device call, ~7 min on an H100): the GPU tests of the fused scoring
# (incl. the compressed branch's lse), bench_scoring (choice check + the whole-NSA table with and
# without the lse), the A/B of the selection-attention kernels before/after the issue-17 dedupe,
# and the prefill-bench stage (--profile full) with fla when its wheel is carried.
# Run from a checkout on the device, with the wheels of platformdirs, junitparser, fla-core in
# $WHL:   OUT=<logs> WHL=.whl bash bench/gpu_issue11.sh
set -uo pipefail
OUT=${OUT:-/tmp/nsa-gpu-logs}; WHL=${WHL:-.whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WHL"/*.whl > "$OUT/pip.log" 2>&1 \
  || { echo "wheel install failed"; tail -5 "$OUT/pip.log"; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/pip.log" 2>&1 \
  || { echo "pip install -e . failed"; tail -5 "$OUT/pip.log"; exit 2; }
step() { local t0=$SECONDS; echo "== $1"; shift; "$@"; echo "== rc=$? in $((SECONDS - t0)) s"; }
step "gpu tests (scoring, lse)" timeout 200 python3 -m pytest -q -x -p no:cacheprovider \
  tests/core/test_selection_scoring.py -k "gpu" > "$OUT/pytest.log" 2>&1; tail -3 "$OUT/pytest.log"
step "bench_scoring" timeout 240 python3 bench/bench_scoring.py --what env,check,table --check-T 8192 \
  --T-list 8k,16k,32k,64k --out "$OUT/bs" > "$OUT/bench_scoring.log" 2>&1
step "A/B selection kernels" timeout 90 python3 bench/ab_selection_kernels.py > "$OUT/ab.log" 2>&1
tail -8 "$OUT/ab.log"
step "prefill-bench stage" timeout 260 nsa-run stage prefill-bench --profile full --out "$OUT/art" > "$OUT/prefill.log" 2>&1
tail -12 "$OUT/prefill.log"
cp "$OUT"/art/*/prefill.txt "$OUT/prefill.txt" 2>/dev/null
tar czf "$OUT/art.tgz" -C "$OUT" art bs 2>/dev/null; rm -rf "$OUT/art" "$OUT/bs/"*.json
grep -E "^\|" "$OUT/bench_scoring.log" | head -40
grep -E "NSA fwd|T=" "$OUT/bench_scoring.log" | grep -E "faster|no_lse|given_lse|cmp_fwd_" | tail -20
