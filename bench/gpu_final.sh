#!/usr/bin/env bash
# The closing GPU run of a session, as background jobs that outlive one device call (a warm machine
# keeps /tmp and setsid jobs between the calls of one hold; it is given back ~30 s after a call
# returns, so send each next call at once):
#   call 1  carry [".devcarry/fa4_libs"]:   bash bench/gpu_fa4_install.sh        (FA-4's 61 MiB libs)
#           (or, the tree being too large beside them: split first; calls 1a / 1b carry .devcarry/fa4_p1, _p2)
#   call 2  carry [".devcarry/src_l", ".whl", ".devcarry/fa4", ".devcarry/fa2"]:
#           cd .devcarry/src_l && bash bench/gpu_final.sh start ../.. && bash bench/gpu_final.sh wait 480
#   call 3  bash .devcarry/src_l/bench/gpu_final.sh wait 420   (or /tmp/nsa-src/bench/gpu_final.sh)
# start ROOT: installs ROOT/.whl (platformdirs, junitparser, fla-core: missing on the image) and, when
# present, the FA-4 wheels ROOT/.devcarry/fa4 + call 1's libs into /tmp/site, then nsa-run; starts
# the FA-2 source build in the background when ROOT/.devcarry/fa2 is there (bench/gpu_fa2_build.sh,
# nice 19); then the job, one step after another (nothing else on the GPU while one is timed):
#   1. `nsa-run oneshot --profile full --impl nsa_core,fla` (issue 15's side-by-side; warms the
#      Triton / FA-4 / fla caches; the FA-2 build runs beside it, so its timings are not reported)
#   2. bench/gpu_decode14.sh (issue 14);  3. waits for the FA-2 build, then `nsa-run oneshot
#      --profile full`: the timed run on a warm machine (issue 13), its time ledger
#      (bench/time_ledger.py) and the cuDNN first-call probe (bench/cudnn_build_cost.py);  4. FA-2's
#      own test and fa2-probe with FA-2 importable;  5. `nsa-run oneshot --profile quick` twice
#      (the second: the warm smoke check)
# The job runs from a copy of the source in /tmp/nsa-src (see start), so later calls may re-sync.
# wait SECONDS: waits for the job (at most SECONDS), prints the steps and the tables, copies logs and
# the run folders (as far as they got) into $OUT.
set -uo pipefail
L=/tmp/nsa-final; SRC=$(pwd); SITE=/tmp/site
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
case "${1:-}" in
start)
  R=$(cd "${2:-.}" && pwd); mkdir -p "$L"; rm -rf "$SITE"
  # the job runs from a copy under /tmp: a later device call re-syncs the checkout and removes an
  # ignored folder it does not carry (seen: the source of a running job vanished mid-oneshot)
  rm -rf /tmp/nsa-src && cp -a "$SRC" /tmp/nsa-src && SRC=/tmp/nsa-src && cd "$SRC" || exit 2
  whl=("$R"/.whl/*.whl)
  for w in "$R"/.devcarry/fa4/*.whl; do  # one wheel per project: pip refuses the same one named twice
    [ -e "$w" ] || continue; p=$(basename "$w" | cut -d- -f1)
    ls "$R"/.whl/"$p"-*.whl > /dev/null 2>&1 || whl+=("$w")
  done
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "${whl[@]}" > "$L/pip.log" 2>&1 \
    || { echo "wheel install failed"; tail -3 "$L/pip.log"; }
  if [ -d /tmp/fa4_libs/nvidia_cutlass_dsl ]; then cp -a /tmp/fa4_libs/. "$SITE/"; echo "FA-4 libs copied in"
  else echo "no /tmp/fa4_libs (call 1 not run on this machine): FA-4 absent"; fi
  # bytecode, as a plain `pip install` writes it (--no-compile above, and the libs came as a tar): this
  # image sets PYTHONDONTWRITEBYTECODE or cannot write __pycache__, so without it every process that
  # imports FA-4 / fla compiled ~1,500-2,700 sources (4.4-6.5 s per stage, profiled 2026-11-25 night)
  echo "python env: PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE:-unset}; torch site writable: $( [ -w "$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')" ] && echo yes || echo no)"
  python3 -m compileall -q -j 8 "$SITE" > /dev/null 2>&1; echo "compiled $SITE: $(find "$SITE" -name '*.pyc' | wc -l) .pyc"
  python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$L/pip.log" 2>&1 \
    || { echo "pip install -e . failed"; tail -3 "$L/pip.log"; exit 2; }
  if [ -d "$R/.devcarry/fa2" ] && [ -f bench/gpu_fa2_build.sh ]; then
    MAX_JOBS=10 FA2_CARRY="$R/.devcarry/fa2" bash bench/gpu_fa2_build.sh start 2>&1 | tail -5
  fi
  if [ "${FINAL_PLAN:-}" = timed13 ]; then  # issue 13's closing figures: warm full and quick oneshots
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
for prof in full \${T13_QUICK:+quick}; do  # warm-up only: every stage at once per profile, its timings unused
  t0=\$SECONDS
  for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
    timeout 500 nsa-run stage "\$s" --profile \$prof --out "$L/art_warm_\${prof}_\$s" > "$L/warm_\${prof}_\$s.log" 2>&1 &
  done
  wait; echo "\$(date -u +%T) parallel warm-up \$prof: \$((SECONDS - t0)) s" >> "$L/steps.txt"
done
step nsa-run oneshot --profile full --out "$L/art" > "$L/oneshot.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art/*/ | head -1)" > "$L/ledger.txt" 2>&1
if [ -n "\${T13_QUICK:-}" ]; then
  step nsa-run oneshot --profile quick --out "$L/art_quick1" > "$L/oneshot_quick1.log" 2>&1
  step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
  python3 bench/time_ledger.py "\$(ls -d "$L"/art_quick/*/ | head -1)" > "$L/ledger_quick.txt" 2>&1
