#!/usr/bin/env bash
# FA-2 (flash-attn 2.8.3) source build on the GPU machine, time-boxed, as a background job that
# survives between device calls of one warm hold (issue 13). Payload: bench/prepare_fa2.sh
# (.devcarry/fa2: the sdist + fallback wheels). Run from the checkout root:
#
#   bash bench/gpu_fa2_build.sh start         unpack into /tmp/fa2build, TRIM, launch the build
#                                             (setsid nice -n 19; returns at once)
#   bash bench/gpu_fa2_build.sh status        progress: "17/25 objects, 6m12s", errors so far
#   bash bench/gpu_fa2_build.sh wait SECONDS  poll until the build ends or SECONDS pass
#                                             (rc 0 built, 1 failed, 75 still running, 2 never started)
#   bash bench/gpu_fa2_build.sh test          import flash_attn from /tmp/fa2site; fwd+bwd vs
#                                             fp32 SDPA (bf16/fp16, causal, window, full, GQA,
#                                             decode) and the trimmed cases that must fail loudly
#   bash bench/gpu_fa2_build.sh link-fa4 [/tmp/site]   FA-2 and FA-4 both own `flash_attn`: 2.8.3's
#                                             wheel even bundles an early flash_attn/cute, removed
#                                             at install; this links FA-4's (bench/gpu_fa4_*.sh)
#                                             in its place and prints the PYTHONPATH for both
#   bash bench/gpu_fa2_build.sh trim DIR      (local check, no GPU) TRIM an unpacked sdist in DIR
#   bash bench/gpu_fa2_build.sh check DIR     (local check) verify a TRIMmed tree is consistent
#
# Then, to use it: export PYTHONPATH=/tmp/fa2site:$PYTHONPATH (flash_attn + its dist-info, so
# nsa-run's probe and env-pairing read version 2.8.3); with FA-4 too, link-fa4's line.
#
# Build: `python3 setup.py bdist_wheel` in the trimmed tree (setup.py's own BuildExtension +
# ninja; FLASH_ATTENTION_FORCE_BUILD=TRUE so it never looks for a prebuilt wheel online), then
# `pip install --no-index --no-deps --target /tmp/fa2site` of that wheel. Not `pip wheel`: on a
# failed build pip runs `setup.py clean --all`, which deletes every object already compiled
# (seen in the dry run); this way a second `start` recompiles only what failed or changed.
# Only sm_90: 2.8.3's setup.py reads FLASH_ATTN_CUDA_ARCHS ("80;90;100;120" by default; "90"
# gives the single -gencode arch=compute_90,code=sm_90). MAX_JOBS=12 (4 of the 16 cores left to
# the GPU job beside it), NVCC_THREADS=1 (nvcc's --threads only parallelises across -gencode
# targets, and there is one).
#
# TRIM (what nsa-run calls FA-2 with: nsa_core/flash/adapters.py _fa2 -> flash_attn_func for the
# cmp / win branches, causal (-1, 0), window (w-1, 0) and full (-1, -1), fwd + bwd, GQA, Lq <= Lk;
# nsa_runner/measure/flash_probe.py flash_attn_varlen_func (causal + window); stages/
# prefill_bench.py flash_attn_func(causal=True) as a full-attention baseline; fla's window branch.
# Head dims: parity cases D=64/128 (nsa_runner/measure/flash_bench.py), bench D=128, probe D=64,
# prefill-bench dk=dv=128; dtypes fp16 + bf16):
#   - head dims 64 and 128 only (FA2_HDIMS): 2.8.3 rounds a head dim up to 32/64/96/128/192/256;
#     HEADDIM_SWITCH (static_switch.h) is rewritten so a head dim that would need a dropped
#     kernel (<= 32, 65..96, > 128) raises RuntimeError naming it, never a silent fallback;
#   - fp16 + bf16, causal + non-causal (local/window runs in the non-causal files), forward,
#     backward and split-KV forward kept (FA2_SPLITKV=keep: 2.8.3's mha_fwd picks split-KV on
#     its own for small batch*heads, e.g. the parity cases and decode; FA2_SPLITKV=drop removes
#     them, forces num_splits=1 and makes kvcache/paged calls fail loudly);
#   - -DFLASHATTENTION_DISABLE_{DROPOUT,ALIBI,SOFTCAP,UNEVEN_K} (FA2_DISABLE) for both nvcc and
#     the host compiler (flash_api.cpp's TORCH_CHECKs then refuse dropout > 0, alibi slopes,
#     softcap > 0 and a head dim that is not a multiple of 32 with a message). nsa-run passes
#     dropout_p=0, no alibi, no softcap, D in {64, 128}. Each halves the template variants
#     compiled per file.
#   .cu files: 72 in the sdist -> 24 kept (8 fwd + 8 bwd + 8 split-KV; 16 with
#   FA2_SPLITKV=drop); objects to compile: 25 (24 .cu + flash_api.cpp; 17 with drop).
#
# Measured on the CPU machine (2 shared AMD EPYC vCPUs, nvcc 13.0.88 from the nvidia-cuda-nvcc
# wheel, -gencode arch=compute_90,code=sm_90, user CPU s / peak RSS): untrimmed
# flash_fwd_hdim64_bf16 232 s / 3.8 GB; trimmed flash_bwd_hdim128_bf16 141 s / 6.1 GB,
# flash_fwd_hdim64_bf16 89 s / 3.4 GB, flash_fwd_split_hdim128_bf16 135 s / 3.9 GB; the host
# flash_api.cpp (trimmed, keep and drop variants, torch 2.13 headers, -std=c++17) compiles.
# So ~2,500 CPU-s for the 25 objects: ~4-5 min at 12 jobs (the longest object ~2.5 min), 5-8
# min with setup.py's overhead, the link, nice 19 and a GPU job beside it; 12 jobs need <= ~65 GB.
#
# Logs (all in /tmp/fa2build, copied to $OUT when set): env.log (machine, torch, nvcc, tools),
# trim.log, build.log.gz (pip -v + ninja + nvcc output), progress.log (a timestamped line every
# 20 s: objects done/total, elapsed, load, memory), ninja_times.log (each object's compile time
# from .ninja_log), status.txt, test.log; rc (the build's exit status) and done (its end time).
#
# Knobs (environment): FA2_CARRY (.devcarry/fa2), FA2_BUILD (/tmp/fa2build), FA2_SITE
# (/tmp/fa2site), FA2_HDIMS ("64 128"), FA2_SPLITKV (keep|drop), FA2_DISABLE ("DROPOUT ALIBI
# SOFTCAP UNEVEN_K"), FA2_CXX_STD (c++17 as upstream; c++20 if torch's headers insist: only
# flash_api.cpp recompiles), MAX_JOBS (12), NVCC_THREADS (1), FA2_NICE (19), FA2_CLEAN=1 (start
# over: delete /tmp/fa2build; otherwise a second `start` reuses the objects already built).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
CARRY=${FA2_CARRY:-$ROOT/.devcarry/fa2}
B=${FA2_BUILD:-/tmp/fa2build}
SRC=$B/flash_attn-2.8.3
SITE=${FA2_SITE:-/tmp/fa2site}
TOOLS=$B/tools
HDIMS=${FA2_HDIMS:-64 128}
SPLITKV=${FA2_SPLITKV:-keep}
DISABLE=${FA2_DISABLE:-DROPOUT ALIBI SOFTCAP UNEVEN_K}
CXX_STD=${FA2_CXX_STD:-c++17}
JOBS=${MAX_JOBS:-12}
NVT=${NVCC_THREADS:-1}
NICE=${FA2_NICE:-19}
SDIST_NAME=flash_attn-2.8.3.tar.gz

