#!/usr/bin/env bash
# The closing GPU run of a session, as a background job that outlives one device call (a warm
# machine keeps /tmp and setsid jobs between calls of one hold):
#   bash bench/gpu_final.sh start WHEELS_DIR   install the carried wheels (platformdirs, junitparser,
#                                              fla-core) and nsa-run, then start the job and return
#   bash bench/gpu_final.sh wait SECONDS       wait for the job (at most SECONDS), print the tables,
#                                              copy logs + artifacts into $OUT
# The job: GPU pytest of the kernel tests (time-boxed), then `nsa-run oneshot --profile full
# --impl nsa_core,fla` (every stage; prefill-bench, decode-bench, the side-by-side impl tables).
set -uo pipefail
L=/tmp/nsa-final; SRC=$(pwd)
case "${1:-}" in
start)
  mkdir -p "$L"; export PYTHONUNBUFFERED=1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${2:-.whl}"/*.whl > "$L/pip.log" 2>&1 \
    || { echo "wheel install failed"; tail -3 "$L/pip.log"; }
  PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$L/pip.log" 2>&1 \
    || { echo "pip install -e . failed"; tail -3 "$L/pip.log"; exit 2; }
  cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
t0=\$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/core/test_selection_scoring.py tests/core/test_triton_sel.py \
  tests/core/test_gates.py tests/core/test_flash.py tests/core/test_decode.py tests/core/test_decode_paged.py > "$L/pytest.log" 2>&1
echo "pytest rc=\$? \$((SECONDS - t0)) s" >> "$L/steps.txt"
t0=\$SECONDS
nsa-run oneshot --profile full --impl nsa_core,fla --out "$L/art" > "$L/oneshot.log" 2>&1
echo "oneshot rc=\$? \$((SECONDS - t0)) s" >> "$L/steps.txt"
touch "$L/done"
JOB
  setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
  echo "started: $(date -u +%T)"; nvidia-smi -L ;;
wait)
  end=$((SECONDS + ${2:-500}))
  while [ ! -e "$L/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cat "$L/steps.txt" 2>/dev/null; [ -e "$L/done" ] || echo "NOT DONE yet: $(date -u +%T)"
  tail -3 "$L/pytest.log" 2>/dev/null
  grep -E "^\S*[0-9:]+ \+ .*\[[0-9]+/[0-9]+\]" "$L/oneshot.log" | tail -30
  mkdir -p "$OUT"; cp "$L"/*.log "$L"/steps.txt "$OUT"/ 2>/dev/null
  if [ -e "$L/done" ]; then
    tar czf "$OUT/art.tgz" -C "$L" art
    tail -25 "$L/oneshot.log"
  fi ;;
*) echo "usage: gpu_final.sh start WHEELS_DIR | wait SECONDS"; exit 2 ;;
esac