fi
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (timed13 plan, quick: ${T13_QUICK:-no}): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = quick13 ]; then  # issue 13's quick target: warm quick oneshots, then one profiled
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
t0=\$SECONDS
for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
  timeout 300 nsa-run stage "\$s" --profile quick --out "$L/art_warm_quick_\$s" > "$L/warm_quick_\$s.log" 2>&1 &
done
wait; echo "\$(date -u +%T) parallel warm-up quick: \$((SECONDS - t0)) s" >> "$L/steps.txt"
step nsa-run oneshot --profile quick --out "$L/art_quick1" > "$L/oneshot_quick1.log" 2>&1
step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
[ "${Q13_RUNS:-2}" = 3 ] && step nsa-run oneshot --profile quick --out "$L/art_quick3" > "$L/oneshot_quick3.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_quick1/*/ | head -1)" > "$L/ledger_quick1.txt" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_quick/*/ | head -1)" > "$L/ledger_quick.txt" 2>&1
if [ "${Q13_EXTRA:-1}" = 1 ]; then  # the bytecode cache off, and one run profiled (the CLI and every stage)
step env NSA_RUN_PYCACHE=0 nsa-run oneshot --profile quick --out "$L/art_nopyc" > "$L/oneshot_nopyc.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_nopyc/*/ | head -1)" > "$L/ledger_nopyc.txt" 2>&1
step env NSA_RUN_CPROFILE_DIR="$L/prof" python3 bench/cli_profile.py "$L/cli_prof.txt" oneshot --profile quick --out "$L/art_prof" > "$L/oneshot_prof.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_prof/*/ | head -1)" > "$L/ledger_prof.txt" 2>&1
fi
du -sh ~/.cache/nsa-run/pycache > "$L/pycache.txt" 2>&1; grep -h '"bytecode"' "$L"/art_quick/*/env.json >> "$L/pycache.txt" 2>&1
for f in "$L"/prof/*.prof; do echo "=== \$f"; python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(28)" "\$f" 2>&1 | grep -E "^ +[0-9]" | cut -c1-160; done > "$L/prof_top.txt" 2>&1
grep -h "wall\|parity:" "$L"/art_quick/*/fa2_probe.txt > "$L/fa2_quick_wall.txt" 2>&1
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (quick13 plan): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = profile ]; then  # issue 13: where each stage's warm time goes (cProfile per stage)
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
t0=\$SECONDS
for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
  timeout 500 nsa-run stage "\$s" --profile full --out "$L/art_warm_\$s" > "$L/warm_\$s.log" 2>&1 &