ts() { date -u +%H:%M:%S; }
say() { echo "[$(ts)] $*"; }
die() { echo "gpu_fa2_build.sh: $*" >&2; exit 2; }
fmt_s() { local s=$1; printf '%dm%02ds' $((s / 60)) $((s % 60)); }

copy_out() {  # logs -> $OUT (flat names: at most 8 files come back)
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] || return 0
  local f
  for f in env.log trim.log progress.log ninja_times.log status.txt test.log; do
    [ -f "$B/$f" ] && cp "$B/$f" "$OUT/$f"
  done
  [ -f "$B/build.log" ] && gzip -c "$B/build.log" > "$OUT/build.log.gz"
  return 0
}

# ---------------------------------------------------------------------------------------------
# TRIM: a Python step over the unpacked sdist (idempotent; refuses a tree trimmed differently)
trim_tree() {  # trim_tree SRC_DIR
  python3 - "$1" "$HDIMS" "$SPLITKV" "$DISABLE" "$CXX_STD" <<'PY'
import json, re, sys
from pathlib import Path

src, hdims, splitkv, disable, cxx_std = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
ALL_HDIMS = [32, 64, 96, 128, 192, 256]  # 2.8.3's HEADDIM_SWITCH rounding steps


def bad_knob(msg):  # a bad setting: one line, exit code 2, nothing touched yet
    print(f"trim: {msg}", file=sys.stderr)
    sys.exit(2)


hdims = sorted({int(h) for h in hdims.split() if h.isdigit()})
if not hdims or len(hdims) != len(set(sys.argv[2].split())) or any(h not in ALL_HDIMS for h in hdims):
    bad_knob(f"FA2_HDIMS={sys.argv[2]!r}: each must be one of {ALL_HDIMS}")
if splitkv not in ("keep", "drop"):
    bad_knob(f"FA2_SPLITKV={splitkv!r}: keep or drop")
disable = sorted(set(disable.split()))
if set(disable) - {"DROPOUT", "ALIBI", "SOFTCAP", "UNEVEN_K"}:
    bad_knob(f"FA2_DISABLE={sys.argv[4]!r}: any of DROPOUT ALIBI SOFTCAP UNEVEN_K "
             "(LOCAL and BACKWARD stay: nsa-run needs window attention and gradients)")
if cxx_std not in ("c++17", "c++20"):
    bad_knob(f"FA2_CXX_STD={cxx_std!r}: c++17 or c++20")
defines = [f"-DFLASHATTENTION_DISABLE_{d}" for d in disable]
config = {"hdims": hdims, "splitkv": splitkv, "disable": disable, "cxx_std": cxx_std}
MARK = "nsa-run trim"
kdir = src / "csrc/flash_attn/src"
setup_py, switch_h, api_cpp = src / "setup.py", kdir / "static_switch.h", src / "csrc/flash_attn/flash_api.cpp"
record = src / "NSA_TRIM.json"

if MARK in setup_py.read_text():
    old = json.loads(record.read_text())
    if old["config"]["cxx_std"] != cxx_std and {**old["config"], "cxx_std": cxx_std} == config:
        # only the host -std changes: flash_api.cpp alone recompiles (ninja compares commands)
        t = setup_py.read_text()
        was = f'compiler_c17_flag=["-O3", "-std={old["config"]["cxx_std"]}"]'
        if t.count(was) != 1:
            sys.exit(f"trim: setup.py: expected one {was!r}")
        setup_py.write_text(t.replace(was, f'compiler_c17_flag=["-O3", "-std={cxx_std}"]'))
        old["config"]["cxx_std"] = cxx_std
        record.write_text(json.dumps(old, indent=1) + "\n")
        print(f"trim: host compiler now -std={cxx_std} (flash_api.cpp only)")
    if old["config"] != config:
        sys.exit(f"trim: {src} was trimmed with {old['config']}, now asked for {config}: "
                 "FA2_CLEAN=1 to start over")
    print(f"trim: {src} already trimmed with {config} ({old['cu_before']} -> {old['cu_after']} .cu files)")
    sys.exit(0)

NAME = re.compile(r"flash_(fwd_split|fwd|bwd)_hdim(\d+)_(fp16|bf16)(_causal)?_sm80\.cu")
cu = sorted(p.name for p in kdir.glob("*.cu"))
parsed = {}
for name in cu:
    m = NAME.fullmatch(name)
    if not m:
        sys.exit(f"trim: unexpected kernel file {name} (not flash_{{fwd,bwd,fwd_split}}_hdimN_{{fp16,bf16}}[_causal]_sm80.cu)")
    parsed[name] = (m.group(1), int(m.group(2)), m.group(3), bool(m.group(4)))
keep = [n for n, (kind, h, _, _) in parsed.items() if h in hdims and (kind != "fwd_split" or splitkv == "keep")]
drop = [n for n in cu if n not in keep]

# 1. setup.py: its source list must name exactly the .cu files on disk; rewrite it to the kept
#    ones, longest compiles first (ninja starts edges in file order: backward, forward, split-KV,
#    then the host flash_api.cpp), and add the -D flags for nvcc AND the host compiler
text = setup_py.read_text()
m = re.search(r'(name="flash_attn_2_cuda",\s*sources=\[)(.*?)(\n\s*\],)', text, re.S)
if not m:
    sys.exit("trim: setup.py: no `name=\"flash_attn_2_cuda\", sources=[...]` block")
listed = re.findall(r'"([^"]+)"', m.group(2))
listed_cu = sorted(Path(s).name for s in listed if s.endswith(".cu"))
if listed_cu != cu or "csrc/flash_attn/flash_api.cpp" not in listed or len(listed) != len(cu) + 1:
    sys.exit(f"trim: setup.py lists {len(listed)} sources, the tree has {len(cu)} .cu + flash_api.cpp: "
             f"only in setup.py {sorted(set(listed_cu) - set(cu))}, only on disk {sorted(set(cu) - set(listed_cu))}")
order = {"bwd": 0, "fwd": 1, "fwd_split": 2}
keep.sort(key=lambda n: (order[parsed[n][0]], -parsed[n][1], n))
indent = " " * 16
new_list = "".join(f'\n{indent}"csrc/flash_attn/src/{n}",' for n in keep) + f'\n{indent}"csrc/flash_attn/flash_api.cpp",'
text = text[:m.start(2)] + f"  # {MARK}: {len(keep)} of {len(cu)} kernels" + new_list + text[m.end(2):]

def replace_once(t, old, new, what):
    if t.count(old) != 1:
        sys.exit(f"trim: {what}: expected exactly one {old!r}, found {t.count(old)}")
    return t.replace(old, new)

text = replace_once(text, '"cxx": compiler_c17_flag,', '"cxx": compiler_c17_flag + NSA_TRIM_DEFINES,', "setup.py cxx flags")
text = replace_once(text, '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag),',
                    '"nvcc": append_nvcc_threads(nvcc_flags + cc_flag + NSA_TRIM_DEFINES),', "setup.py nvcc flags")
if cxx_std != "c++17":
    text = replace_once(text, 'compiler_c17_flag=["-O3", "-std=c++17"]', f'compiler_c17_flag=["-O3", "-std={cxx_std}"]',
                        "setup.py host -std")
text = replace_once(text, "\ncmdclass = {}\n",
                    f"\n# {MARK} (bench/gpu_fa2_build.sh): features nsa-run never uses, off in kernels and host code\n"
                    f"NSA_TRIM_DEFINES = {defines!r}\n\ncmdclass = {{}}\n", "setup.py cmdclass")
setup_py.write_text(text)

# 2. static_switch.h: HEADDIM_SWITCH keeps 2.8.3's rounding (<=32, <=64, <=96, <=128, <=192, <=256)
#    but a step whose kernels were dropped raises (TORCH_CHECK; the macro is expanded only in
#    flash_api.cpp, which includes torch first)
sw = switch_h.read_text()
m = re.search(r"#define HEADDIM_SWITCH\(HEADDIM, \.\.\.\)[^\n]*\n(?:[^\n]*\\\n)*[^\n]*\}\(\)", sw)
if not m or [int(x) for x in re.findall(r"kHeadDim = (\d+);", m.group(0))] != ALL_HDIMS:
    sys.exit("trim: static_switch.h: HEADDIM_SWITCH is not 2.8.3's (32/64/96/128/192/256)")
msg = (f'"flash-attn 2.8.3 trimmed by nsa-run: no kernels for head dim ", HEADDIM, '
       f'" (built: {", ".join(map(str, hdims))}; bench/gpu_fa2_build.sh)"')
lines = [f"// {MARK}: only head dims {hdims} were compiled; any other step fails loudly",
         "#define HEADDIM_SWITCH(HEADDIM, ...)", "  [&] {"]
for i, h in enumerate(ALL_HDIMS):
    cond = f"{'if' if i == 0 else '} else if'} (HEADDIM <= {h}) {{"
    lines.append(f"    {cond}")
    if h in hdims:
        lines += [f"      constexpr static int kHeadDim = {h};", "      return __VA_ARGS__();"]
    else:
        lines.append(f"      TORCH_CHECK(false, {msg});")
lines += ["    } else {", f"      TORCH_CHECK(false, {msg});", "    }", "  }()"]
width = max(len(s) for s in lines) + 1
macro = "\n".join(lines[:1] + [s.ljust(width) + "\\" for s in lines[1:-1]] + lines[-1:])
switch_h.write_text(sw[:m.start()] + macro + sw[m.end():])

# 3. split-KV dropped: flash_api.cpp must not reference run_mha_fwd_splitkv_dispatch (it would
#    be an undefined symbol at import), never choose a split itself, and refuse a forced one
api = api_cpp.read_text()
if splitkv == "drop":
    api = replace_once(api, "run_mha_fwd_splitkv_dispatch<elem_type, kHeadDim, Is_causal>(params, stream);",
                       'TORCH_CHECK(false, "flash-attn 2.8.3 trimmed by nsa-run: no split-KV kernels '
                       '(num_splits=", params.num_splits, ", forced=", force_split_kernel, "): kvcache with new '
                       'keys, paged KV and num_splits > 1 are unavailable (bench/gpu_fa2_build.sh)");',
                       "flash_api.cpp split-KV dispatch")
    api = replace_once(api, "params.num_splits = num_splits_heuristic(batch_size * num_heads * num_m_blocks, num_sm * 2, num_n_blocks, 128);",
                       f"params.num_splits = 1;  // {MARK}: no split-KV kernels built", "flash_api.cpp split heuristic")
    api_cpp.write_text(api)

for n in drop:
    (kdir / n).unlink()
doc = {"config": config, "defines": defines, "cu_before": len(cu), "cu_after": len(keep),
       "objects_total": len(keep) + 1, "kept": keep, "dropped": drop}
record.write_text(json.dumps(doc, indent=1) + "\n")
print(f"trim: {len(cu)} .cu files -> {len(keep)} kept ({len(drop)} deleted); head dims {hdims}; "
      f"split-KV {splitkv}; {' '.join(defines)}; host -std={cxx_std}")
print(f"trim: objects to compile: {len(keep) + 1} ({len(keep)} .cu + flash_api.cpp), in this order:")
for n in keep:
    print(f"  {n}")
PY
}

