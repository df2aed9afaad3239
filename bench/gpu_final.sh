#!/usr/bin/env bash
# The closing GPU run of a session, as background jobs that outlive one device call (a warm machine
# keeps /tmp and setsid jobs between the calls of one hold; it is given back ~30 s after a call
# returns, so send each next call at once):
#   call 1  carry [".devcarry/fa4_libs"]:   bash bench/gpu_fa4_install.sh        (FA-4's 61 MiB libs)
#   call 2  carry [".devcarry/src_l", ".whl", ".devcarry/fa4", ".devcarry/fa2"]:
#           cd .devcarry/src_l && bash bench/gpu_final.sh start ../.. && bash bench/gpu_final.sh wait 480
#   call 3  cd .devcarry/src_l && bash bench/gpu_final.sh wait 420
# start ROOT: installs ROOT/.whl (platformdirs, junitparser, fla-core: missing on the image) and, when
# present, the FA-4 wheels ROOT/.devcarry/fa4 + call 1's libs into /tmp/site, then nsa-run; starts
# the FA-2 source build in the background when ROOT/.devcarry/fa2 is there (bench/gpu_fa2_build.sh,
# nice 19); then the job: `nsa-run oneshot --profile full --impl nsa_core,fla` (every stage; FA-4 in
# fa2-probe and the baselines when installed), then decode-bench with the fused decode kernel, then
# `nsa-run oneshot --profile quick` (the smoke check's wall time).
# wait SECONDS: waits for the job (at most SECONDS), prints the steps and the tables, copies logs and
# the run folders (as far as they got) into $OUT.
set -uo pipefail
L=/tmp/nsa-final; SRC=$(pwd); SITE=/tmp/site
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
case "${1:-}" in
start)
  R=${2:-.}; mkdir -p "$L"; rm -rf "$SITE"
  whl=("$R"/.whl/*.whl)
  for w in "$R"/.devcarry/fa4/*.whl; do  # one wheel per project: pip refuses the same one named twice
    [ -e "$w" ] || continue; p=$(basename "$w" | cut -d- -f1)
    ls "$R"/.whl/"$p"-*.whl > /dev/null 2>&1 || whl+=("$w")
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${whl[@]}" > "$L/pip.log" 2>&1 \
    || { echo "wheel install failed"; tail -3 "$L/pip.log"; }
  if [ -d /tmp/fa4_libs/nvidia_cutlass_dsl ]; then cp -a /tmp/fa4_libs/. "$SITE/"; echo "FA-4 libs copied in"
  else echo "no /tmp/fa4_libs (call 1 not run on this machine): FA-4 absent"; fi
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$L/pip.log" 2>&1 \
    || { echo "pip install -e . failed"; tail -3 "$L/pip.log"; exit 2; }
  if [ -d "$R/.devcarry/fa2" ] && [ -f bench/gpu_fa2_build.sh ]; then
    MAX_JOBS=10 FA2_CARRY="$R/.devcarry/fa2" bash bench/gpu_fa2_build.sh start 2>&1 | tail -5
  fi
  cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
step nsa-run oneshot --profile full --impl nsa_core,fla --out "$L/art" > "$L/oneshot.log" 2>&1
step nsa-run stage decode-bench --kernel fused --out "$L/art_fused" > "$L/decode_fused.log" 2>&1
step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
touch "$L/done"
JOB
  setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
  echo "started: $(date -u +%T)"; nvidia-smi -L ;;
wait)
  end=$((SECONDS + ${2:-500}))
  while [ ! -e "$L/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cat "$L/steps.txt" 2>/dev/null; [ -e "$L/done" ] || echo "NOT DONE yet: $(date -u +%T)"
  [ -f bench/gpu_fa2_build.sh ] && bash bench/gpu_fa2_build.sh status 2>&1 | tail -3
  grep -hE "^(env-pairing|sanity|selection-map|triton-|fa2-probe|prefill-bench|decode-bench|summary) " \
    "$L/oneshot.log" "$L/oneshot_quick.log" 2>/dev/null | cut -c1-160
  mkdir -p "$OUT"; cp "$L"/*.log "$L"/steps.txt "$OUT"/ 2>/dev/null
  tar czf "$OUT/art.tgz" -C "$L" --exclude='*.pt' $(cd "$L" && ls -d art* 2>/dev/null) 2>/dev/null
  grep -h "oneshot\|passed" "$L/oneshot.log" 2>/dev/null | tail -3 ;;
*) echo "usage: gpu_final.sh start ROOT | wait SECONDS"; exit 2 ;;
esac