done
wait; echo "\$(date -u +%T) parallel warm-up: \$((SECONDS - t0)) s" >> "$L/steps.txt"
step python3 -X importtime -c "import torch, triton, nsa_core, nsa_core.functional; import flash_attn.cute" > /dev/null 2> "$L/importtime.txt"
step env NSA_RUN_CPROFILE_DIR="$L/prof" nsa-run oneshot --profile full --out "$L/art_prof" > "$L/oneshot_prof.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_prof/*/ | head -1)" > "$L/ledger_prof.txt" 2>&1
step python3 -m cProfile -o "$L/prof/cli_report.prof" -m nsa_runner.cli report "\$(ls -d "$L"/art_prof/*/ | head -1)" > "$L/report_prof.log" 2>&1
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (profile plan): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = decode15 ]; then  # issue 14: the five-launch step with PDL, measured and tested
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
# compile first, in parallel (the timed runs below then find their kernels in Triton's cache)
for spec in "--S 4096 8192 --B 1 16" "--S 16384 32768 --B 1 16" "--S 65536 --B 1" "--S 65536 --B 16"; do
  timeout 200 python3 bench/bench_decode.py warm \$spec --kernels triton split >> "$L/warm.log" 2>&1 &
done
step timeout 300 python3 -m pytest -q -p no:cacheprovider tests/core/test_decode.py tests/core/test_decode_paged.py \
  tests/core/test_decode_fused.py tests/core/test_decode_split.py tests/core/test_decode_counters.py > "$L/pytest_decode.log" 2>&1
wait
step timeout 400 python3 bench/bench_decode.py sweep-tune > "$L/sweep_tune.txt" 2>&1
step timeout 300 nsa-run stage decode-bench --profile full --kernel triton,split --out "$L/art_dec" > "$L/decode.log" 2>&1
python3 bench/bench_decode.py table "$L/art_dec" > "$L/table.md" 2>&1
step timeout 120 python3 bench/bench_decode.py profile --S 65536 --B 16 > "$L/profile_64k_b16.txt" 2>&1
step timeout 120 python3 bench/bench_decode.py profile --S 65536 --B 1 > "$L/profile_64k_b1.txt" 2>&1
step timeout 120 python3 bench/bench_decode.py profile --S 8192 --B 1 > "$L/profile_8k_b1.txt" 2>&1
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (decode15 plan): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = oneshot ]; then  # the README's oneshot on the GPU after CPU-side fixes: warm, then run it
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
t0=\$SECONDS
for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
  timeout 500 nsa-run stage "\$s" --out "$L/art_warm_\$s" > "$L/warm_\$s.log" 2>&1 &
done
wait; echo "\$(date -u +%T) parallel warm-up: \$((SECONDS - t0)) s" >> "$L/steps.txt"
step nsa-run oneshot --out "$L/art" > "$L/oneshot.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art/*/ | head -1)" > "$L/ledger.txt" 2>&1
# fla as a plugin adapter, in its own process (stages/_impl_host.py; since stop 42 bounded by nsa_runner/_contained.py)
for s in sanity triton-fwd triton-bwd selection-map; do
  step nsa-run stage "\$s" --impl nsa_core,fla --out "$L/art_fla" > "$L/fla_\$s.log" 2>&1