# ---------------------------------------------------------------------------------------------
# CHECK: the trimmed tree is consistent (every kernel the switches can reach has its .cu, setup.py
# lists exactly those, each .cu instantiates what its name says, no dangling split-KV reference)
check_tree() {  # check_tree SRC_DIR
  python3 - "$1" <<'PY'
import json, re, sys
from pathlib import Path

src = Path(sys.argv[1])
doc = json.loads((src / "NSA_TRIM.json").read_text())
cfg, kdir = doc["config"], src / "csrc/flash_attn/src"
bad = []
hd = cfg["hdims"]
# what HEADDIM_SWITCH x FP16_SWITCH x BOOL_SWITCH(is_causal) can instantiate
sw = (kdir / "static_switch.h").read_text()
m = re.search(r"#define HEADDIM_SWITCH.*?\}\(\)", sw, re.S)
reach = sorted(int(x) for x in re.findall(r"kHeadDim = (\d+);", m.group(0)))
if reach != hd:
    bad.append(f"HEADDIM_SWITCH reaches head dims {reach}, the build keeps {hd}")
if len(re.findall(r"TORCH_CHECK\(false", m.group(0))) != 7 - len(hd):
    bad.append("HEADDIM_SWITCH: not every dropped head dim step raises")
kinds = ["fwd", "bwd"] + (["fwd_split"] if cfg["splitkv"] == "keep" else [])
need = {f"flash_{k}_hdim{h}_{t}{'_causal' if c else ''}_sm80.cu" for k in kinds for h in reach
        for t in ("fp16", "bf16") for c in (False, True)}
have = {p.name for p in kdir.glob("*.cu")}
if need - have:
    bad.append(f"kernels reachable by the switches but missing: {sorted(need - have)}")
if have - need:
    bad.append(f"kernel files nothing reaches (should be deleted): {sorted(have - need)}")
TMPL = {"fwd": "run_mha_fwd_<{t}, {h}, {c}>", "bwd": "run_mha_bwd_<{t}, {h}, {c}>",
        "fwd_split": "run_mha_fwd_splitkv_dispatch<{t}, {h}, {c}>"}
CT = {"fp16": "cutlass::half_t", "bf16": "cutlass::bfloat16_t"}
for n in sorted(have):
    k, h, t, c = re.fullmatch(r"flash_(fwd_split|fwd|bwd)_hdim(\d+)_(fp16|bf16)(_causal)?_sm80\.cu", n).groups()
    want = TMPL[k].format(t=CT[t], h=h, c="true" if c else "false")
    if want not in (kdir / n).read_text():
        bad.append(f"{n} does not instantiate {want}")
# setup.py's list == kept .cu + flash_api.cpp, each on disk; flags in both compilers
setup = (src / "setup.py").read_text()
m = re.search(r'name="flash_attn_2_cuda",\s*sources=\[(.*?)\n\s*\],', setup, re.S)
listed = re.findall(r'"([^"]+)"', m.group(1))
if sorted(Path(s).name for s in listed if s.endswith(".cu")) != sorted(have):
    bad.append("setup.py's source list differs from the .cu files on disk")
if "csrc/flash_attn/flash_api.cpp" not in listed:
    bad.append("setup.py lost flash_api.cpp")
bad += [f"setup.py lists a missing file {s}" for s in listed if not (src / s).exists()]
if len(listed) != doc["objects_total"]:
    bad.append(f"setup.py lists {len(listed)} sources, NSA_TRIM.json says {doc['objects_total']} objects")
for needle in ('"cxx": compiler_c17_flag + NSA_TRIM_DEFINES', "nvcc_flags + cc_flag + NSA_TRIM_DEFINES",
               f"NSA_TRIM_DEFINES = {doc['defines']!r}"):
    if needle not in setup:
        bad.append(f"setup.py lacks {needle!r}")
api = (src / "csrc/flash_attn/flash_api.cpp").read_text()
calls = re.findall(r"run_mha_fwd_splitkv_dispatch<", api)
if cfg["splitkv"] == "drop" and calls:
    bad.append("flash_api.cpp still calls run_mha_fwd_splitkv_dispatch (undefined symbol at import)")
if cfg["splitkv"] == "keep" and len(calls) != 1:
    bad.append("flash_api.cpp: expected its one split-KV dispatch")
# every FLASHATTENTION_DISABLE_* used by flash_api.cpp / the kernels is one 2.8.3 knows
used = set(re.findall(r"FLASHATTENTION_DISABLE_(\w+)", api + sw))
if set(cfg["disable"]) - used:
    bad.append(f"FA2_DISABLE names macros the sources never test: {sorted(set(cfg['disable']) - used)}")
print(f"check: {len(have)} .cu kept of {doc['cu_before']}; objects {doc['objects_total']}; "
      f"head dims {reach}; split-KV {cfg['splitkv']}; {' '.join(doc['defines'])}")
if bad:
    print("check: INCONSISTENT:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("check: consistent (switch-reachable kernels == .cu files == setup.py sources; no dangling references)")
PY
}

# ---------------------------------------------------------------------------------------------
objects_done() { find "$SRC/build" -name '*.o' 2>/dev/null | wc -l; }
objects_total() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['objects_total'])" "$SRC/NSA_TRIM.json" 2>/dev/null || echo '?'; }
job_alive() { [ -f "$B/pid" ] && kill -0 "$(cat "$B/pid")" 2>/dev/null; }

