#!/usr/bin/env bash
# Issue 14 (decode) on the GPU, ONE device call (H100; well inside 5 minutes; timeout_s 330):
#   carry: [".devcarry/decode14"]   command: bash bench/gpu_decode14.sh   ($OUT is set on the device)
# .devcarry/decode14 (ignored: /.devcarry/ in .git/info/exclude) holds the two pure-Python wheels nsa-run
# needs that the device image lacks:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .devcarry/decode14 platformdirs junitparser
# Steps, each time-boxed (the call ends inside 5 minutes even when a step hangs):
#  1. GPU pytest of the decode kernels (split step: bf16 CUDA-graph replays vs float64, the last-arriver
#     counters under real concurrency; fused + paged: the older two-launch step)           <= 100 s
#  2. `nsa-run stage decode-bench --profile full --kernel split,triton` (S 4k..64k, B 1,16, bf16, HQ=64
#     G=4 dk=192 dv=128, CUDA graphs, L2 flushed; the new split step and the old 6-launch step as two
#     rows per point, same layer / context / float64 reference / full-attention baselines, timed
#     round-robin; shares = one profiled graph replay partitioned by kernel, sum 100%)       <= 120 s
#  3. the split step over a paged cache (16 tokens per page) at 8k and 64k                  <= 45 s
#  4. the issue-14 table (bench/bench_decode.py table) and a kernel profile of the split step <= 25 s
# D14_DEV=1 (the developer's measuring call) adds the two-launch fused step to step 2 and a geometry
# sweep of the split step (bench/bench_decode.py sweep-split) before the table.
# Back in $OUT (8 files at most): table.md, decode.txt, paged.txt, pytest.log, profile.txt, log.txt,
# decode14.tgz (every run folder: decode.csv, decode_bench.txt, decode_summary.txt, decode.png, logs),
# sweep.txt (D14_DEV=1).
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
timeout 45 python3 -m pytest -q -p no:cacheprovider \
  "tests/core/test_decode_split.py::test_split_graph_replays_match_reference_bf16" > "$OUT/pytest.log" 2>&1
step "pytest (split step, bf16 graph replays vs float64) rc=$? ($(tail -1 "$OUT/pytest.log"))"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/core/test_decode_split.py tests/core/test_decode_fused.py \
  tests/core/test_decode_paged.py "tests/core/test_decode.py::test_cuda_graph_step_matches_reference" \
  --deselect "tests/core/test_decode_split.py::test_split_graph_replays_match_reference_bf16" >> "$OUT/pytest.log" 2>&1
step "pytest (decode kernels) rc=$? ($(tail -1 "$OUT/pytest.log"))"

bench() {  # name, time limit (s), decode-bench options
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" python3 -m nsa_runner.cli stage decode-bench --out "$ART/$name" --device cuda --profile full "$@" \
    > "$ART/$name.log" 2>&1
  local rc=$? R
  R=$(ls -d "$ART/$name"/*/ 2>/dev/null | head -1)
  step "2. decode-bench $name ($*) rc=$rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$ART/$name.log")"
  if [ -n "$R" ]; then cp "$R/decode_bench.txt" "$OUT/$name.txt" 2>/dev/null; fi
}
if [ "${D14_DEV:-0}" = 1 ]; then
  bench decode 150 --kernel split,triton,fused --S-list 8k,64k
else
  bench decode 120 --kernel split,triton
fi
bench paged 45 --kernel split --page-size 16 --S-list 8k,64k

if [ "${D14_DEV:-0}" = 1 ]; then
  step "3. sweep-split"
  timeout 150 python3 bench/bench_decode.py sweep-split > "$OUT/sweep.txt" 2>&1
  step "sweep rc=$?"
fi
step "4. table + profile"
timeout 25 python3 bench/bench_decode.py profile --S 65536 --B 16 --kernel split --steps 5 > "$OUT/profile.txt" 2>&1
python3 bench/bench_decode.py table "$ART" > "$OUT/table.md" 2>&1
tar czf "$OUT/decode14.tgz" -C "$ART" . 2>/dev/null
step "done"
[ "${D14_DEV:-0}" = 1 ] && grep -v "^#" "$OUT/sweep.txt" | tail -60
cat "$OUT/table.md"