done
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (oneshot plan): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = final16 ]; then  # a session's closing GPU run: decode (issue 14), then warm oneshots
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
for spec in "--S 4096 8192 --B 1 16" "--S 16384 32768 --B 1 16" "--S 65536 --B 1" "--S 65536 --B 16"; do
  timeout 200 python3 bench/bench_decode.py warm \$spec --kernels triton split >> "$L/warm.log" 2>&1 &
done
step timeout 300 python3 -m pytest -q -p no:cacheprovider tests/core/test_decode.py tests/core/test_decode_paged.py \
  tests/core/test_decode_fused.py tests/core/test_decode_split.py tests/core/test_decode_counters.py > "$L/pytest_decode.log" 2>&1
wait
step timeout 300 nsa-run stage decode-bench --profile full --kernel triton,split --out "$L/art_dec" > "$L/decode.log" 2>&1
python3 bench/bench_decode.py table "$L/art_dec" > "$L/table.md" 2>&1
step timeout 120 python3 bench/bench_decode.py profile --S 8192 --B 1 > "$L/profile_8k_b1.txt" 2>&1
t0=\$SECONDS
for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
  timeout 500 nsa-run stage "\$s" --out "$L/art_warm_\$s" > "$L/warm_\$s.log" 2>&1 &
done
wait; echo "\$(date -u +%T) parallel warm-up: \$((SECONDS - t0)) s" >> "$L/steps.txt"
step nsa-run oneshot --out "$L/art" > "$L/oneshot.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art/*/ | head -1)" > "$L/ledger.txt" 2>&1
step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (final16 plan): $(date -u +%T)"; exit 0
  fi
  if [ "${FINAL_PLAN:-}" = probe ]; then  # the flash packages' session: no Triton-heavy stages
    cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
# FA-4's persistent JIT cache across processes: the same fa2-probe (parity only) twice, a fresh
# process each time (the first fills the cache, the second must reuse it)
step nsa-run stage fa2-probe --bench no --thresholds none --out "$L/art_p1" > "$L/probe1.log" 2>&1
step nsa-run stage fa2-probe --bench no --thresholds none --out "$L/art_p2" > "$L/probe2.log" 2>&1
du -sh "\$HOME/.cache/nsa-run/fa4_jit" > "$L/fa4_cache.txt" 2>&1; find "\$HOME/.cache/nsa-run/fa4_jit" -name '*.o' | wc -l >> "$L/fa4_cache.txt"
# FA-2 (built beside the above): parity AND bench rows, with FA-4 importable too
if [ -d "$R/.devcarry/fa2" ]; then
  step bash bench/gpu_fa2_build.sh wait 420 > "$L/fa2_wait.log" 2>&1
  bash bench/gpu_fa2_build.sh link-fa4 "$SITE" > "$L/fa2_link.log" 2>&1
  step env PYTHONPATH=/tmp/fa2site:$PYTHONPATH nsa-run stage fa2-probe --thresholds none --out "$L/art_fa2" > "$L/fa2probe.log" 2>&1
fi
# the quick profile on this machine: first (Triton cold) and second run
step nsa-run oneshot --profile quick --out "$L/art_quick1" > "$L/oneshot_quick1.log" 2>&1
step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
touch "$L/done"
JOB
    setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
    echo "started (probe plan): $(date -u +%T)"; exit 0
  fi
  cat > "$L/job.sh" <<JOB
cd "$SRC"; export PYTHONPATH=$PYTHONPATH PYTHONUNBUFFERED=1
step() { t0=\$SECONDS; "\$@"; rc=\$?; echo "\$(date -u +%T) rc=\$rc \$((SECONDS - t0)) s: \$*" >> "$L/steps.txt"; }
# 1. the first full oneshot on this cold machine (warms the Triton / FA-4 / fla caches; the FA-2
#    build runs beside it at nice 19, so its timings are not the ones reported). FINAL_IMPLS:
#    its --impl (default nsa_core,fla: issue 15's side by side; "default" = the README's oneshot)
if [ "${FINAL_IMPLS:-nsa_core,fla}" = default ]; then
  step nsa-run oneshot --profile full --out "$L/art_cold" > "$L/oneshot_cold.log" 2>&1