status_line() {
  local now start el state
  now=$(date +%s)
  start=$(cat "$B/started" 2>/dev/null || echo "$now")
  if [ -f "$B/rc" ]; then
    el=$(( $(cat "$B/done") - start ))
    if [ "$(cat "$B/rc")" = 0 ]; then state="DONE (rc 0)"; else state="FAILED (rc $(cat "$B/rc"))"; fi
  elif job_alive; then
    el=$(( now - start )); state="running"
  elif [ -f "$B/started" ]; then
    el=$(( now - start )); state="DEAD (job gone without writing rc: killed? machine restarted?)"
  else
    echo "not started ($B/started missing)"; return
  fi
  echo "$(objects_done)/$(objects_total) objects, $(fmt_s "$el"), $state"
}

build_errors() {  # the first compiler errors, if any
  [ -f "$B/build.log" ] || return 0
  grep -n -E "error:|error #|FAILED:|Killed|No space left|RuntimeError|CalledProcessError|ERROR:" "$B/build.log" \
    | grep -v -E "^[0-9]+:\s*warning" | head -n 25
}

write_status() {
  {
    echo "$(ts) $(status_line)"
    echo "build dir $B, site $SITE, trim: $(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['config'])" "$SRC/NSA_TRIM.json" 2>/dev/null)"
    echo "--- progress.log (last 5)"; tail -n 5 "$B/progress.log" 2>/dev/null
    echo "--- errors in build.log (first 25)"; build_errors
    echo "--- build.log (last 15 lines)"; tail -n 15 "$B/build.log" 2>/dev/null | cut -c1-400
    [ -f "$B/ninja_times.log" ] && { echo "--- slowest objects"; head -n 8 "$B/ninja_times.log"; }
    if [ -f "$B/rc" ] && [ "$(cat "$B/rc")" = 0 ]; then
      echo "--- installed"; ls -la "$SITE"/flash_attn_2_cuda*.so "$SITE"/flash_attn-*.dist-info 2>/dev/null | head
    fi
  } > "$B/status.txt"
  cat "$B/status.txt"
}

