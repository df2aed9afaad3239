#!/usr/bin/env bash
# FA-4 on the GPU, device call 2 of 2 (after bench/gpu_fa4_install.sh on the same warm machine):
#   carry: [".devcarry/fa4"]        command: bash bench/gpu_fa4_run.sh    (timeout_s 600; $OUT is set there)
# 1. installs the small wheels (.devcarry/fa4, from bench/prepare_fa4.sh) into a fresh
#    /tmp/site and copies call 1's libs in; PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/
#    dsl_packages (pip --target skips the wheel's .pth that would add the second one);
# 2. import check (time), then fa4_check: FA-4 through nsa_core's adapters (compressed branch =
#    folded bottom-right causal, sliding window 512, decode row, dk=192/dv=128) fwd+bwd vs the
#    float64 reference, its return_lse vs float64 logsumexp, first-call (JIT) times; and a 64K
#    full-causal forward (B1 HQ64 G4 d128 bf16) timed with the shared timer (CUDA events) next
#    to SDPA's default / cuDNN / flash backends;
# 3. `nsa-run stage env-pairing` (FA-4 version + what it was built for) and
#    `nsa-run stage fa2-probe --profile full` (FA-4 rows in fa2_varlen.csv and fa2_bench.csv).
# Files in $OUT (at most 8 come back): fa4_check.txt, env.txt, fa2_probe.txt, fa2_probe.json,
# fa2_varlen.csv, fa2_bench.csv, stages.log.
set -uo pipefail
OUT=${OUT:-/tmp/fa4_out}; mkdir -p "$OUT"
LIBS=${FA4_LIBS:-/tmp/fa4_libs}; SITE=/tmp/site; ART=/tmp/fa4_art
export PYTHONUNBUFFERED=1
S0=$(date +%s)
step() { echo "[$(( $(date +%s) - S0 )) s] $*"; }
if [ ! -f "$LIBS/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so" ]; then
  echo "no $LIBS from call 1 (the machine was given back between the calls?): run bench/gpu_fa4_install.sh" \
       "with carry .devcarry/fa4_libs again, then this within 30 s"; exit 3
