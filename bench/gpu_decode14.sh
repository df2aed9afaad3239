#!/usr/bin/env bash
# Issue 14 (decode) on the GPU, one device call (~3.5 min on an H100; timeout_s 330):
#   carry: [".devcarry/decode14"]   command: bash bench/gpu_decode14.sh   ($OUT is set on the device)
# .devcarry/decode14 (ignored) holds the two pure-Python wheels nsa-run needs that the image lacks:
#   mkdir -p .devcarry/decode14 && cp .whl/platformdirs-*.whl .whl/junitparser-*.whl .devcarry/decode14/
# Steps, each time-boxed:
#  1. GPU pytest of the decode kernels with real concurrency (the fused step's last-arriver counters,
#     the paged cache through the Triton kernels, a graph-captured step vs float64, the timer)
#  2. `nsa-run stage decode-bench --profile full` (S 4k..64k, B 1,16, bf16, HQ=64 G=4 dk=192 dv=128,
#     CUDA graphs, L2 flushed, shares = profiled graph replays partitioned by kernel, sum 100%):
#     --kernel triton (6 launches), --kernel fused (2 launches), fused over a paged cache (16 tokens per
#     page) at 8k and 64k
#  3. the issue-14 table of the three runs (bench/bench_decode.py table) and a kernel profile of the
#     fused step at 64k / B=16
# Every step is time-boxed (60 + 70 + 70 + 40 + 25 s at most): the call ends inside 5 minutes even
# when a step hangs; typical ~3.5 min.
# Back in $OUT (8 files at most): table.md, triton.txt, fused.txt, pytest.log, profile.txt, log.txt,
# decode14.tgz (every run folder: decode.csv, decode_bench.txt, decode_summary.txt, decode.png, logs).
set -uo pipefail
OUT=${OUT:-/tmp/decode14_out}; mkdir -p "$OUT"
SITE=/tmp/site14; ART=/tmp/art14; rm -rf "$ART" "$SITE"; mkdir -p "$ART"
export PYTHONUNBUFFERED=1
L=$OUT/log.txt; S0=$(date +%s)
step() { echo "[$(( $(date +%s) - S0 )) s] $*" | tee -a "$L"; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader; } > "$L" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devcarry/decode14/*.whl >> "$L" 2>&1 \
  || step "wheel install failed (platformdirs / junitparser): the CLI may not import"
mkdir -p "$SITE/nsa_run-0.1.0.dist-info"   # the stages' entry points, without building the package
python3 - <<'PY' >> "$L" 2>&1
import pathlib, tomllib
eps = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["entry-points"]["nsa_runner.stages"]
d = pathlib.Path("/tmp/site14/nsa_run-0.1.0.dist-info")
(d / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa-run\nVersion: 0.1.0\n")
(d / "entry_points.txt").write_text("[nsa_runner.stages]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
PY
export PYTHONPATH=$SITE:$(pwd)
python3 -c "import torch, triton; p = torch.cuda.get_device_properties(0); print('torch', torch.__version__, 'cuda', \
torch.version.cuda, 'triton', triton.__version__, p.name, p.multi_processor_count, 'SMs')" >> "$L" 2>&1

step "1. pytest (decode kernels on the GPU)"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/core/test_decode_fused.py tests/core/test_decode_paged.py \
  "tests/core/test_decode.py::test_cuda_graph_step_matches_reference" tests/runner/test_measure_timing.py \
  > "$OUT/pytest.log" 2>&1
step "pytest rc=$? ($(tail -1 "$OUT/pytest.log"))"

bench() {  # name, time limit (s), decode-bench options
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m nsa_runner.cli stage decode-bench --out "$ART/$name" --device cuda --profile full "$@" \
    > "$ART/$name.log" 2>&1
  local rc=$? R
  R=$(ls -d "$ART/$name"/*/ 2>/dev/null | head -1)
  step "2. decode-bench $name ($*) rc=$rc: $(tail -1 "$ART/$name.log")"
  if [ -n "$R" ]; then cp "$R/decode_bench.txt" "$OUT/$name.txt" 2>/dev/null; fi
}
# D14_RUNS picks the runs (default all three; a closing hold whose oneshot already ran decode-bench
# with the triton kernel can leave that one out)
for run in ${D14_RUNS:-triton fused fused-paged}; do
  case $run in
    triton) bench triton 70 --kernel triton ;;
    fused) bench fused 70 --kernel fused ;;
    fused-paged) bench fused-paged 40 --kernel fused --page-size 16 --S-list 8k,64k ;;
    *) step "unknown run in D14_RUNS: $run" ;;
  esac
done

step "3. table + profiles"
python3 bench/bench_decode.py table "$ART" > "$OUT/table.md" 2>&1
timeout 25 python3 bench/bench_decode.py profile --S 65536 --B 16 --kernel fused --steps 5 > "$OUT/profile.txt" 2>&1
tar czf "$OUT/decode14.tgz" -C "$ART" . 2>/dev/null
step "done"
cat "$OUT/table.md"
