#!/usr/bin/env bash
# Issue 13 on the GPU, one device call (~3 min on a fresh machine): does fa2-probe's parity with the
# cuDNN rows in child processes (flash_bench.parity_apart) take the wall it should, against the same
# parity in one process (NSA_RUN_PARITY_JOBS=1), in the same call?  carry: [".whl"] (platformdirs,
# junitparser); FA-4 not carried (the cuDNN rows' cost does not depend on it).
#   run(command="bash bench/gpu_parity_apart.sh", carry=[".whl"], timeout_s=420)
# Then decode-bench under --profile quick (its GPU smoke configuration: 4K and 64K, 20 replays).
# Back in $OUT: log.txt (the table printed last), the run folders' fa2_probe.json / fa2_varlen.csv.
set -uo pipefail
OUT=${OUT:-/tmp/parity_apart_out}; mkdir -p "$OUT"; L=$OUT/log.txt
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl > "$OUT/pip.log" 2>&1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/pip.log" 2>&1 || { tail -3 "$OUT/pip.log"; exit 2; }
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; } > "$L" 2>&1
one() {  # label, env...
  local label=$1; shift
  local t0=$SECONDS
  env "$@" timeout 300 nsa-run stage fa2-probe --bench no --thresholds none --out "$OUT/$label" \
    > "$OUT/$label.log" 2>&1
  echo "$label rc=$? $((SECONDS - t0)) s: $(grep -h 'wall time' "$OUT"/$label/*/fa2_probe.txt)" >> "$L"
  grep -h "parity: " "$OUT/$label.log" | head -3 >> "$L"
  python3 bench/time_ledger.py "$(ls -d "$OUT"/$label/*/ | head -1)" 2>&1 | grep -i "parity\|fa2-probe" >> "$L"
}
one apart1 X=1
one serial NSA_RUN_PARITY_JOBS=1
one apart2 X=1
t0=$SECONDS
timeout 240 nsa-run stage decode-bench --profile quick --out "$OUT/dq" > "$OUT/decode_quick.log" 2>&1
echo "decode-bench --profile quick rc=$? $((SECONDS - t0)) s: $(grep -h 'PASS in\|FAIL in\|ERROR' "$OUT/decode_quick.log" | tail -1 | cut -c1-200)" >> "$L"
find "$OUT" -name '*.pt' -delete
tar czf "$OUT/runs.tgz" -C "$OUT" apart1 serial apart2 dq 2>/dev/null && rm -rf "$OUT"/apart1 "$OUT"/serial "$OUT"/apart2 "$OUT"/dq
cat "$L"