# ---------------------------------------------------------------------------------------------
preflight() {  # machine facts -> env.log; tools the build needs (carried wheels where missing)
  mkdir -p "$B"
  {
    echo "=== $(date -u) gpu_fa2_build.sh preflight"
    echo "host $(hostname) cores $(nproc) load $(cut -d' ' -f1-3 /proc/loadavg)"
    free -g | head -2
    df -h "$B" | tail -1
    command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
    echo "python3: $(command -v python3) $(python3 -V 2>&1)"
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cxx11abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
    echo "nvcc: $(command -v nvcc || echo MISSING)"; nvcc --version 2>&1 | tail -2
    echo "c++: $(c++ --version 2>&1 | head -1)"
    python3 -m pip --version
  } > "$B/env.log" 2>&1
  cat "$B/env.log"
  command -v nvcc > /dev/null || die "no nvcc on PATH (CUDA_HOME=${CUDA_HOME:-unset}): cannot build"
  # tools: what setup.py imports / requires; carried wheels only where the image lacks one
  mkdir -p "$TOOLS"
  local missing=() w
  python3 -c "import packaging.version" 2> /dev/null || missing+=(packaging)
  python3 -c "from wheel.bdist_wheel import bdist_wheel" 2> /dev/null || missing+=(wheel)
  python3 -c "import psutil" 2> /dev/null || missing+=(psutil)
  python3 -c "import einops" 2> /dev/null || missing+=(einops)
  python3 -c "import setuptools" 2> /dev/null || missing+=(setuptools)
  python3 -c "import ninja" 2> /dev/null || missing+=(ninja)  # setup_requires checks the distribution
  if [ ${#missing[@]} -gt 0 ]; then
    say "the image lacks ${missing[*]}: installing the carried wheels into $TOOLS" | tee -a "$B/env.log"
    for w in "${missing[@]}"; do
      ls "$CARRY"/"$w"-*.whl > /dev/null 2>&1 || die "no carried wheel for $w in $CARRY (bash bench/prepare_fa2.sh)"
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$TOOLS" "$CARRY"/"$w"-*.whl \
        >> "$B/env.log" 2>&1 || die "pip could not install $CARRY/$w-*.whl (env.log)"
    done
  else
    say "tools: packaging, wheel, psutil, einops, setuptools, ninja all in the image" | tee -a "$B/env.log"
  fi
  export PYTHONPATH="$TOOLS${PYTHONPATH:+:$PYTHONPATH}" PATH="$TOOLS/bin:$PATH"
  if ! command -v ninja > /dev/null; then  # torch runs the ninja binary; pip --target drops the wheel's data/scripts
    say "no ninja binary on PATH: taking it from the carried ninja wheel" | tee -a "$B/env.log"
    mkdir -p "$TOOLS/bin"
    python3 - "$TOOLS/bin" "$CARRY"/ninja-*.whl <<'PY' || die "could not extract ninja from the carried wheel"
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[2])
name = next(n for n in z.namelist() if n.endswith(".data/scripts/ninja"))
dst = os.path.join(sys.argv[1], "ninja")
open(dst, "wb").write(z.read(name))
os.chmod(dst, 0o755)
PY
  fi
  echo "ninja: $(command -v ninja) $(ninja --version 2>&1)" | tee -a "$B/env.log"
}

cmd_start() {
  [ "${FA2_CLEAN:-0}" = 1 ] && { job_alive && die "a build is running (pid $(cat "$B/pid")): wait for it first"; rm -rf "$B"; }
  if job_alive; then say "already running (pid $(cat "$B/pid")):"; write_status; return 0; fi
  [ -f "$CARRY/$SDIST_NAME" ] || die "no $CARRY/$SDIST_NAME: run bash bench/prepare_fa2.sh here and carry .devcarry/fa2"
  if [ -f "$CARRY/SHA256SUMS" ]; then
    (cd "$CARRY" && sha256sum -c --quiet SHA256SUMS) || die "$CARRY does not match its SHA256SUMS (a broken copy?)"
  fi
  preflight
  if [ ! -d "$SRC" ]; then
    say "unpacking $SDIST_NAME into $B"
    tar -xzf "$CARRY/$SDIST_NAME" -C "$B" || die "tar failed"
    echo "cu_files_in_sdist $(ls "$SRC"/csrc/flash_attn/src/*.cu | wc -l)" >> "$B/env.log"
  else
    say "reusing $SRC (objects already built: $(objects_done); FA2_CLEAN=1 to start over)"
  fi
  echo "=== $(date -u) start" >> "$B/trim.log"
  trim_tree "$SRC" 2>&1 | tee -a "$B/trim.log"; [ "${PIPESTATUS[0]}" = 0 ] || die "trim failed (trim.log)"
  check_tree "$SRC" 2>&1 | tee -a "$B/trim.log"; [ "${PIPESTATUS[0]}" = 0 ] || die "the trimmed tree is inconsistent (trim.log)"
  rm -f "$B/rc" "$B/done" "$B/ninja_times.log"
  [ -f "$B/build.log" ] && mv "$B/build.log" "$B/build.prev.log"
  date +%s > "$B/started"
  echo "=== $(date -u +%H:%M:%S) start: $(objects_done)/$(objects_total) objects already built" >> "$B/progress.log"
  local cuda_home lib
  cuda_home=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
  # torch links the extension with -lcudart from $CUDA_HOME/lib64 (or lib); a CUDA laid out by
  # pip wheels has only libcudart.so.13: give the linker an unversioned name through LIBRARY_PATH
  if [ ! -e "$cuda_home/lib64/libcudart.so" ] && [ ! -e "$cuda_home/lib/libcudart.so" ]; then
    lib=$(find "$cuda_home" -name 'libcudart.so.*' 2> /dev/null | head -1)
    if [ -n "$lib" ]; then
      mkdir -p "$TOOLS/lib" && ln -sf "$lib" "$TOOLS/lib/libcudart.so"
      export LIBRARY_PATH="$TOOLS/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
      say "no libcudart.so in $cuda_home/lib64: linking through $TOOLS/lib/libcudart.so -> $lib" | tee -a "$B/env.log"
    else
      say "WARNING: no libcudart.so* under $cuda_home: the final link will likely fail" | tee -a "$B/env.log"
    fi
  fi
  say "launching: MAX_JOBS=$JOBS NVCC_THREADS=$NVT FLASH_ATTN_CUDA_ARCHS=90 CUDA_HOME=$cuda_home nice -n $NICE"
  # the job: setup.py bdist_wheel (objects land in $SRC/build), then pip install --target;
  # a sampler writes progress.log every 20 s while it runs
  FA2_B="$B" FA2_SRC="$SRC" FA2_SITE_="$SITE" \
  MAX_JOBS="$JOBS" NVCC_THREADS="$NVT" FLASH_ATTN_CUDA_ARCHS=90 TORCH_CUDA_ARCH_LIST=9.0 \
  FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_SKIP_CUDA_BUILD=FALSE BUILD_TARGET=cuda \
  CUDA_HOME="$cuda_home" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
  setsid nice -n "$NICE" bash -c '
    B=$FA2_B; SRC=$FA2_SRC; SITE=$FA2_SITE_
    total=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[\"objects_total\"])" "$SRC/NSA_TRIM.json")
    t0=$(cat "$B/started")
    ( while [ ! -f "$B/rc" ] && kill -0 $$ 2> /dev/null; do
        n=$(find "$SRC/build" -name "*.o" 2>/dev/null | wc -l); el=$(( $(date +%s) - t0 ))
        printf "%s %d/%s objects, %dm%02ds, load %s, mem avail %s MiB, nvcc/cicc/ptxas procs %s\n" \
          "$(date -u +%H:%M:%S)" "$n" "$total" $((el / 60)) $((el % 60)) "$(cut -d" " -f1 /proc/loadavg)" \
          "$(awk "/MemAvailable/ {print int(\$2/1024)}" /proc/meminfo)" "$(pgrep -c -f "cicc|ptxas|nvcc" || true)" \
          >> "$B/progress.log"
        sleep 20
      done ) &
    cd "$SRC" || exit 1
    echo "=== $(date -u) python3 setup.py bdist_wheel (total objects $total)"
    rm -rf "$B/dist"
    python3 setup.py bdist_wheel --dist-dir "$B/dist"
    rc=$?
    if [ $rc = 0 ]; then
      echo "=== $(date -u) pip install --target $SITE"
      rm -rf "$SITE"
      python3 -m pip install --no-index --no-deps --no-compile --target "$SITE" "$B"/dist/flash_attn-*.whl
      rc=$?
      # 2.8.3 packs an early copy of flash_attn/cute (its __version__ 0.1.0): it would shadow
      # FA-4 (flash-attn-4 4.0.0b36, whose flash_attn/ is a namespace portion). Removed here;
      # `gpu_fa2_build.sh link-fa4` links FA-4 in its place.
      if [ $rc = 0 ] && [ -d "$SITE/flash_attn/cute" ]; then
        rm -rf "$SITE/flash_attn/cute" && echo "removed the flash_attn/cute that 2.8.3 bundles (not FA-4)"
      fi
    fi
    # each object compile time from ninja log (start end mtime output hash; ms)
    nl=$(find "$SRC/build" -name .ninja_log 2>/dev/null | head -1)
    if [ -n "$nl" ]; then
      awk -F"\t" "NR > 1 {printf \"%7.1f s  %s\n\", (\$2 - \$1) / 1000, \$4}" "$nl" | sort -rn > "$B/ninja_times.log"
    fi
    date +%s > "$B/done"
    echo $rc > "$B/rc"
    echo "=== $(date -u) build job rc=$rc"
  ' > "$B/build.log" 2>&1 < /dev/null &
  echo $! > "$B/pid"
  sleep 2
  say "build job pid $(cat "$B/pid") (setsid; log $B/build.log)"
  write_status > /dev/null
  echo "$(status_line)"
  copy_out
}

cmd_status() {
  [ -d "$B" ] || { echo "no $B: not started"; return 2; }
  write_status
  copy_out
  [ -f "$B/rc" ] && return "$(cat "$B/rc" | tr -cd 0-9 | cut -c1-3)"
  return 0
}

cmd_wait() {
  local limit=${1:-}
  [[ "$limit" =~ ^[0-9]+$ ]] || die "wait needs SECONDS (a whole number), got '${limit}'"
  [ -f "$B/started" ] || { echo "not started ($B/started missing)"; return 2; }
  local t_end=$(( $(date +%s) + limit )) last=0
  while [ ! -f "$B/rc" ] && [ "$(date +%s)" -lt "$t_end" ]; do
    job_alive || break
    if [ $(( $(date +%s) - last )) -ge 30 ]; then echo "[$(ts)] $(status_line)"; last=$(date +%s); fi
    sleep 5
  done
  write_status
  copy_out
  if [ -f "$B/rc" ]; then [ "$(cat "$B/rc")" = 0 ] && return 0 || return 1; fi
  job_alive && { echo "still running after ${limit} s"; return 75; }
  echo "the build job is gone without an rc"; return 1
}

cmd_link_fa4() {  # FA-2 and FA-4 share the top-level package flash_attn: make flash_attn.cute FA-4's
  local fa4=${1:-/tmp/site}
  [ -f "$SITE/flash_attn/__init__.py" ] || { echo "no FA-2 in $SITE (build first)"; return 2; }
  if [ -d "$fa4/flash_attn/cute" ]; then
    ln -sfn "$fa4/flash_attn/cute" "$SITE/flash_attn/cute"
    echo "linked $SITE/flash_attn/cute -> $fa4/flash_attn/cute (FA-4)"
  else
    echo "no FA-4 at $fa4/flash_attn/cute: flash_attn.cute stays absent (FA-2 only)"
  fi
  echo "use: export PYTHONPATH=$SITE:$fa4:$fa4/nvidia_cutlass_dsl/dsl_packages:\$PYTHONPATH"
}

cmd_test() {
  [ -f "$B/rc" ] && [ "$(cat "$B/rc")" = 0 ] || { echo "no finished build (status: $(status_line))"; copy_out; return 2; }
  mkdir -p "$B"
  cat > "$B/fa2_test.py" <<'PY'
"""FA-2 from /tmp/fa2site vs fp32 SDPA with an explicit mask: fwd + bwd, bf16/fp16, the head dims
kept, causal / window / full, GQA, Lq < Lk (bottom-right), decode (Lq = 1: split-KV when kept);
then what the trim dropped must fail loudly."""
import json, os, sys, time

import torch
import torch.nn.functional as F

t0 = time.perf_counter()
import flash_attn
from flash_attn import flash_attn_func, flash_attn_varlen_func

dev = os.environ.get("FA2_TEST_DEVICE", "cuda")  # cpu: a smoke run of this script over a fake flash_attn
print(f"flash_attn {flash_attn.__version__} from {os.path.dirname(flash_attn.__file__)} "
      f"(import {time.perf_counter() - t0:.1f} s); torch {torch.__version__} cuda {torch.version.cuda}; "
      f"{torch.cuda.get_device_name() if dev == 'cuda' else dev}")
trim = json.load(open(sys.argv[1]))["config"]
print(f"trim: {trim}")
TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}  # vs fp32; a wrong mask gives O(0.1..1)


def ref_attn(q, k, v, left, right, scale):
    """fp32 SDPA with the flash-attn mask (bottom-right aligned); -1 = unbounded side."""
    B, Lq, H, D = q.shape
    Lk, G = k.shape[1], k.shape[2]
    k, v = (x.repeat_interleave(H // G, dim=2) for x in (k, v))
    i = torch.arange(Lq, device=dev)[:, None] + (Lk - Lq)
    j = torch.arange(Lk, device=dev)[None, :]
    m = torch.ones(Lq, Lk, dtype=torch.bool, device=dev)
    if left >= 0:
        m &= j >= i - left
    if right >= 0:
        m &= j <= i + right
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=m, scale=scale)
    return o.transpose(1, 2)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


fails = 0
g = torch.Generator(device=dev).manual_seed(0)
for D in trim["hdims"]:
    for dtype in (torch.bfloat16, torch.float16):
        for name, (B, Lq, Lk, H, G), (left, right) in (
                ("causal", (2, 1024, 1024, 8, 2), (-1, 0)),
                ("window127", (2, 1024, 1024, 8, 2), (127, 0)),
                ("full", (1, 300, 300, 4, 4), (-1, -1)),
                ("causal Lq<Lk", (2, 9, 1000, 8, 2), (-1, 0)),
                ("decode", (3, 1, 600, 16, 4), (-1, -1))):
            q = torch.randn(B, Lq, H, D, device=dev, dtype=dtype, generator=g)
            k = torch.randn(B, Lk, G, D, device=dev, dtype=dtype, generator=g)
            v = torch.randn(B, Lk, G, D, device=dev, dtype=dtype, generator=g)
            do = torch.randn(B, Lq, H, D, device=dev, dtype=dtype, generator=g)
            scale = D ** -0.5
            causal = (left, right) == (-1, 0)
            leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
            try:
                o = flash_attn_func(*leaves, dropout_p=0.0, softmax_scale=scale, causal=causal,
                                    window_size=(-1, -1) if causal else (left, right))
                gr = torch.autograd.grad(o, leaves, do)
            except Exception as e:  # noqa: BLE001
                print(f"FAIL D={D} {str(dtype)[6:]} {name}: {type(e).__name__}: {str(e)[:300]}")
                fails += 1
                continue
            rl = [x.float().detach().requires_grad_(True) for x in (q, k, v)]
            ro = ref_attn(*rl, left, right, scale)
            rg = torch.autograd.grad(ro, rl, do.float())
            errs = [rel(o, ro)] + [rel(a, b) for a, b in zip(gr, rg)]
            ok = all(e < TOL[dtype] for e in errs)
            fails += not ok
            print(f"{'PASS' if ok else 'FAIL'} D={D:3} {str(dtype)[6:]:8} {name:13} B={B} Lq={Lq} Lk={Lk} "
                  f"H={H} G={G}: rel o {errs[0]:.2e} dq {errs[1]:.2e} dk {errs[2]:.2e} dv {errs[3]:.2e} "
                  f"(tol {TOL[dtype]:.0e})")

# varlen (nsa-run's probe: causal + window through flash_attn_varlen_func)
D = trim["hdims"][0]
T, H = 300, 4
q, k, v = (torch.randn(2 * T, H, D, device=dev, dtype=torch.float16, generator=g) for _ in range(3))
cu = torch.tensor([0, T, 2 * T], device=dev, dtype=torch.int32)
o = flash_attn_varlen_func(q, k, v, cu, cu, T, T, softmax_scale=D ** -0.5, causal=True, window_size=(63, 0))
r = torch.cat([ref_attn(x[None].float(), y[None].float(), z[None].float(), 63, 0, D ** -0.5)[0]
               for x, y, z in zip(q.split(T), k.split(T), v.split(T))])
e = rel(o, r)
fails += e >= TOL[torch.float16]
print(f"{'PASS' if e < TOL[torch.float16] else 'FAIL'} varlen D={D} fp16 window63 2x{T}: rel o {e:.2e}")


def must_fail(what, fn, needle):
    global fails
    try:
        fn()
    except RuntimeError as e:
        ok = needle in str(e)
        print(f"{'PASS' if ok else 'FAIL'} loud failure, {what}: {str(e).splitlines()[0][:160]}")
        fails += not ok
        return
    print(f"FAIL {what}: ran without an error (a trimmed kernel must never run silently)")
    fails += 1


dropped = [h for h in (32, 64, 96, 128, 192, 256) if h not in trim["hdims"]]
for h in dropped[:3]:
    x = torch.randn(1, 64, 2, h, device=dev, dtype=torch.bfloat16)
    must_fail(f"head dim {h}", lambda x=x: flash_attn_func(x, x, x, causal=True), "no kernels for head dim")
x = torch.randn(1, 64, 2, trim["hdims"][0], device=dev, dtype=torch.bfloat16)
if "DROPOUT" in trim["disable"]:
    must_fail("dropout_p=0.1", lambda: flash_attn_func(x, x, x, dropout_p=0.1), "does not support dropout")
if "SOFTCAP" in trim["disable"]:
    must_fail("softcap=30", lambda: flash_attn_func(x, x, x, softcap=30.0), "does not support softcap")
if trim["splitkv"] == "drop":
    from flash_attn import flash_attn_with_kvcache
    kc, vc = x.clone(), x.clone()  # appending new keys forces the split-KV kernel
    must_fail("flash_attn_with_kvcache(k=, v=)", lambda: flash_attn_with_kvcache(
        x[:, :1], kc, vc, k=x[:, :1], v=x[:, :1], cache_seqlens=32), "no split-KV kernels")

# nsa-run's own adapter, when the checkout imports here
try:
    from nsa_core.flash import adapters
except Exception as e:  # noqa: BLE001
    print(f"(nsa_core not importable here, adapter check skipped: {e})")
else:
    try:
        print(f"nsa_core adapters.status('fa2'): {adapters.status('fa2', dev)}")
        q = torch.randn(2, 777, 8, 128, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(2, 777, 2, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        for what, got, lr in (("causal", adapters.causal(q, k, v, 128 ** -0.5, "fa2"), (-1, 0)),
                              ("window 512", adapters.window(q, k, v, 512, 128 ** -0.5, "fa2"), (511, 0))):
            e = rel(got, ref_attn(q.float(), k.float(), v.float(), *lr, 128 ** -0.5))
            fails += e >= TOL[torch.bfloat16]
            print(f"{'PASS' if e < TOL[torch.bfloat16] else 'FAIL'} nsa_core adapter fa2 {what}: rel o {e:.2e}")
    except Exception as e:  # noqa: BLE001 - reported, never a crash of the whole check
        fails += 1
        print(f"FAIL nsa_core adapter fa2: {type(e).__name__}: {str(e)[:300]}")
print(f"{'ALL PASS' if not fails else f'{fails} FAILED'} ({time.perf_counter() - t0:.1f} s)")
sys.exit(1 if fails else 0)
PY
  [ -d /tmp/site/flash_attn/cute ] && cmd_link_fa4 /tmp/site
  PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 \
    python3 "$B/fa2_test.py" "$SRC/NSA_TRIM.json" 2>&1 | tee "$B/test.log"
  local rc=${PIPESTATUS[0]}
  copy_out
  return "$rc"
}

case "${1:-}" in
  start) cmd_start ;;
  status) cmd_status ;;
  wait) cmd_wait "${2:-}" ;;
  test) cmd_test ;;
  link-fa4) cmd_link_fa4 "${2:-}" ;;
  trim) [ -d "${2:-}" ] || die "trim needs an unpacked flash_attn-2.8.3 directory"; trim_tree "$2" && check_tree "$2" ;;
  check) [ -d "${2:-}" ] || die "check needs a trimmed flash_attn-2.8.3 directory"; check_tree "$2" ;;
  *) echo "usage: bash bench/gpu_fa2_build.sh start|status|wait SECONDS|test|link-fa4 [FA4_SITE]|trim DIR|check DIR" >&2; exit 2 ;;
esac
