"""Decode benchmark driver: the decode-bench stage in-process, and a kernel profile of the step.

    PYTHONPATH=. python bench/bench_decode.py stage --out DIR [--kernel triton] [--impl nsa_core,mykernel] ...
    PYTHONPATH=. python bench/bench_decode.py profile --S 65536 --B 16 [--kernel triton]
    PYTHONPATH=. python bench/bench_decode.py table RUN_DIR [RUN_DIR ...]     # the issue-14 table
    PYTHONPATH=. python bench/bench_decode.py sweep-split                     # split step geometry (CUDA)
    PYTHONPATH=. python bench/bench_decode.py sweep-tune                      # six-launch step's knobs (CUDA)
    PYTHONPATH=. python bench/bench_decode.py warm --S 65536 --B 16           # compile what decode-bench runs
    .venv/bin/python bench/bench_decode.py compile --S 65536 --B 16           # sm_90 regs/spills here, no GPU

``stage`` runs ``stages.decode_bench.DecodeBench`` exactly as ``nsa-run stage decode-bench``
would (same options, device defaults), writing into DIR. ``profile`` fills a cache directly
(random data), runs the eager static step under torch.profiler and prints the device time per
kernel (the profile of one step: which launches cost what).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cmd_stage(args, extra: list[str]) -> int:
    from nsa_runner.context import RunContext
    from stages.decode_bench import DecodeBench

    st = DecodeBench()
    opts = {o.dest: o.default for o in st.options}
    flags = {o.flag: o for o in st.options}
    it = iter(extra)
    for tok in it:
        if tok not in flags:
            raise SystemExit(f"unknown option {tok}; known: {', '.join(flags)}")
        opts[flags[tok].dest] = flags[tok].convert(next(it))
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = st.run(RunContext(out, dev, "full" if dev == "cuda" else "quick", opts, run_id=args.run_id,
                            stage="decode-bench"))
    print(f"decode-bench: {res.status.value}: {res.reason}")
    print((out / "decode_bench.txt").read_text())
    return 0 if not res.status.failed else 1


def cmd_profile(args) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nsa_core import NSAAttention, NSAConfig

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    m = NSAAttention(args.dim, args.G * args.h, args.G, args.dk, args.dv, NSAConfig()).cuda().to(dt).eval()
    cache = m.new_cache(args.B, args.S)
    cache.fill_random_(args.S - 1, generator=torch.Generator("cuda").manual_seed(0))
    dec = m.decoder(cache, impl=args.kernel)
    dec.x.normal_()
    dec.pos.fill_(args.S - 1)
    for _ in range(3):
        dec.run_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            dec.run_step()
        torch.cuda.synchronize()
    print(f"# profile: S={args.S} B={args.B} kernel={args.kernel} dtype={args.dtype} G={args.G} h={args.h} "
          f"dk={args.dk} dv={args.dv} dim={args.dim}, {args.steps} eager steps (no graph), device time per kernel")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=60))
    from nsa_core.decode.labels import label_of
    from nsa_runner.measure import timing

    replay = timing.graph_replays({"step": dec.run_step})[0]["step"]
    part = timing.profile_partition(replay, label_of, device="cuda", passes=args.steps)
    print(f"# one CUDA-graph replay of the step partitioned ({part.method}, {part.passes} passes, L2 flushed): "
          f"{part.total * 1e3:.1f} us")
    for k, v in sorted(part.parts.items(), key=lambda kv: -kv[1]):
        print(f"  {k:>10} {v * 1e3:8.1f} us {100 * v / part.total:6.1f} %")
    for (lab, name), v in sorted(part.items.items(), key=lambda kv: -kv[1]):
        print(f"  {lab:>10} {v * 1e3:8.1f} us  {name[:90]}")
    return 0


def cmd_sweep(args) -> int:
    """Median graph-replay time of the attention part (append + branches) per split-K chunk size and
    num_warps of the compressed pass; and of the split-K full-attention baseline per chunk size."""
    import torch

    from nsa_core import NSAAttention, NSAConfig
    from nsa_runner.measure import timing
    from nsa_runner.measure.decode_baselines import FullDecode

    def bench(fn):
        replay = timing.graph_replays({"f": fn})[0]["f"]
        return timing.bench(replay, device="cuda", warmup=10, iters=args.iters, flush_l2=False).ms * 1e3

    print(f"# sweep: CUDA graph replays (nsa_runner.measure.timing), median of {args.iters}, L2 not flushed "
          "(same buffers every replay)")
    print(f"{'what':>10} {'S':>6} {'B':>3} {'chunk':>10} {'NCH':>4} {'BT':>3} {'warps':>5} {'us':>8}")
    for S in args.S:
        for B in args.B:
            torch.manual_seed(0)
            m = NSAAttention(2048, 64, 4, 192, 128, NSAConfig()).cuda().to(torch.bfloat16).eval()
            cache = m.new_cache(B, S)
            cache.fill_random_(S - 1, generator=torch.Generator("cuda").manual_seed(0))
            for warps in args.warps:
                for chunk in [None, *args.chunks]:
                    dec = m.decoder(cache, impl="triton", chunk=chunk, warps={"cmp": warps})
                    dec.x.normal_()
                    dec.pos.fill_(S - 1)
                    proj = dec.project(dec.x)
                    us = bench(lambda dec=dec, proj=proj: dec.attn(*proj))
                    w = dec._tri
                    name = ("auto:" + str(w.CH)) if chunk is None else str(chunk)
                    print(f"{'nsa-attn':>10} {S:>6} {B:>3} {name:>10} {w.NCH:>4} {w.BT:>3} {warps:>5} {us:8.1f}",
                          flush=True)
            for chunk in [None, *args.full_chunks]:
                fd = FullDecode(proj[0], cache.K_sel, cache.V_sel, dec.pos, dec.scale, chunk=chunk)
                us = bench(fd)
                name = ("auto:" + str(fd.CH)) if chunk is None else str(chunk)
                print(f"{'full-tri':>10} {S:>6} {B:>3} {name:>10} {fd.NCH:>4} {fd.BT:>3} {4:>5} {us:8.1f}", flush=True)
    return 0


def _paper_point(S: int, B: int):
    """(module, cache filled at random to S - 1 tokens, x) at the paper shapes, bf16 on CUDA (the sweeps)."""
    import torch

    from nsa_core import NSAAttention, NSAConfig

    torch.manual_seed(0)
    m = NSAAttention(2048, 64, 4, 192, 128, NSAConfig()).cuda().to(torch.bfloat16).eval()
    cache = m.new_cache(B, S)
    cache.fill_random_(S - 1, generator=torch.Generator("cuda").manual_seed(0))
    return m, cache, torch.randn(B, 1, 2048, device="cuda", dtype=torch.bfloat16)


def _replay_us(fn, iters: int) -> float:
    """Median CUDA-graph replay time of fn in µs, L2 flushed before each."""
    from nsa_runner.measure import timing

    replay = timing.graph_replays({"f": fn})[0]["f"]
    return timing.bench(replay, device="cuda", warmup=10, iters=iters, flush_l2=True).ms * 1e3


def cmd_sweep_split(args) -> int:
    """Split step (impl="split") geometry sweep, one factor at a time from the default: the attention
    part (append + branches + gates) as a CUDA-graph replay, L2 flushed before each, median; the
    6-launch step ("triton") and the split-K full attention of the same context for reference.
    Every configuration's output is checked against the default configuration's (same selection)."""
    import torch

    from nsa_core.decode import kernels as K
    from nsa_runner.measure.decode_baselines import FullDecode

    def bench(fn):
        return _replay_us(fn, args.iters)

    print(f"# sweep-split: CUDA graph replays of the attention part, L2 flushed, median of {args.iters}")
    print(f"{'S':>6} {'B':>3} {'config':>26} {'NCH':>4} {'CH':>5} {'NW':>3} {'NSP':>3} {'SPB':>3} {'us':>8}  check")
    base_consts = {k: getattr(K, k) for k in ("SPLIT_PROGRAMS_PER_SM", "SPLIT_SEL_PROGRAMS_PER_SM", "SPLIT_MAX_WIN")}
    for S in args.S:
        for B in args.B:
            m, cache, x = _paper_point(S, B)
            ref = None
            configs = [("default", {}, None, {})]
            chunks = args.chunks_b1 if B == 1 else args.chunks
            configs += [(f"chunk={c}", {}, c, {}) for c in chunks]
            if B == args.B[-1] or S == args.S[0]:
                configs += [("cmp warps=8", {}, None, {"split_cmp": 8}),
                            ("stages=3", {}, None, {"split_stages": 3}),
                            ("stages=1", {}, None, {"split_stages": 1}),
                            ("sel warps=8", {}, None, {"split_sel": 8}),
                            ("sel pps=1", {"SPLIT_SEL_PROGRAMS_PER_SM": 1}, None, {}),
                            ("sel pps=4", {"SPLIT_SEL_PROGRAMS_PER_SM": 4}, None, {}),
                            ("pps=8", {"SPLIT_PROGRAMS_PER_SM": 8}, None, {}),
                            ("maxwin=1", {"SPLIT_MAX_WIN": 1}, None, {})]
            for name, consts, chunk, warps in configs:
                for k, v in {**base_consts, **consts}.items():
                    setattr(K, k, v)
                try:
                    dec = m.decoder(cache, impl="split", chunk=chunk, warps=warps)
                    dec.x.copy_(x)
                    dec.pos.fill_(S - 1)
                    proj = dec.project(dec.x)
                    out = dec.attn(*proj).clone()
                    if ref is None:
                        ref = out
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    us = bench(lambda dec=dec, proj=proj: dec.attn(*proj))
                    g = dec._tri.split_geometry()
                    print(f"{S:>6} {B:>3} {name:>26} {g['NCH']:>4} {g['CH']:>5} {g['NW']:>3} {g['NSP']:>3} "
                          f"{g['SPB']:>3} {us:8.1f}  rel {err:.1e}", flush=True)
                except Exception as e:  # noqa: BLE001 - one configuration failing must not end the sweep
                    print(f"{S:>6} {B:>3} {name:>26} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                finally:
                    for k, v in base_consts.items():
                        setattr(K, k, v)
            six = m.decoder(cache, impl="triton")
            six.x.copy_(x)
            six.pos.fill_(S - 1)
            proj = six.project(six.x)
            us = bench(lambda six=six, proj=proj: six.attn(*proj))
            print(f"{S:>6} {B:>3} {'triton (6 launches)':>26} {'':>4} {'':>5} {'':>3} {'':>3} {'':>3} {us:8.1f}",
                  flush=True)
            fd = FullDecode(proj[0], cache.K_sel, cache.V_sel, six.pos, six.scale)
            print(f"{S:>6} {B:>3} {'full split-K (Triton)':>26} {'':>4} {'':>5} {'':>3} {'':>3} {'':>3} "
                  f"{bench(fd):8.1f}", flush=True)
            del m, cache
            torch.cuda.empty_cache()
    return 0


def cmd_sweep_tune(args) -> int:
    """The six-launch step's knobs (Workspace.TUNE, CONFIG), one at a time from the default: the attention
    part as a CUDA-graph replay, L2 flushed before each, median, in ``--rounds`` round-robin rounds (the
    configurations interleaved, so drift hits them alike); the split-K full attention (with and without
    PDL) of the same context. Every configuration's output is checked against the default's."""
    import torch

    from nsa_runner.measure.decode_baselines import FullDecode

    def bench(fn):
        return _replay_us(fn, args.iters)

    configs = [("default", {}, {}),
               ("selection logits", {"selection": "logits"}, {}),
               ("selection blocks", {"selection": "blocks"}, {}),
               ("selection blocks-row", {"selection": "blocks-row"}, {}),
               ("tiles merged", {"tiles": "merged"}, {}),
               ("6 launches, no PDL", {"fuse_append": False, "pdl": False}, {}),
               ("no PDL", {"pdl": False}, {}),
               ("late loads", {"early_loads": False}, {}),
               ("early loads everywhere", {"early_loads": True}, {}),
               ("one-wave warps off", {}, {"combine": 4, "selwin": 4}),
               ("programs/SM 2, no min chunk", {"programs_per_sm": 2, "min_chunk": 0}, {})]
    configs += [(f"{what} warps {n}", {}, {key: n}) for what, key, ns in (
        ("cmp", "cmp", (2, 8)), ("scores", "probs", (2,)), ("top-n", "select", (1, 2)),
        ("tiles", "selwin", (2, 8)), ("combine", "combine", (2, 8)))
        for n in ns]
    print(f"# sweep-tune: CUDA graph replays of the attention part, L2 flushed, median of {args.iters}, "
          f"{args.rounds} rounds round-robin")
    for S in args.S:
        for B in args.B:
            m, cache, x = _paper_point(S, B)
            runs, ref = [], None
            for name, tune, warps in configs:
                try:
                    dec = m.decoder(cache, impl="triton", tune=tune, warps=warps)
                    dec.x.copy_(x)
                    dec.pos.fill_(S - 1)
                    proj = dec.project(dec.x)
                    out = dec.attn(*proj).clone()
                    ref = out if ref is None else ref
                    err = float((out.float() - ref.float()).norm() / ref.float().norm())
                    runs.append((name, lambda dec=dec, proj=proj: dec.attn(*proj), err, dec._tri))
                except Exception as e:  # noqa: BLE001 - one configuration failing must not end the sweep
                    print(f"{S:>6} {B:>3} {name:>28} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            q = proj[0]
            for pdl in (False, True):
                runs.append((f"full split-K, PDL {'on' if pdl else 'off'}",
                             FullDecode(q, cache.K_sel, cache.V_sel, dec.pos, dec.scale, pdl=pdl), float("nan"), None))
            times = {name: [] for name, *_ in runs}
            for _ in range(args.rounds):
                for name, fn, _err, _w in runs:
                    times[name].append(bench(fn))
            for name, _fn, err, w in runs:
                geo = f"NCH {w.NCH:>3} CH {w.CH:>5}" if w is not None else " " * 16
                ts = " ".join(f"{t:7.1f}" for t in times[name])
                print(f"{S:>6} {B:>3} {name:>28} {geo}  us: {ts}  min {min(times[name]):7.1f}  rel {err:.1e}",
                      flush=True)
            del m, cache, runs
            torch.cuda.empty_cache()
    return 0


def cmd_warm(args) -> int:
    """Compile (populate Triton's on-disk cache with) the kernels decode-bench launches at these points, as
    decode-bench builds them (same module dims, dtype, cache capacity = S): one eager step per kernel on
    a zero cache plus the split-K full-attention baseline. Run beside other work on a cold machine, in a
    few processes, so the timed stage finds its kernels compiled. Nothing here is a measurement."""
    import time

    import torch

    from nsa_core import NSAAttention, NSAConfig
    from nsa_runner.measure.decode_baselines import FullDecode

    t0 = time.perf_counter()
    for S in args.S:
        for B in args.B:
            m = NSAAttention(2048, 64, 4, 192, 128, NSAConfig()).to(device="cuda", dtype=torch.bfloat16).eval()
            cache = m.new_cache(B, S, page_size=args.page_size or None)
            for k in args.kernels:
                dec = m.decoder(cache, impl=k)
                dec.pos.fill_(S - 1)
                dec.run_step()
            q = dec.project(dec.x)[0]
            kf, vf = ((cache.K_sel, cache.V_sel) if not cache.paged else
                      tuple(t.contiguous() for t in cache.sel_dense(S)))
            FullDecode(q, kf, vf, dec.pos, dec.scale)()
            torch.cuda.synchronize()
            print(f"warm S={S} B={B} {','.join(args.kernels)}: {time.perf_counter() - t0:.1f} s", flush=True)
            del m, cache, dec
            torch.cuda.empty_cache()
    return 0


def _capture_decode_launches(args) -> None:
    """Child (TRITON_INTERPRET=1): record the Triton launches of one attention part of each kernel at the
    given shape on ``--sms`` SMs, without running them -> one JSON line on stdout."""
    import json

    import torch
    from triton.runtime import interpreter

    from nsa_core import NSAAttention, NSAConfig
    from nsa_core.decode import kernels as K

    K._num_sms = lambda device: args.sms  # the geometry of the GPU, not of this CPU
    launches: list[dict] = []
    current = {"kernel": ""}

    def record(self, *a, grid, warmup, **kw):
        opts = {k: kw.pop(k) for k in ("num_warps", "num_stages", "num_ctas") if k in kw}
        vals = {}
        for name, v in list(zip(self.arg_names, a, strict=False)) + list(kw.items()):
            if isinstance(v, torch.Tensor):
                vals[name] = ["tensor", str(v.dtype).replace("torch.", "")]
            elif isinstance(v, bool) or v is None or isinstance(v, (int, float, str)):
                vals[name] = ["value", v]
            else:
                vals[name] = ["value", str(v)]
        launches.append({"case": current["kernel"], "module": self.fn.__module__, "name": self.fn.__name__,
                         "args": vals, "opts": opts, "grid": [int(g) for g in grid]})

    interpreter.InterpretedFunction.run = record
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    m = NSAAttention(args.dim, args.G * args.h, args.G, args.dk, args.dv, NSAConfig()).to(dt).eval()
    cache = m.new_cache(args.B, args.S)
    for k in args.kernels:
        current["kernel"] = k
        dec = m.decoder(cache, impl=k)
        dec.pos.fill_(args.S - 1)
        dec.attn(*dec.project(dec.x))
    print(json.dumps(launches))


def _cubin_resources(cubin: bytes) -> str:
    """'REG n STACK n LOCAL n' of a cubin from cuobjdump --dump-resource-usage (triton's bundled one)."""
    import re
    import shutil
    import subprocess
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    tool = str(tool) if tool.exists() else shutil.which("cuobjdump")
    if not tool:
        return "(no cuobjdump)"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    return (f"regs {m.group(1):>4} stack {m.group(2):>4} local {m.group(4):>4}" if m else out.strip()[-120:])


def cmd_compile(args) -> int:
    """Compile the decode step's Triton kernels for sm_90 on this machine (no GPU: triton's bundled ptxas)
    at the paper's decode shapes and print each kernel's registers per thread, spills, shared memory
    and grid: what costs no device time (METHOD.md). Launches are recorded in the interpreter, not run."""
    import json
    import os
    import subprocess
    import tempfile
    import time

    if args.capture_only:
        _capture_decode_launches(args)
        return 0
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    cmd = [sys.executable, __file__, "compile", "--capture-only", "--S", str(args.S), "--B", str(args.B),
           "--sms", str(args.sms), "--dtype", args.dtype, "--kernels", *args.kernels]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode:
        print(out.stderr[-3000:])
        return 2
    launches = json.loads(out.stdout.strip().splitlines()[-1])
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="triton-decode-"))
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    dts = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "int32": "i32", "int64": "i64"}
    print(f"# sm_90 compile (triton {triton.__version__} here; the H100 image has its own), S={args.S} B={args.B} "
          f"SMs={args.sms} {args.dtype}: regs/thread, spill bytes, shared bytes, grid")
    for rec in launches:
        fn = getattr(importlib.import_module(rec["module"]), rec["name"])
        sig, consts = {}, {}
        for p in fn.params:
            kind, val = rec["args"].get(p.name, ["value", p.default if p.has_default else None])
            if p.is_constexpr:
                sig[p.name], consts[p.name] = "constexpr", val
            elif kind == "tensor":
                sig[p.name] = "*" + dts[val]
            elif isinstance(val, bool):
                sig[p.name] = "i1"
            elif isinstance(val, int):
                sig[p.name] = "i32" if -2**31 <= val < 2**31 else "i64"
            elif isinstance(val, float):
                sig[p.name] = "fp32"
            else:
                sig[p.name], consts[p.name] = "constexpr", None
        t0 = time.perf_counter()
        try:
            ck = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                                options=dict(rec["opts"]))
            md = ck.metadata
            res = _cubin_resources(ck.asm["cubin"])
            print(f"{rec['case']:>7} {rec['name']:<24} {res} shared {md.shared:>7} warps {md.num_warps} stages "
                  f"{md.num_stages} grid {rec['grid']} ({time.perf_counter() - t0:.0f} s)", flush=True)
            if args.asm_dir:
                Path(args.asm_dir).mkdir(parents=True, exist_ok=True)
                (Path(args.asm_dir) / f"{rec['case']}_{rec['name']}.ptx").write_text(ck.asm["ptx"])
        except Exception as e:  # noqa: BLE001
            print(f"{rec['case']:>7} {rec['name']:<24} compile FAILED: {type(e).__name__}: {str(e)[:300]}")
    return 0