elif [ "${FINAL_IMPLS}" = parallel ]; then
  # warm-up only (its timings mean nothing): every stage in its own process at once, so the cold
  # compiles (Triton, FA-4's JIT, fla's autotune) share the 16 cores instead of queueing (~1,000 s
  # serial on stop 23's cold machine); the timed oneshot below then finds the caches filled
  t0=\$SECONDS
  for s in env-pairing sanity selection-map triton-fwd triton-bwd fa2-probe prefill-bench decode-bench; do
    timeout 500 nsa-run stage "\$s" --profile full --out "$L/art_warm_\$s" > "$L/warm_\$s.log" 2>&1 &
  done
  wait; echo "\$(date -u +%T) parallel warm-up: \$((SECONDS - t0)) s" >> "$L/steps.txt"
  grep -h "wall\|PASS\|FAIL\|ERROR" "$L"/warm_*.log | tail -20 > "$L/warm_summary.txt" 2>&1
else
  step nsa-run oneshot --profile full --impl "${FINAL_IMPLS:-nsa_core,fla}" --out "$L/art_impls" > "$L/oneshot_impls.log" 2>&1
fi
# 2. decode (issue 14): GPU decode tests, decode-bench triton / fused / fused-paged, profile
#    (D14_RUNS=none leaves it out)
if [ "${D14_RUNS:-}" != none ]; then
  mkdir -p "$L/d14"; step env OUT="$L/d14" D14_RUNS="${D14_RUNS:-triton fused fused-paged}" bash bench/gpu_decode14.sh > "$L/decode14.log" 2>&1
fi
# 3. the timed full oneshot on the now warm machine (issue 13); the FA-2 build must be over first
[ -d "$R/.devcarry/fa2" ] && step bash bench/gpu_fa2_build.sh wait 420 > "$L/fa2_wait.log" 2>&1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > "$L/gpu_apps_before_timed.txt" 2>&1
step nsa-run oneshot --profile full --out "$L/art" > "$L/oneshot.log" 2>&1
# where its time went (issue 13): the run folder's own records, split into parts that add up
python3 bench/time_ledger.py "\$(ls -d "$L"/art/*/ | head -1)" > "$L/ledger.txt" 2>&1
# the same oneshot with the spare worker (opt-in, NSA_RUN_SPARE_WORKER=1): the next stage's process
# imports torch while the current one runs; compare the two wall times (same machine, same caches)
step env NSA_RUN_SPARE_WORKER=1 nsa-run oneshot --profile full --out "$L/art_spare" > "$L/oneshot_spare.log" 2>&1
python3 bench/time_ledger.py "\$(ls -d "$L"/art_spare/*/ | head -1)" > "$L/ledger_spare.txt" 2>&1
# the hypothesis behind fa2-probe's parity time: a cuDNN graph built per new shape, per process
step python3 bench/cudnn_build_cost.py > "$L/cudnn_build.txt" 2>&1
# the fixed cost every stage's process pays (python + torch import + CUDA context), for the profile
step python3 -c "import time; t=time.time(); import torch; a=time.time(); torch.zeros(1, device='cuda'); \
import nsa_core; print(f'import torch {a-t:.2f} s, CUDA context {time.time()-a:.2f} s')" > "$L/overhead.txt" 2>&1
# 4. FA-2: its own test, then fa2-probe with FA-2 (and FA-4) importable
if [ -f /tmp/fa2site/flash_attn/__init__.py ]; then
  step bash bench/gpu_fa2_build.sh test > "$L/fa2_test.log" 2>&1
  bash bench/gpu_fa2_build.sh link-fa4 "$SITE" > "$L/fa2_link.log" 2>&1
  step env PYTHONPATH=/tmp/fa2site:$PYTHONPATH nsa-run stage fa2-probe --out "$L/art_fa2" > "$L/fa2probe.log" 2>&1