fi
rm -rf "$SITE" && python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devcarry/fa4/*.whl \
  || { echo "pip install of .devcarry/fa4 failed"; exit 2; }
cp -a "$LIBS/." "$SITE/"
export PYTHONPATH=$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages:$(pwd)
step "wheels installed: $(ls .devcarry/fa4 | tr '\n' ' ')"
python3 -c "import time; t=time.time(); import flash_attn.cute as m; from importlib.metadata import version as v; \
print('import flash_attn.cute', round(time.time()-t, 1), 's; flash-attn-4', v('flash-attn-4'), \
'nvidia-cutlass-dsl', v('nvidia-cutlass-dsl'), 'quack', v('quack-kernels'), 'tvm-ffi', v('apache-tvm-ffi'))" \
  2>&1 | tee "$OUT/fa4_check.txt" | tail -3
python3 -m pip install -q --no-deps --no-build-isolation -e . > /tmp/nsa_install.log 2>&1 \
  || { echo "pip install -e . failed:"; tail -5 /tmp/nsa_install.log; }
step "fa4_check"
# its own JIT cache folder, so that fa2-probe below starts cold (its wall_s shows a fresh pod's cost)
FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4_jit_check timeout 150 python3 - >> "$OUT/fa4_check.txt" 2>&1 <<'PY'
import time, torch
from nsa_core.config import NSAConfig
from nsa_core.compression import fast as cmp_fast, reference as cmp_ref
from nsa_core.window import fast as win_fast, reference as win_ref
from nsa_core.flash import adapters as K
from nsa_core.testing import compare
from nsa_runner.measure import timing

dev = "cuda"
print("status fa4:", K.status("fa4", "cuda"))
cfg = NSAConfig()  # l=32 d=16 w=512

def grads(fn, leaves, do):
    leaves = [x.detach().requires_grad_(True) for x in leaves]
    o = fn(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype))]

worst = 0.0
for B, T, Tq, HQ, G, dk, dv, dt in [(2, 1000, 1000, 16, 1, 128, 128, torch.bfloat16),
                                     (1, 2085, 2085, 16, 4, 128, 128, torch.float16),
                                     (1, 777, 777, 8, 2, 192, 128, torch.bfloat16),
                                     (3, 600, 1, 4, 1, 64, 64, torch.bfloat16),
                                     (2, 1000, 9, 8, 2, 64, 64, torch.float16)]:
    g = torch.Generator().manual_seed(T + HQ)
    q, k = (torch.randn(B, n, h, dk, generator=g, dtype=torch.float64) for n, h in ((Tq, HQ), (T, G)))
    v = torch.randn(B, T, G, dv, generator=g, dtype=torch.float64)
    do = torch.randn(B, Tq, HQ, dv, generator=g, dtype=torch.float64)
    q, k, v, do = (x.to(dev) for x in (q, k, v, do))
    kc, vc = cmp_ref.compress_avg(k, cfg), cmp_ref.compress_avg(v, cfg)
    for br, ref_fn, fa_fn, lv in [
        ("cmp", lambda a, b, c: cmp_ref.compressed_attention(a, b, c, T, cfg),
         lambda a, b, c: cmp_fast.compressed_attention(a, b, c, T, cfg, path="fa4"), [q, kc, vc]),
        ("win", lambda a, b, c: win_ref.sliding_attention(a, b, c, cfg.w),
         lambda a, b, c: win_fast.sliding_attention(a, b, c, cfg.w, path="fa4"), [q, k, v])]:
        ref = grads(ref_fn, lv, do)
        t0 = time.perf_counter()
        try:
            got = grads(fa_fn, [x.to(dt) for x in lv], do)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"{br} B{B} T{T} q{Tq} HQ{HQ} G{G} dk{dk} dv{dv} {dt}: FAILED {type(e).__name__}: {str(e)[:300]}")
            continue
        first = time.perf_counter() - t0
        cs = [compare(a, b, dt) for a, b in zip(got, ref)]
        worst = max(worst, *(c.rel_err for c in cs))
        print(f"{br} B{B} T{T} q{Tq} HQ{HQ} G{G} dk{dk} dv{dv} {str(dt)[6:]}: "
              + ("PASS" if all(c.ok for c in cs) else "FAIL") + f" first call {first:.2f} s; rel o/dq/dk/dv "
              + " ".join(f"{c.rel_err:.1e}" for c in cs) + f" (tol {cs[0].tol:.0e})")
print(f"worst rel err {worst:.1e}")
# return_lse (what the compressed branch's selection scores could reuse): a folded-shape call
# (40 query rows, 129 compressed keys, GQA 16 query heads per KV head), lse [B, Lq, H] vs float64
g = torch.Generator().manual_seed(7)
ql = torch.randn(1, 40, 64, 128, generator=g).to(dev, torch.bfloat16)
kl, vl = (torch.randn(1, 129, 4, 128, generator=g).to(dev, torch.bfloat16) for _ in range(2))
o, lse = K.attention_lse(ql, kl, vl, 0.125, "fa4", causal=True)
s = torch.einsum("bqhd,bkhd->bhqk", ql.double(), kl.double().repeat_interleave(16, 2)) * 0.125
vis = torch.arange(129, device=dev)[None, :] <= torch.arange(40, device=dev)[:, None] + (129 - 40)
want = torch.logsumexp(s.masked_fill(~vis, float("-inf")), -1).transpose(1, 2)
print(f"return_lse: shape {tuple(lse.shape)} {lse.dtype} (FA-4 gives [B, H, Lq]; adapters.attention_lse "
      f"transposes); max |lse - float64| {float((lse.double() - want).abs().max()):.1e}; o vs causal adapter "
      f"{float((o.float() - K.causal(ql, kl, vl, 0.125, 'fa4').float()).abs().max()):.1e}")
# 64K full causal, B1 HQ64 G4 d128 bf16: FA-4 vs SDPA backends (shared timer, CUDA events, median p20 p80)
B, S, HQ, G, D = 1, 65536, 64, 4, 128
g = torch.Generator(device=dev).manual_seed(0)
q = torch.randn(B, S, HQ, D, device=dev, dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(B, S, G, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(2))
from torch.nn.attention import SDPBackend, sdpa_kernel
qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
def sdpa(backends):
    def f():
        with sdpa_kernel(backends):
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
    return f
cands = {"fa4 (adapter causal)": lambda: K.causal(q, k, v, D ** -0.5, "fa4"),
         "sdpa default": lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                                                  enable_gqa=True),
         "sdpa cudnn": sdpa([SDPBackend.CUDNN_ATTENTION]), "sdpa flash": sdpa([SDPBackend.FLASH_ATTENTION])}
ref_o = cands["sdpa default"]().transpose(1, 2).float()
for name, fn in cands.items():
    try:
        t0 = time.perf_counter(); o = fn(); torch.cuda.synchronize(); first = time.perf_counter() - t0
        o = o if o.shape[1] == S else o.transpose(1, 2)
        err = float((o.float() - ref_o).norm() / ref_o.norm())
        t = timing.bench(fn, device=dev, rep_ms=300)
        print(f"64K causal {name:22} {t}  first call {first:.2f} s  rel diff vs sdpa default {err:.1e}")
    except Exception as e:  # noqa: BLE001
        print(f"64K causal {name:22} FAILED {type(e).__name__}: {str(e)[:200]}")
PY
echo "fa4_check rc=$?" >> "$OUT/fa4_check.txt"; cat "$OUT/fa4_check.txt"
step "env-pairing"
timeout 60 python3 -m nsa_runner.cli stage env-pairing --device cuda --out "$ART" > "$OUT/stages.log" 2>&1
echo "env-pairing rc=$?" >> "$OUT/stages.log"
step "fa2-probe --profile full"
LEFT=$(( 580 - ($(date +%s) - S0) ))  # the call's limit is 600 s: leave time to copy the files back
timeout $LEFT python3 -m nsa_runner.cli stage fa2-probe --device cuda --profile full --out "$ART" --thresholds none \
  >> "$OUT/stages.log" 2>&1
echo "fa2-probe rc=$? after $(( $(date +%s) - S0 )) s" >> "$OUT/stages.log"
for f in env.txt fa2_probe.txt fa2_probe.json fa2_varlen.csv fa2_bench.csv; do
  p=$(ls -t "$ART"/*/"$f" 2>/dev/null | head -1); [ -n "$p" ] && cp "$p" "$OUT/"
done
tail -25 "$OUT/stages.log"
grep -E "^(flash_attn|FA-4|flash_attn.cute)|FA-4" "$OUT/env.txt" 2>/dev/null | head -8
step "done"