# issue 14's targets (H100, ratios within one run): (S, B, column, minimum)
TARGETS = [(65536, 16, "speedup", 8.0), (8192, 1, "speedup", 1.2), (65536, 1, "speedup", 4.0),
           (65536, 16, "GB/s", 2200.0)]


def cmd_table(args) -> int:
    """The issue-14 table from decode-bench outputs (decode.csv, found below each folder given):
    S, B, NSA attn, full attn, speedup, effective bandwidth, the shares of the step (one profiled
    pass partitioned, sum = 100%), and the targets met or not, per implementation."""
    import pandas as pd

    frames = []
    for d in args.dirs:
        for f in sorted(Path(d).rglob("decode.csv")):
            df = pd.read_csv(f)
            if "kernel" in df.columns:  # since issue 15: impl = the implementation, kernel = nsa_core's kernel
                df = df[df.status.isin(["PASS", "FAIL"])] if "status" in df.columns else df
                df["impl"] = df.impl.where(df.impl != "nsa_core", df.kernel)
            df["source"] = str(f.parent)
            frames.append(df)
    if not frames:
        print(f"no decode.csv below {args.dirs}")
        return 1
    df = pd.concat(frames, ignore_index=True)
    print("| impl | S | B | NSA attn µs | full attn µs (backend) | speedup | NSA eff. BW GB/s | full GB/s | "
          "step µs | shares cmp / sel / win / shared / other / remainder = sum (%) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for _, r in df.sort_values(["impl", "B", "S"]).iterrows():
        parts = ("cmp", "sel", "win", "shared", "other", "remainder")
        shares = " / ".join(f"{r[f'share_{k}']:.1f}" for k in parts)
        print(f"| {r.impl} | {r.S} | {r.B} | {r.ms_attn * 1e3:.1f} | {r.ms_full * 1e3:.1f} "
              f"({r.full_backend}) | {r.speedup:.2f}x | {r['GB/s']:.0f} | {r['GB/s_full']:.0f} | "
              f"{r.ms_step * 1e3:.1f} | "
              f"{shares} = {r.share_sum:.1f} |")
    print()
    for impl, g in df.groupby("impl"):
        for S, B, col, want in TARGETS:
            row = g[(g.S == S) & (g.B == B)]
            if row.empty:
                print(f"{impl}: S={S} B={B} {col} >= {want}: not measured")
                continue
            got = float(row[col].iloc[0])
            print(f"{impl}: S={S} B={B} {col} >= {want}: {got:.2f} -> {'MET' if got >= want else 'not met'}")
        crossing = g[(g.B == 1) & (g.speedup > 1.0)].S.min()
        print(f"{impl}: B=1, NSA attn faster than full attention from S = {crossing} on "
              f"(of {sorted(g[g.B == 1].S.tolist())})")
    _pivot(df)
    return 0


def _pivot(df) -> None:
    """The issue-14 table, one line per (S, B): NSA attn per kernel, the fastest full attention (one per
    run: the kernels of one decode-bench run share it), speedup and effective bandwidth per kernel."""
    ks = list(dict.fromkeys(df.sort_values("impl").impl))
    print()
    print("## issue 14: S, B, NSA attn per kernel, fastest full attention, speedup, effective BW (same run)")
    print()
    print("| S | B | " + " | ".join(f"{k} attn µs" for k in ks) + " | full attn µs (backend) | "
          + " | ".join(f"{k} speedup" for k in ks) + " | " + " | ".join(f"{k} GB/s" for k in ks) + " |")
    print("|---|---|" + "---|" * (3 * len(ks) + 1))
    for (S, B), g in df.groupby(["S", "B"]):
        by = {r.impl: r for _, r in g.iterrows()}
        full = min(g.itertuples(), key=lambda r: r.ms_full)

        def cell(k, f, by=by):
            return f(by[k]) if k in by else "-"
        print(f"| {S} | {B} | " + " | ".join(cell(k, lambda r: f"{r.ms_attn * 1e3:.1f}") for k in ks)
              + f" | {full.ms_full * 1e3:.1f} ({full.full_backend}) | "
              + " | ".join(cell(k, lambda r: f"{r.speedup:.2f}x") for k in ks) + " | "
              + " | ".join(cell(k, lambda r: f"{r['GB/s']:.0f}") for k in ks) + " |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage", help="run the decode-bench stage in-process (other options go to the stage)")
    s.add_argument("--out", required=True)
    s.add_argument("--run-id", default="bench")
    p = sub.add_parser("profile", help="torch.profiler kernel table of the eager static step (CUDA)")
    p.add_argument("--S", type=int, default=65536)
    p.add_argument("--B", type=int, default=16)
    p.add_argument("--kernel", default="triton", choices=("torch", "triton", "fused", "split"))
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    p.add_argument("--G", type=int, default=4)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--dk", type=int, default=192)
    p.add_argument("--dv", type=int, default=128)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--steps", type=int, default=5)
    w = sub.add_parser("sweep", help="attn-part time per split-K chunk size (CUDA, triton impl)")
    w.add_argument("--S", type=int, nargs="+", default=[16384, 65536])
    w.add_argument("--B", type=int, nargs="+", default=[1, 16])
    w.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    w.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    w.add_argument("--full-chunks", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    w.add_argument("--iters", type=int, default=100)
    ws = sub.add_parser("sweep-split", help="split step geometry, one factor at a time (CUDA)")
    ws.add_argument("--S", type=int, nargs="+", default=[65536, 8192])
    ws.add_argument("--B", type=int, nargs="+", default=[1, 16])
    ws.add_argument("--chunks", type=int, nargs="+", default=[256, 1024, 2048])
    ws.add_argument("--chunks-b1", type=int, nargs="+", default=[128, 256, 512])
    ws.add_argument("--iters", type=int, default=50)
    wt = sub.add_parser("sweep-tune", help="the six-launch step's knobs (PDL, fused append, split-K, warps) (CUDA)")
    wt.add_argument("--S", type=int, nargs="+", default=[8192, 65536])
    wt.add_argument("--B", type=int, nargs="+", default=[1, 16])
    wt.add_argument("--iters", type=int, default=50)
    wt.add_argument("--rounds", type=int, default=2)
    wm = sub.add_parser("warm", help="compile the kernels decode-bench will launch (Triton cache), CUDA")
    wm.add_argument("--S", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    wm.add_argument("--B", type=int, nargs="+", default=[1, 16])
    wm.add_argument("--kernels", nargs="+", default=["split", "triton"])
    wm.add_argument("--page-size", type=int, default=0)
    c = sub.add_parser("compile", help="compile the step's kernels for sm_90 here: regs, spills, shared memory")
    c.add_argument("--S", type=int, default=65536)
    c.add_argument("--B", type=int, default=16)
    c.add_argument("--sms", type=int, default=132)
    c.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    c.add_argument("--kernels", nargs="+", default=["split", "triton"])
    c.add_argument("--G", type=int, default=4)
    c.add_argument("--h", type=int, default=16)
    c.add_argument("--dk", type=int, default=192)
    c.add_argument("--dv", type=int, default=128)
    c.add_argument("--dim", type=int, default=2048)
    c.add_argument("--asm-dir", default="")
    c.add_argument("--capture-only", action="store_true", help=argparse.SUPPRESS)
    t = sub.add_parser("table", help="the issue-14 table from decode-bench outputs (decode.csv below DIRS)")
    t.add_argument("dirs", nargs="+")
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "table":
        return cmd_table(args)
    if args.cmd == "sweep":
        return cmd_sweep(args)
    if args.cmd == "warm":
        return cmd_warm(args)
    if args.cmd == "compile":
        return cmd_compile(args)
    if args.cmd == "sweep-split":
        return cmd_sweep_split(args)
    if args.cmd == "sweep-tune":
        return cmd_sweep_tune(args)
    if args.cmd == "stage":
        return cmd_stage(args, extra)
    if extra:
        ap.error(f"unknown arguments {extra}")
    return cmd_profile(args)


if __name__ == "__main__":
    raise SystemExit(main())