fi
# 5. the quick profile's wall time (smoke check; FINAL_QUICK=0 leaves it out)
# (twice: the first compiles the quick shapes' kernels; the second is the warm smoke check, < 60 s)
if [ "${FINAL_QUICK:-1}" = 1 ]; then
  step nsa-run oneshot --profile quick --out "$L/art_quick1" > "$L/oneshot_quick1.log" 2>&1
  step nsa-run oneshot --profile quick --out "$L/art_quick" > "$L/oneshot_quick.log" 2>&1
  python3 bench/time_ledger.py "\$(ls -d "$L"/art_quick/*/ | head -1)" > "$L/ledger_quick.txt" 2>&1
fi
touch "$L/done"
JOB
  setsid bash "$L/job.sh" > "$L/job.out" 2>&1 < /dev/null &
  echo "started: $(date -u +%T)"; nvidia-smi -L ;;
wait)
  end=$((SECONDS + ${2:-500}))
  while [ ! -e "$L/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cat "$L/steps.txt" 2>/dev/null; [ -e "$L/done" ] || echo "NOT DONE yet: $(date -u +%T)"
  [ -f bench/gpu_fa2_build.sh ] && bash bench/gpu_fa2_build.sh status 2>&1 | tail -3
  for f in oneshot_prof oneshot_impls oneshot_cold oneshot fla_sanity fla_triton-fwd fla_triton-bwd fla_selection-map oneshot_spare oneshot_quick1 oneshot_quick oneshot_quick3 oneshot_nopyc probe1 probe2 fa2probe; do
    [ -f "$L/$f.log" ] || continue; echo "== $f"
    grep -hE "^(env-pairing|sanity|selection-map|triton-|fa2-probe|prefill-bench|decode-bench|summary) |\[[0-9]/[0-9]\]" "$L/$f.log" | cut -c1-200
    grep -hE "passed, [0-9]+ failed" "$L/$f.log" | tail -1
  done
  [ -f "$L/d14/table.md" ] && { echo "== decode14"; cat "$L/d14/log.txt" "$L/d14/table.md"; }
  [ -f "$L/pytest_decode.log" ] && { echo "== decode tests"; tail -3 "$L/pytest_decode.log"; }
  [ -f "$L/sweep_tune.txt" ] && { echo "== sweep-tune"; cat "$L/sweep_tune.txt"; }
  [ -f "$L/table.md" ] && { echo "== decode15 table"; tail -4 "$L/decode.log"; cat "$L/table.md"; }
  for f in "$L"/profile_*.txt; do [ -f "$f" ] && { echo "== $f"; grep -A12 "partitioned" "$f"; }; done
  [ -f "$L/overhead.txt" ] && cat "$L/overhead.txt"
  [ -f "$L/cli_prof.txt" ] && head -3 "$L/cli_prof.txt"
  for f in ledger ledger_prof ledger_spare ledger_quick1 ledger_quick ledger_nopyc fa2_quick_wall pycache cudnn_build; do [ -f "$L/$f.txt" ] && { echo "== $f"; cat "$L/$f.txt"; }; done
  [ -f "$L/fa4_cache.txt" ] && { echo "FA-4 JIT cache:"; cat "$L/fa4_cache.txt"; }
  for d in "$L"/art_p1 "$L"/art_p2 "$L"/art_fa2; do grep -h "wall time" "$d"/*/fa2_probe.txt 2>/dev/null; done
  [ -f "$L/fa2probe.log" ] && { echo "== fa2-probe with FA-2"; tail -4 "$L/fa2probe.log"; tail -4 "$L/fa2_test.log"; }
  mkdir -p "$OUT"; cp "$L/steps.txt" "$OUT"/ 2>/dev/null
  tar czf "$OUT/session.tgz" -C "$L" --exclude='*.pt' --exclude='*.whl' --exclude='job.sh' \
    $(cd "$L" && ls -d *.log *.txt art* d14 prof 2>/dev/null) 2>/dev/null
  ls -la "$OUT" ;;
*) echo "usage: gpu_final.sh start ROOT | wait SECONDS"; exit 2 ;;
esac
