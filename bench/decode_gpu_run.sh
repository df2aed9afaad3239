#!/bin/bash
# Decode engineer's final device call: CUDA tests, `nsa-run stage decode-bench` (defaults: S 4k..64k,
# B 1,16, bf16, paper dims, triton impl, CUDA graphs), a kernel profile and a split-K chunk sweep.
# nsa-run is not pip-installed on the device: the entry points come from a generated dist-info.
set -u
export PYTHONUNBUFFERED=1
SITE=/tmp/nsa_site; mkdir -p $SITE/nsa_run-0.1.0.dist-info
python3 - <<'PY'
import pathlib, tomllib
eps = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]["entry-points"]["nsa_runner.stages"]
d = pathlib.Path("/tmp/nsa_site/nsa_run-0.1.0.dist-info")
(d / "METADATA").write_text("Metadata-Version: 2.1\nName: nsa-run\nVersion: 0.1.0\n")
(d / "entry_points.txt").write_text("[nsa_runner.stages]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
PY
export PYTHONPATH=$SITE:$(pwd)
L=$OUT/log.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch,triton;print('torch',torch.__version__,'cuda',torch.version.cuda,'triton',triton.__version__)"; } >$L 2>&1
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/core/test_decode.py -k "cuda or triton" >>$L 2>&1
echo "pytest rc=$?" >>$L
S0=$(date +%s)
timeout 270 python3 -m nsa_runner.cli stage decode-bench --out /tmp/art --device cuda --profile full >/tmp/cli.txt 2>&1
echo "cli rc=$? after $(( $(date +%s) - S0 ))s" >>$L
tail -6 /tmp/cli.txt >>$L
R=$(ls -d /tmp/art/*/ 2>/dev/null | head -1)
if [ -n "$R" ] && [ -f $R/decode.csv ]; then
  cp $R/decode_bench.txt $R/decode.csv $R/decode_summary.txt $R/decode.png $OUT/ 2>/dev/null
  cp $R/logs/decode-bench.log $OUT/stage.log 2>/dev/null
else  # the stage broke: keep its log and measure with the torch step so the call still reports numbers
  cp /tmp/cli.txt $OUT/stage.log
  timeout 120 python3 bench/bench_decode.py stage --out /tmp/art2 --kernel torch --S-list 4k,16k,64k >/dev/null 2>&1
  cp /tmp/art2/decode_bench.txt $OUT/decode_bench_torch.txt 2>/dev/null
fi
timeout 30 python3 bench/bench_decode.py profile --S 65536 --B 16 >$OUT/profile.txt 2>&1
timeout 25 python3 bench/bench_decode.py profile --S 16384 --B 1 >>$OUT/profile.txt 2>&1
timeout 50 python3 bench/bench_decode.py sweep --chunks 64 256 1024 --warps 4 --full-chunks 1024 4096 --iters 50 \
  >$OUT/sweep.txt 2>&1
echo "done after $(( $(date +%s) - S0 ))s" >>$L
cat $L
grep -A12 "^     S   B" $OUT/decode_bench.txt 2>/dev/null
grep -v "^#" $OUT/sweep.txt | tail -30
