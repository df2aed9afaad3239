"""Stage ``decode-bench``: NSA decode step latency, per branch and total, vs full-attention decode;
read counters vs the formula (DESIGN §4, §5).

For each cached length S and batch B: an NSA layer (``NSAAttention``) gets a context of S-1
tokens (``--fill``: a real prefill through the module, or a direct fill of every cache with
random data for long S — the output says which), then the step that decodes token S-1 (cached
length S during the step) is measured with the static decoder (``nsa_core.decode.static``;
``--kernel``: torch, triton = 5 launches with PDL on sm_90+ (six with phi mlp), fused = the attention part in 2
launches, split = 2 launches
with split-K in both sized from the SM count; a comma list (``--kernel split,triton``) measures each
kernel as its own row with the same layer, context, float64 reference and full-attention baselines, all
timed round-robin in one set of replays; ``--page-size``: the raw KV cache in pages behind a block table):

  step    the whole layer step: projections + RoPE + gate MLP, cache append (+ compression),
          the three branches, gated combine, output projection
  attn    the attention part: cache append + three branches + gated combine (no projections)
  full    full-attention decode over the same S cached tokens, same dtype: the fastest of every
          torch SDPA backend that runs (the h heads of a group as h query rows against the group's
          keys = GQA) and, on CUDA with Triton, a flash-decoding split-K kernel built from the decode
          kernels (SDPA does not split the keys of one decode query over SMs, so at B=1 it leaves
          most of the GPU idle), and flash-attn 4 (``flash_attn.cute``) where it is installed. Each
          candidate is checked against float64 math; all are logged.

Shares of the step add up to 100% by construction: ONE method partitions the timed step
(``nsa_runner.measure.timing.profile_partition`` over ``--profile-passes`` profiled passes of the
same function that is timed, the CUDA-graph replay on CUDA): on CUDA every kernel the pass ran
is assigned to exactly one part by its name, on CPU every op by its ``nsa::`` scope
(``nsa_core.decode.labels``), and what no kernel covers is printed as its own row:

  cmp / sel / win   work of that branch only (cmp includes the compressed logits that the
                    selection scores reuse; sel = scores, top-n and, on the torch path, the
                    selected attention)
  shared            attention work of several branches (append, sel+win tile kernel, gated
                    combine, fused kernels)
  other             projections, RoPE, gate MLP, output projection (kernels outside any label)
  remainder         CUDA: idle time between the kernels of the pass (launch latency, serial
                    dependencies); CPU: time outside any op or scope

speedup = full / attn (attention vs attention: the paper's Table 4 comparison); speedup_step =
full / step also charges NSA its projections.

Timing is ``nsa_runner.measure.timing``: on CUDA every function is captured in a CUDA graph
(``graph_replays``); the replays are timed round-robin (``bench_round_robin``) with CUDA events,
L2 flushed before each (a 256 MB write outside the timed region), median over ``--iters``
replays after ``--warmup``. On CPU: perf_counter medians (the quick profile is small S and
small dims; its counters are real, its timings are CPU timings).

Checks (FAIL): read counters of the measured step (from the blocks it actually selected)
equal the formula (``nsa_core.decode.cache.formula_reads``) for every (b, group), also for the float64
reference's own selection; the step output matches the float64 eager reference fed the step's
selection (DESIGN §7 tolerance of the dtype); the SDPA baseline matches float64 math; every
output is finite. Timings are reported, never asserted.

Implementations under test (``--impl a,b``, DESIGN §5; default ``nsa_core``, what oneshot's ``--impl``
hands over): ``nsa_core`` is measured as above. Any other implementation runs through its
``decode_step`` part (contract: ``nsa_runner.impls.DECODE_STEP``) in the same layer (same seed,
weights, context): :func:`measure_impl` checks k = d steps against the float64 prefill reference at
each position (same selection), its selection against the reference's (DESIGN §7 near-ties), its
read counters against the formula, and times its step at t = S-1 (``ms_attn``) against the same
full-attention baselines. One that provides no decode_step (fla), or whose constraints exclude the
point, is SKIP naming the reason; a broken adapter or a step that raises is ERROR and fails the
stage (both listed under "not run" in decode_bench.txt and decode_summary.txt, and in the stage's
reason). decode.csv: one row per measured (S, B, impl); ``impl`` names the implementation,
``kernel`` nsa_core's step kernel (``decode_step`` for another's), ``status`` (PASS / FAIL) and ``note``.
"""

from __future__ import annotations

import copy
import traceback

from nsa_runner._figures import drawing
from nsa_runner.artifacts import now_iso, write_csv, write_text
from nsa_runner.impls import BUILTIN, ImplError
from nsa_runner.stage import Option, Stage, StageResult, Status, int_list, nonneg_int, positive_int

from . import _parity
from . import _seed as seeds

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DEFAULTS = {
    # CUDA: 50 timed graph replays after 10 (two full runs' medians agreed within ~2% with 100 after 20,
    # docs/benchmarks.md "Full oneshot ... compare"), 5 profiled passes for the shares: decode-bench's wall time
    "cuda": dict(S_list=[4096, 8192, 16384, 32768, 65536], batch_list=[1, 16], iters=50, warmup=10, profile_passes=5,
                 dtype="bf16", groups=4, heads_per_group=16, dk=192, dv=128, dim=2048,
                 nsa="l=32,d=16,l_sel=64,n_sel=16,w=512"),
    "cpu": dict(S_list=[256, 1024], batch_list=[1, 2], iters=15, warmup=2, profile_passes=3, dtype="fp32",
                groups=2, heads_per_group=2, dk=32, dv=16, dim=64, nsa="l=16,d=8,l_sel=32,n_sel=8,w=128"),
}
# --profile quick on CUDA (the GPU smoke check, issue 13): the paper's shape at the two ends of the
# S range only, fewer replays (its full run measured all 10 points, 33 s, under quick on the H100)
QUICK_CUDA = dict(S_list=[4096, 65536], iters=20, warmup=5, profile_passes=2)
KERNELS = ("torch", "triton", "fused", "split")  # nsa_core.decode.static.IMPLS
# --kernel auto on CUDA: the 6-launch step, the one measured on the H100 (the split step is not measured
# yet: bench/gpu_decode14.sh times both in one run; make it "split" once it wins there)
AUTO_KERNEL = "triton"
# the eager (no graph) step is timed for the ms_step_eager column only: few steps (each ~1 ms)
EAGER_ITERS = {"cuda": 20, "cpu": 1}
EAGER_WARMUP = {"cuda": 3, "cpu": 0}
PREFILL_MAX_S = 2048  # --fill auto: a real prefill up to this S, a direct random fill above
# the parts of the step's partition (nsa_runner.measure.timing.profile_partition): the three branches,
# attention work shared by several (append, combine, fused kernels), everything else (projections,
# RoPE, gate MLP, output projection) and the remainder (GPU idle between kernels; CPU time outside ops)
SHARE_PARTS = ("cmp", "sel", "win", "shared", "other", "remainder")
COLUMNS = ["S", "B", "impl", "kernel", "fill", "ms_step", "ms_attn", *[f"ms_{k}" for k in SHARE_PARTS], "ms_full",
           "ms_full_sdpa", "ms_full_triton", "ms_full_fa4", "speedup", "speedup_step",
           *[f"share_{k}" for k in SHARE_PARTS],
           "share_sum", "ms_step_eager", "reads_cmp", "reads_sel", "reads_win", "reads_total",
           "reads_bound", "reads_full", "read_ratio", "GB/s", "GB/s_full", "full_backend", "parity_rel_err",
           "parity_tol", "sel_agree", "full_rel_err",
           # the spread (20th / 80th percentile) of the main timings, so `nsa-run compare` can tell noise
           "ms_step_p20", "ms_step_p80", "ms_attn_p20", "ms_attn_p80", "ms_full_p20", "ms_full_p80",
           "ms_step_eager_p20", "ms_step_eager_p80",
           # the partition: ms of one profiled pass of the step (the shares' 100%) and its method
           "ms_profiled", "share_method",
           # PASS / FAIL: the point's checks (a point an implementation did not run, SKIP or ERROR, is
           # listed in decode_bench.txt and decode_summary.txt, not here); note: what the row measured
           "status", "note"]


def _metric_key(r: dict, names: list, kernels: list) -> str:
    """metrics["speedup_largest_S"] key of a row: "B" (one implementation, one kernel), else qualified."""
    if names == [BUILTIN]:
        return str(r["B"]) if len(kernels) == 1 else f"{r['kernel']}:B={r['B']}"
    return f"{r['impl']}:B={r['B']}" if r["impl"] != BUILTIN or len(kernels) == 1 else f"{r['kernel']}:B={r['B']}"


def _kernel_list(text: str) -> str:
    """--kernel: auto, one kernel or a comma list of them (validated; returned as given, stripped)."""
    ks = [k.strip() for k in str(text).split(",") if k.strip()]
    bad = [k for k in ks if k not in ("auto", *KERNELS)]
    if not ks or bad:
        raise ValueError(f"--kernel: {text!r} is not one of auto, {', '.join(KERNELS)} (or a comma list of them)")
    return ",".join(ks)


def parse_nsa(text: str) -> dict:
    """'l=32,d=16,l_sel=64,n_sel=16,w=512' -> dict (validated by NSAConfig)."""
    from nsa_core import NSAConfig

    out = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, eq, val = part.partition("=")
        key = key.strip()
        if not eq or key not in ("l", "d", "l_sel", "n_sel", "w", "phi"):
            raise ValueError(f"--nsa: expected key=value with keys l, d, l_sel, n_sel, w, phi; got {part!r}")
        out[key] = val.strip() if key == "phi" else int(val)
    NSAConfig(**out)  # raises ValueError naming the problem
    return out


# ---- measuring -------------------------------------------------------------------------------

def _sorted_selection(blk):
    """blk [B, G, n] (-1 = unused, any order) -> block_idx [B, 1, G, n] int32 ascending, -1 padded; count."""
    import torch

    big = torch.iinfo(torch.int64).max
    s = torch.sort(torch.where(blk >= 0, blk, torch.full_like(blk, big)), dim=-1).values
    s = torch.where(s == big, torch.full_like(s, -1), s)
    return s[:, None].to(torch.int32).contiguous(), (blk >= 0).sum(-1)[:, None].to(torch.int32)


def _spread_cols(timings: dict, names: dict[str, str]) -> dict[str, float]:
    """{"ms_step_p20": .., "ms_step_p80": ..} for each column -> timed name (NaN when not timed)."""
    out = {}
    for col, name in names.items():
        t = timings.get(name)
        out[f"{col}_p20"], out[f"{col}_p80"] = (t.p20, t.p80) if t is not None else (float("nan"), float("nan"))
    return out


def _first_line(e: BaseException, limit: int) -> str:
    """The first line of an exception's message, at most ``limit`` characters; "" for an empty or blank one
    (``str(e).strip().splitlines()[0]`` raised IndexError inside the handler that words it: round 19 B U-3)."""
    return (str(e).strip().splitlines() or [""])[0][:limit]


def _sdpa_backends(device: str):
    """[(name, context factory)]: each SDPA backend alone on CUDA; the default dispatch on CPU."""
    import contextlib

    if device != "cuda":
        return [("default", contextlib.nullcontext)]
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        b = getattr(SDPBackend, name, None)
        if b is not None:
            out.append((name.lower(), lambda b=b: sdpa_kernel([b])))
    return out


def _full_baselines(qf, kf, vf, scale, device, dtype, tag, outs, fns, problems, full_decode):
    """Full-attention decode over the same S keys: every SDPA backend that runs (and, on CUDA with
    Triton, ``full_decode()``: the flash-decoding split-K kernel), each checked against float64 math
    and added to ``fns`` as ``full:<name>``. -> (tried: one line per backend, {name: comparison})."""
    import torch

    from nsa_core.testing import compare

    ref_full = torch.softmax((qf.double() @ kf.double().transpose(-1, -2)) * scale, -1) @ vf.double()
    tried, full_err = [], {}
    for name, ctxf in _sdpa_backends(device):
        def full(ctxf=ctxf, name=name):
            with ctxf():
                outs[f"full:{name}"] = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, scale=scale)
        try:
            full()
        except RuntimeError as e:  # backend not available for these shapes / dtype
            tried.append(f"{name}: unavailable ({_first_line(e, 80)})")
            continue
        c = compare(outs[f"full:{name}"], ref_full, dtype)
        full_err[name] = c
        if not c.ok:
            problems.append(f"{tag}: SDPA {name} vs float64 math: {c}")
        fns[f"full:{name}"] = full
    fa4 = _fa4_full(qf, kf, vf, scale, device)  # flash-attn 4 (flash_attn.cute), where installed
    if isinstance(fa4, str):
        tried.append(f"fa4: {fa4}")
    else:
        def full_fa4(fn=fa4):
            outs["full:fa4"] = fn()
        try:
            full_fa4()
        except Exception as e:  # noqa: BLE001 - a JIT / shape refusal of the package: the others still run
            tried.append(f"fa4: failed ({type(e).__name__}: {_first_line(e, 80)})")
        else:
            c = compare(outs["full:fa4"], ref_full, dtype)
            full_err["fa4"] = c
            if not c.ok:
                problems.append(f"{tag}: FA-4 full attention vs float64 math: {c}")
            fns["full:fa4"] = full_fa4
    if device == "cuda" and _triton_ok():  # flash-decoding (split over the keys) with the decode kernels
        fd = full_decode()

        def full_tri():
            outs["full:triton_splitk"] = fd()
        full_tri()
        c = compare(outs["full:triton_splitk"], ref_full, dtype)
        full_err["triton_splitk"] = c
        if not c.ok:
            problems.append(f"{tag}: Triton split-K full attention vs float64 math: {c}")
        fns["full:triton_splitk"] = full_tri
    return tried, full_err


def _fa4_full(qf, kf, vf, scale, device):
    """FA-4's full-attention decode over the same keys through nsa_core's adapter -> a function
    returning [B, G, h, dv] like the SDPA baselines, or why it cannot run here (str).

    ``qf`` [B, G, h, dk] (the h query heads of a KV group as rows), ``kf`` / ``vf`` [B, G, S, d]
    -> FA-4's layout q [B, 1, G*h, dk], k / v [B, S, G, d] (GQA native: head g*h + i reads KV
    head g), laid out once here, outside the timing."""
    from nsa_core.flash import adapters

    st = adapters.status("fa4", qf.device.type)  # CUDA only (CPU tests: a fake module)
    if not st["present"]:
        return st["reason"]
    B, G, h, dk = qf.shape
    q4 = qf.reshape(B, 1, G * h, dk).contiguous()
    k4, v4 = kf.transpose(1, 2).contiguous(), vf.transpose(1, 2).contiguous()
    try:
        adapters.check("fa4", q4, k4, v4, "cmp")
    except adapters.PathUnavailable as e:
        return str(e)
    return lambda: adapters.full(q4, k4, v4, scale, "fa4").reshape(B, G, h, -1)


def _full_decode(q, K, V, pos, scale):
    from nsa_runner.measure.decode_baselines import FullDecode  # Triton: imported only where it runs

    return FullDecode(q, K, V, pos, scale)


def _fastest_full(ms, full_err, failed, tried, tag, problems):
    """The fastest full-attention baseline that was timed -> (ms, name, {"sdpa", "triton": fastest ms
    of each kind}, its rel_err); every candidate's line goes to ``tried``."""
    full_ms, full_name, by_kind = float("inf"), "", {"sdpa": float("nan"), "triton": float("nan"),
                                                     "fa4": float("nan")}
    for name, c in full_err.items():
        if f"full:{name}" not in ms:
            tried.append(f"{name}: {failed.get(f'full:{name}', 'not timed')}")
            continue
        t = ms[f"full:{name}"]
        tried.append(f"{name}: {t:.4f} ms ({c})")
        kind = "triton" if name.startswith("triton") else "fa4" if name == "fa4" else "sdpa"
        if not by_kind[kind] <= t:  # nan or larger
            by_kind[kind] = t
        if t < full_ms:
            full_ms, full_name = t, name
    if not full_name:
        problems.append(f"{tag}: no SDPA backend ran the full-attention baseline ({'; '.join(tried)})")
    full_rel = full_err[full_name].rel_err if full_name else float("nan")
    return full_ms, full_name, by_kind, full_rel


def measure(S: int, B: int, o: dict, device: str, log) -> tuple[list[dict], list[str]]:
    """One (S, B) point -> (one CSV row per kernel of ``o["kernels"]``, problems). See the module
    docstring for what is timed. The kernels share the layer, the context (each decodes over its own
    copy of the cache), the float64 reference and the full-attention baselines, and are timed
    round-robin with them in one set of replays."""
    import time

    import torch

    from nsa_core import NSAAttention, NSAConfig
    from nsa_core.decode import cache as cache_mod
    from nsa_core.decode import reference as _decode
    from nsa_core.decode.labels import label_of
    from nsa_core.testing import compare
    from nsa_runner.measure import timing

    t_start = time.perf_counter()
    problems: list[str] = []
    dtype = getattr(torch, DTYPES[o["dtype"]])
    cfg = NSAConfig(**o["nsa"])
    G, h = o["groups"], o["heads_per_group"]
    HQ, dk, dv, dim = G * h, o["dk"], o["dv"], o["dim"]
    kernels = o.get("kernels") or [o["kernel"]]
    torch.manual_seed(o["seed"] + S * 131 + B)
    gen = torch.Generator(device=device).manual_seed(o["seed"] + S + 7 * B)
    with torch.device(device):  # weights made and initialised there (on the host: ~0.23 s a build at dim 4096)
        m = NSAAttention(dim, HQ, G, dk, dv, cfg).to(dtype=dtype).eval()
    fill = o["fill"] if o["fill"] != "auto" else ("prefill" if S <= PREFILL_MAX_S else "random")
    with torch.no_grad():
        if fill == "prefill":
            xs = torch.randn(B, S - 1, dim, device=device, dtype=dtype, generator=gen)
            _, cache = m(xs, max_len=S, page_size=o["page_size"] or None)
            del xs
        else:
            cache = m.new_cache(B, S, page_size=o["page_size"] or None)
            cache.fill_random_(S - 1, generator=gen)
    x = torch.randn(B, 1, dim, device=device, dtype=dtype, generator=gen)
    ref_cache = cache.to(dtype=torch.float64)  # context before the step, for the float64 reference
    caches = {k: (cache if i == 0 else cache.clone()) for i, k in enumerate(kernels)}  # one context each
    decs = {}
    tag = f"S={S} B={B}"
    for k in kernels:
        try:
            dec = m.decoder(caches[k], impl=k)
            dec.x.copy_(x)
            dec.pos.fill_(S - 1)
            dec.run_step()  # one eager step (also compiles the kernels)
        except Exception as e:  # noqa: BLE001 - with several kernels, one that breaks must not hide the others
            if len(kernels) == 1:
                raise
            log(traceback.format_exc())
            problems.append(f"{tag} kernel {k}: the step raised {type(e).__name__}: "
                            f"{_first_line(e, 300)}")
            continue
        decs[k] = dec
    if not decs:
        raise RuntimeError(f"{tag}: no kernel's step ran ({'; '.join(problems)})")
    asked, kernels = kernels, list(decs)
    t_built = time.perf_counter()

    # -- parity: each kernel's step vs the float64 eager reference fed that step's selection ------
    m64 = copy.deepcopy(m).to(torch.float64)
    par, agree, blks = {}, {}, {}
    with torch.no_grad():
        p = m64.project(x.to(torch.float64), S - 1)
        ref_cache.append_(p.k_cmp[:, 0], p.v_cmp[:, 0], p.k_sel[:, 0], p.v_sel[:, 0], p.k_win[:, 0], p.v_win[:, 0],
                          m64.phi_k, m64.phi_v)
        _, ref_idx, ref_cnt = _decode.attend(p.q, p.gates, ref_cache, S - 1, cfg)
        ref_live = torch.where(torch.arange(ref_idx.shape[-1], device=ref_idx.device) < ref_cnt[..., None],
                               ref_idx.long(), -1)[:, 0]
        for k, dec in decs.items():
            blk = blks[k] = dec.blk.clone()
            idx, cnt = _sorted_selection(blk)
            o_fed, _, _ = _decode.attend(p.q, p.gates, ref_cache, S - 1, cfg, block_idx=idx, block_count=cnt)
            par[k] = compare(dec.y, m64.out(o_fed), dtype)
            agree[k] = float((torch.sort(ref_live, -1).values == torch.sort(idx[:, 0].long(), -1).values)
                             .all(-1).float().mean())
            if not par[k].ok:
                problems.append(f"{tag} kernel {k}: step output vs float64 reference (same selection): {par[k]}")
    del ref_cache, m64

    # -- counters -------------------------------------------------------------------------------
    want = cache_mod.formula_reads(S, cfg)
    reads = {}
    for who, (bi, bc) in [*((f"step ({k})", (blks[k], None)) for k in kernels),
                          ("reference", (ref_idx[:, 0], ref_cnt[:, 0]))]:
        r = cache_mod.read_counts(S, bi, bc, cfg)
        for key in cache_mod.READ_KEYS:
            bad = r[key] != want[key]
            if bool(bad.any()):
                problems.append(f"{tag}: reads_{key} of the {who} selection {sorted(set(r[key].flatten().tolist()))} "
                                f"!= formula {want[key]} in {int(bad.sum())} of {bad.numel()} (b, group)")
        if who.startswith("step"):
            reads[who[6:-1]] = {key: int(r[key].max()) for key in r}
    t_checked = time.perf_counter()

    # -- timing ---------------------------------------------------------------------------------
    with torch.no_grad():
        outs = {}

        def keep(name, f):
            def run():
                outs[name] = f()
            return run

        fns, names = {}, {}
        for i, (k, dec) in enumerate(decs.items()):
            proj = dec.project(dec.x)
            sfx = "" if i == 0 else f":{k}"  # the first kernel keeps the plain names (step, attn)
            names[k] = ("step" + sfx, "attn" + sfx, "eager" + sfx)
            fns[names[k][0]] = keep(names[k][0], dec.run_step)
            fns[names[k][1]] = keep(names[k][1], lambda dec=dec, proj=proj: dec.attn(*proj))
        dec0 = decs[kernels[0]]
        q = dec0.project(dec0.x)[0]
        # -- full-attention baseline over the same S tokens: every SDPA backend that runs ----------
        qf = q.reshape(B, G, h, dk)
        kf, vf = cache.sel_dense(S)  # views (dense cache) or a gathered copy (paged): the baseline is dense
        tried, full_err = _full_baselines(
            qf, kf, vf, dec0.scale, device, dtype, tag, outs, fns, problems,
            lambda: (_full_decode(q, kf.contiguous(), vf.contiguous(), dec0.pos, dec0.scale) if cache.paged
                     else _full_decode(q, cache.K_sel, cache.V_sel, dec0.pos, dec0.scale)))
        runs, failed = (timing.graph_replays(fns, optional=[k for k in fns if k.startswith("full:")])
                        if device == "cuda" and o["graphs"] else (fns, {}))
        tm, _ = timing.bench_round_robin(runs, device=device, warmup=o["warmup"], iters=o["iters"])
        if device == "cuda":
            for k, dec in decs.items():
                tm[names[k][2]] = timing.bench(dec.run_step, device=device, warmup=o["eager_warmup"],
                                               iters=o["eager_iters"])
        ms = {k: t.ms for k, t in tm.items()}
        t_timed = time.perf_counter()
        # -- shares: ONE method that partitions the step (profiled passes of the timed step itself) --
        parts = {k: timing.profile_partition(runs[names[k][0]], label_of, device=device, passes=o["profile_passes"])
                 for k in kernels}
        for k, v in outs.items():
            if not bool(torch.isfinite(v).all()):
                problems.append(f"{tag}: non-finite output of '{k}'")
        for k, dec in decs.items():
            if not bool(torch.isfinite(dec.y).all()):
                problems.append(f"{tag} kernel {k}: non-finite step output")
        full_ms, full_name, by_kind, full_rel = _fastest_full(ms, full_err, failed, tried, tag, problems)
    log(f"{tag}: full-attention baselines: " + "; ".join(tried))

    es = torch.empty((), dtype=dtype).element_size()
    rows = []
    for k in kernels:
        step_n, attn_n, eager_n = names[k]
        part = parts[k]
        total = sum(reads[k].values())
        nsa_bytes = B * G * total * (dk + dv) * es
        full_bytes = B * G * S * (dk + dv) * es
        shares = part.shares()
        neg = [f"{p_} {shares[p_]:.1f}%" for p_ in SHARE_PARTS if shares.get(p_, 0.0) < -0.5]
        if neg:  # a partition charges each instant once; a negative part means it double-counted
            problems.append(f"{tag} kernel {k}: negative share(s) of the step ({', '.join(neg)}): its parts "
                            "double-count overlapping kernels")
        row = {
            "S": S, "B": B, "impl": BUILTIN, "kernel": k + (f"/paged{o['page_size']}" if o["page_size"] else ""),
            "fill": fill,
            "ms_step": ms[step_n], "ms_attn": ms[attn_n], **{f"ms_{p_}": part.parts.get(p_, 0.0) for p_ in SHARE_PARTS},
            "ms_full": full_ms, "ms_full_sdpa": by_kind["sdpa"], "ms_full_triton": by_kind["triton"],
            "ms_full_fa4": by_kind["fa4"],
            "speedup": full_ms / ms[attn_n], "speedup_step": full_ms / ms[step_n],
            **{f"share_{p_}": shares.get(p_, 0.0) for p_ in SHARE_PARTS},
            "share_sum": sum(shares.get(p_, 0.0) for p_ in SHARE_PARTS),
            "ms_step_eager": ms.get(eager_n, float("nan")),
            **_spread_cols(tm, {"ms_step": step_n, "ms_attn": attn_n, "ms_full": f"full:{full_name}",
                                "ms_step_eager": eager_n}),
            "reads_cmp": reads[k].get("cmp", -1), "reads_sel": reads[k].get("sel", -1),
            "reads_win": reads[k].get("win", -1),
            "reads_total": total, "reads_bound": cache_mod.paper_bound(S, cfg), "reads_full": S,
            "read_ratio": S / total if total else float("nan"),
            "GB/s": nsa_bytes / (ms[attn_n] * 1e-3) / 1e9, "GB/s_full": full_bytes / (full_ms * 1e-3) / 1e9,
            "full_backend": full_name, "parity_rel_err": par[k].rel_err, "parity_tol": par[k].tol,
            "sel_agree": agree[k], "full_rel_err": full_rel, "ms_profiled": part.total, "share_method": part.method,
            "status": "", "note": "",
        }
        log(f"{tag} kernel {k}: step partition ({part.method}, {part.passes} passes, {part.total * 1e3:.1f} us per "
            "pass): " + "; ".join(f"{lab}/{name} {v * 1e3:.1f} us" for (lab, name), v in
                                  sorted(part.items.items(), key=lambda kv: -kv[1])[:12]))
        if set(part.parts) - set(SHARE_PARTS):
            problems.append(f"{tag}: the step partition has labels outside {SHARE_PARTS}: {sorted(part.parts)}")
        def whose(pr, kk):
            return f"kernel {kk}:" in pr or f"step ({kk})" in pr

        mine = [pr for pr in problems if whose(pr, k) or not any(whose(pr, kk) for kk in asked)]
        row["status"] = "FAIL" if mine else "PASS"
        rows.append(row)
    t_end = time.perf_counter()
    log(f"{tag}: wall {t_end - t_start:.1f} s (build + first steps {t_built - t_start:.1f}, parity + counters "
        f"{t_checked - t_built:.1f}, timing {t_timed - t_checked:.1f}, partition {t_end - t_timed:.1f})")
    return rows, problems


# ---- an implementation's decode_step (nsa_runner.impls.DECODE_STEP) -------------------------------

CONTEXT_NAMES = ("k_cmp", "v_cmp", "k_sel", "v_sel", "k_win", "v_win")  # decode_step's inputs (DECODE_STEP)
STEP_NAMES = ("q", *CONTEXT_NAMES, "gates")  # a step's (after t)


def _step_result(out, B: int, HQ: int, G: int, dv: int, n: int, dtype=None):
    """The step's (o, block_idx, block_count), shapes checked, o in q's ``dtype`` (round 17 a2: DECODE_STEP's
    "o in q's dtype"; a float64 o was compared at the case's tolerance); ValueError / BadOutput naming what is
    wrong."""
    from nsa_runner.impls import BadOutput

    if not isinstance(out, (tuple, list)) or len(out) != 3:
        raise ValueError(f"step must return (o, block_idx, block_count), got {type(out).__name__}"
                         + (f" of {len(out)}" if isinstance(out, (tuple, list)) else ""))
    o, idx, cnt = out
    for what, x, want in (("o", o, (B, 1, HQ, dv)), ("block_idx", idx, (B, 1, G, n)), ("block_count", cnt, (B, 1, G))):
        if tuple(getattr(x, "shape", ())) != want:
            raise ValueError(f"step returned {what} of shape {tuple(getattr(x, 'shape', ()))}, expected {list(want)}")
    if dtype is not None and getattr(o, "dtype", None) != dtype:
        raise BadOutput(f"step returned o of dtype {getattr(o, 'dtype', None)}, want {dtype} (the case's dtype: "
                        "o in q's dtype)")
    return o, idx, cnt


def _selection_rows(idx, cnt, ref_idx, ref_cnt, q64, ref_cache, t: int, cfg, band: float) -> dict:
    """One step's selection [B, G] rows vs the float64 reference's: malformed rows (ids not ascending,
    out of 0..t // l', or -1 padding not after block_count), rows that differ, and differing rows that
    are near-ties (the reference scores of the two sets within ``band`` relative, DESIGN §7)."""
    import torch

    from nsa_core import functional as F

    nb = t // cfg.l_sel + 1
    ix, ct = idx[:, 0].long(), cnt[:, 0].long()  # [B, G, n], [B, G]
    n = ix.shape[-1]
    slot = torch.arange(n, device=ix.device)
    live = slot < ct[..., None]
    bad = ((ct < 0) | (ct > n)
           | (live & ((ix < 0) | (ix >= nb))).any(-1)
           | (~live & (ix != -1)).any(-1)
           | (live[..., 1:] & (ix[..., 1:] <= ix[..., :-1])).any(-1))

    def member(x, c):
        x, c = x.long(), c.long()
        ok = (torch.arange(x.shape[-1], device=x.device) < c[..., None]) & (x >= 0) & (x < nb)
        m = torch.zeros(*x.shape[:-1], nb + 1, dtype=torch.bool, device=x.device)
        m.scatter_(-1, torch.where(ok, x, torch.full_like(x, nb)), True)
        return m[..., :nb]

    a, b = member(ix, ct), member(ref_idx[:, 0], ref_cnt[:, 0])
    differ = (a != b).any(-1) & ~bad
    near = torch.zeros_like(differ)
    if bool(differ.any()):
        kc, _ = ref_cache.cmp_kv(cfg.num_cmp(t + 1))
        scores = F.block_scores(q64, kc, t + 1, cfg)[:, 0, :, :nb]  # [B, G, nb]
        sa, sb = (scores * a).sum(-1), (scores * b).sum(-1)
        near = (sa - sb).abs() <= band * sb.abs().clamp_min(1e-30)
    first = ""
    far = differ & ~near
    for mask, what in ((bad, "malformed"), (far, "differs from the reference")):
        if not first and bool(mask.any()):
            bb, gg = (int(v) for v in mask.nonzero()[0])
            first = (f"b={bb} g={gg}: {what}: {ix[bb, gg].tolist()} (count {int(ct[bb, gg])}) vs reference "
                     f"{ref_idx[bb, 0, gg].tolist()}")
    return {"rows": differ.numel(), "bad": int(bad.sum()), "differ": int(differ.sum()),
            "ties": int((differ & near).sum()), "first": first}


def measure_impl(S: int, B: int, o: dict, device: str, log, impl) -> tuple[dict, list[str]]:
    """One (S, B) point of an implementation's ``decode_step`` -> (CSV row, problems).

    The same layer (weights, seed) as nsa_core's point gives a context of S - k tokens (--fill
    prefill: projections of random tokens; random: random per-branch keys/values) and k = min(d, S-1)
    new tokens, so a compressed token is made among the steps. ``decode_step`` gets the context, then
    steps at t = S-k .. S-1; each step is checked: its output vs the float64 reference of prefill at
    position t fed the step's selection (``nsa_core.decode.reference.attend``, the prefill math for one
    query; DESIGN §7 tolerance), its selection vs the reference's (near-ties within the dtype's
    tolerance accepted, at most 0.1% of rows), its read counters vs the formula, finiteness. Timed:
    the step at t = S-1 again (``ms_attn``: append + three branches + gates, what nsa_core's attn
    covers) and the same full-attention baselines; ``ms_step`` (with projections) and the shares
    are nsa_core's only (NaN here)."""
    import torch

    from nsa_core import NSAAttention, NSAConfig
    from nsa_core import functional as F
    from nsa_core.decode import cache as cache_mod
    from nsa_core.decode import reference as _decode
    from nsa_core.testing import compare, tolerance
    from nsa_runner.measure import timing

    problems: list[str] = []
    nan = float("nan")
    dtype = getattr(torch, DTYPES[o["dtype"]])
    cfg = NSAConfig(**o["nsa"])
    G, h = o["groups"], o["heads_per_group"]
    HQ, dk, dv, dim = G * h, o["dk"], o["dv"], o["dim"]
    gen = torch.Generator(device=device).manual_seed(o["seed"] + S + 7 * B)
    # the layer's weights from the seed nsa_core's point uses, in a fork of the global generators: this runs in the
    # adapter guard, which puts back the generators' states (round 17 a1) and would name this reseed as the adapter's
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.device(device).type == "cuda" else []):
        torch.manual_seed(o["seed"] + S * 131 + B)
        with torch.device(device):  # weights made and initialised there (on the host: ~0.23 s a build at dim 4096)
            m = NSAAttention(dim, HQ, G, dk, dv, cfg).to(dtype=dtype).eval()
    fill = o["fill"] if o["fill"] != "auto" else ("prefill" if S <= PREFILL_MAX_S else "random")
    k = min(cfg.d, S - 1)
    t0 = S - k
    tag = f"{impl.name} S={S} B={B}"
    with torch.no_grad():
        if fill == "prefill":
            p = m.project(torch.randn(B, t0, dim, device=device, dtype=dtype, generator=gen), 0)
            context = [p.k_cmp, p.v_cmp, p.k_sel, p.v_sel, p.k_win, p.v_win]
            del p
        else:
            context = [torch.randn(B, t0, G, d, device=device, dtype=dtype, generator=gen)
                       for d in (dk, dv, dk, dv, dk, dv)]
        new = m.project(torch.randn(B, k, dim, device=device, dtype=dtype, generator=gen), t0)
    branch = (new.k_cmp, new.v_cmp, new.k_sel, new.v_sel, new.k_win, new.v_win)
    ref = cache_mod.NSACache.empty(cfg, B, G, dk, dv, S, dtype=torch.float64, device=device)  # the reference's
    ref.fill_(*context, F.compress(context[0].double(), cfg), F.compress(context[1].double(), cfg))  # float64 copy
    kf = torch.cat([context[2], new.k_sel], 1).transpose(1, 2).contiguous()  # [B, G, S, dk]: the baseline's keys
    vf = torch.cat([context[3], new.v_sel], 1).transpose(1, 2).contiguous()
    # copies of its own (round 17 a3, as the parity stages since round 16 B5): made here, before any timing; a
    # write into them is its FAIL naming the input, and never reaches the reference's or the baselines' tensors
    given = _parity.handed(*context)
    step = impl.parts["decode_step"](*given, cfg, S)
    wrote = dict.fromkeys(_parity.written(zip(CONTEXT_NAMES, context, given, strict=True)))
    if wrote:
        problems.append(f"{tag}: " + _parity.written_text(f"{impl.name}'s decode_step", wrote))
    del context, given
    wrote = {}
    worst, sel = None, {"rows": 0, "bad": 0, "differ": 0, "ties": 0, "first": ""}
    band = tolerance(dtype)
    reads = {}
    for i in range(k):
        t = t0 + i
        args = (new.q[:, i:i + 1], *(x[:, i:i + 1] for x in branch), new.gates[:, i:i + 1])
        mine = _parity.handed(*args)
        y, idx, cnt = _step_result(step(t, *mine), B, HQ, G, dv, cfg.n_sel, dtype)
        wrote.update(dict.fromkeys(_parity.written(zip(STEP_NAMES, args, mine, strict=True))))
        idx, cnt = idx.to(device), cnt.to(device)
        with torch.no_grad():
            ref.append_(*(x[:, i].double() for x in branch))
            q64, g64 = new.q[:, i:i + 1].double(), new.gates[:, i:i + 1].double()
            o_fed, _, _ = _decode.attend(q64, g64, ref, t, cfg, block_idx=idx, block_count=cnt)
            _, ref_idx, ref_cnt = _decode.attend(q64, g64, ref, t, cfg)
        if not bool(torch.isfinite(y).all()):
            problems.append(f"{tag} t={t}: non-finite step output")
        par = compare(y, o_fed, dtype)
        if worst is None or not par.rel_err <= worst.rel_err:
            worst = par
        if not par.ok:
            problems.append(f"{tag} t={t}: step output vs float64 prefill reference at t (same selection): {par}")
        rows = _selection_rows(idx, cnt, ref_idx, ref_cnt, q64, ref, t, cfg, band)
        for key in ("rows", "bad", "differ", "ties"):
            sel[key] += rows[key]
        if rows["first"] and not sel["first"]:
            sel["first"] = f"t={t} {rows['first']}"
        if rows["bad"] == 0:
            want = cache_mod.formula_reads(t + 1, cfg)
            r = cache_mod.read_counts(t + 1, idx[:, 0], cnt[:, 0], cfg)
            for key in cache_mod.READ_KEYS:
                off = r[key] != want[key]
                if bool(off.any()):
                    problems.append(f"{tag} t={t}: reads_{key} of the step's selection "
                                    f"{sorted(set(r[key].flatten().tolist()))} != formula {want[key]} in "
                                    f"{int(off.sum())} of {off.numel()} (b, group)")
            reads = {key: int(r[key].max()) for key in r}
    if wrote:
        problems.append(f"{tag}: " + _parity.written_text(f"{impl.name}'s step", wrote))
    if sel["bad"]:
        problems.append(f"{tag}: {sel['bad']} malformed selection row(s) (ids ascending in 0..t//l', -1 after "
                        f"block_count): {sel['first']}")
    far = sel["differ"] - sel["ties"]
    if far or sel["ties"] > max(1, sel["rows"] // 1000):
        problems.append(f"{tag}: selection vs float64 reference: {sel['rows'] - sel['differ'] - sel['bad']}/"
                        f"{sel['rows']} (t, group) rows identical, {sel['ties']} near-tie(s), {far} differ"
                        + (f"; first at {sel['first']}" if sel["first"] else "") + f" (over {k} steps)")
    log(f"{tag}: {k} steps t={t0}..{S - 1} checked: worst parity {worst}; selection {sel['rows'] - sel['differ']}/"
        f"{sel['rows']} rows as the reference ({sel['ties']} near-ties)")

    # -- timing: the step at t = S-1 again (it overwrites token S-1) vs the full-attention baselines --
    ours = (new.q[:, k - 1:k], *(x[:, k - 1:k] for x in branch), new.gates[:, k - 1:k])
    last = _parity.handed(*ours)  # its copies, made once outside the timed calls (every timed step reuses them)
    outs: dict = {}
    scale = 1.0 / dk ** 0.5
    with torch.no_grad():
        def attn():
            outs["attn"] = step(S - 1, *last)[0]

        fns = {"attn": attn}
        q = new.q[:, k - 1].contiguous()  # [B, HQ, dk]
        tried, full_err = _full_baselines(q.reshape(B, G, h, dk), kf, vf, scale, device, dtype, tag, outs, fns,
                                          problems, lambda: _full_decode(q, kf, vf, torch.tensor(S - 1, device=device),
                                                                         scale))
        note = ""
        runs, failed = fns, {}
        if device == "cuda" and o["graphs"]:
            runs, failed = timing.graph_replays(fns, optional=list(fns))
            if "attn" in failed:  # the step cannot be captured: time everything eagerly, alike
                note = f"timed eagerly (CUDA-graph capture of the step failed: {failed['attn']})"
                runs, failed = fns, {}
        tm, _ = timing.bench_round_robin(runs, device=device, warmup=o["warmup"], iters=o["iters"])
        ms = {name: t.ms for name, t in tm.items()}
        for name, v in outs.items():
            if not bool(torch.isfinite(v).all()):
                problems.append(f"{tag}: non-finite output of '{name}'")
        full_ms, full_name, by_kind, full_rel = _fastest_full(ms, full_err, failed, tried, tag, problems)
    timed_wrote = _parity.written(zip(STEP_NAMES, ours, last, strict=True))  # after the timing: nothing timed more
    if timed_wrote:
        problems.append(f"{tag}: " + _parity.written_text(f"{impl.name}'s step (timed at t={S - 1})", timed_wrote))
    log(f"{tag}: full-attention baselines: " + "; ".join(tried))
    es = torch.empty((), dtype=dtype).element_size()
    total = sum(reads.values()) if reads else 0
    row = {c: nan for c in COLUMNS}
    row.update({
        "S": S, "B": B, "impl": impl.name, "kernel": "decode_step", "fill": fill, "ms_attn": ms["attn"],
        "ms_full": full_ms, "ms_full_sdpa": by_kind["sdpa"], "ms_full_triton": by_kind["triton"],
        "ms_full_fa4": by_kind["fa4"],
        "speedup": full_ms / ms["attn"],
        **_spread_cols(tm, {"ms_attn": "attn", "ms_full": f"full:{full_name}"}),
        "reads_cmp": reads.get("cmp", -1), "reads_sel": reads.get("sel", -1), "reads_win": reads.get("win", -1),
        "reads_total": total, "reads_bound": cache_mod.paper_bound(S, cfg), "reads_full": S,
        "read_ratio": S / total if total else nan,
        "GB/s": B * G * total * (dk + dv) * es / (ms["attn"] * 1e-3) / 1e9,
        "GB/s_full": B * G * S * (dk + dv) * es / (full_ms * 1e-3) / 1e9,
        "full_backend": full_name, "parity_rel_err": worst.rel_err, "parity_tol": worst.tol,
        "sel_agree": (sel["rows"] - sel["differ"] - sel["bad"]) / sel["rows"], "full_rel_err": full_rel,
        "share_method": "-", "status": "FAIL" if problems else "PASS",
        "note": "; ".join(filter(None, [f"{k} steps checked (t={t0}..{S - 1}); ms_attn = its step (append + branches"
                                        " + gates); ms_step and shares: nsa_core only", note, impl.note])),
    })
    return row, problems


def _unmeasured(S: int, B: int, name: str, status: str, note: str) -> dict:
    """A row for an (S, B) point an implementation did not run: SKIP (its reason) or ERROR."""
    row = {c: float("nan") for c in COLUMNS}
    row.update({"S": S, "B": B, "impl": name, "kernel": "-", "fill": "-", "full_backend": "", "share_method": "",
                "status": status, "note": note})
    return row


# ---- outputs -----------------------------------------------------------------------------------

def _env_lines(device: str) -> list[str]:
    import platform

    import torch

    lines = [f"torch {torch.__version__}", f"python {platform.python_version()}"]
    from nsa_core._triton import PROBLEM, triton

    lines.append(f"triton {getattr(triton, '__version__', '?')}" if triton is not None else f"triton: {PROBLEM}")
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        lines.append(f"device {p.name} (sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                     f"{p.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}")
    else:
        import os

        lines.append(f"device cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    return lines


def _table(rows: list[dict]) -> str:
    head = (f"{'S':>6} {'B':>3} {'impl':>10} {'kernel':>14} {'fill':>7} {'step':>8} {'attn':>8} {'cmp%':>6} "
            f"{'sel%':>6} {'win%':>6} {'shrd%':>6} {'other%':>6} {'rem%':>6} {'sum%':>6} {'full':>8} {'speedup':>7} "
            f"{'reads cmp/sel/win=total':>24} {'bound':>7} {'full':>6} {'full/nsa':>8}")
    out = [head, "-" * len(head)]
    for r in rows:
        reads = f"{r['reads_cmp']}/{r['reads_sel']}/{r['reads_win']}={r['reads_total']}"
        out.append(f"{r['S']:>6} {r['B']:>3} {r['impl']:>10} {r['kernel']:>14} {r['fill']:>7} {r['ms_step']:>8.4f} "
                   f"{r['ms_attn']:>8.4f} {r['share_cmp']:>6.1f} {r['share_sel']:>6.1f} {r['share_win']:>6.1f} "
                   f"{r['share_shared']:>6.1f} {r['share_other']:>6.1f} {r['share_remainder']:>6.1f} "
                   f"{r['share_sum']:>6.1f} {r['ms_full']:>8.4f} {r['speedup']:>7.2f} {reads:>24} "
                   f"{r['reads_bound']:>7.0f} {r['reads_full']:>6} {r['read_ratio']:>8.2f}")
    return "\n".join(out)


@drawing()  # matplotlib's own settings, whatever an adapter left in rcParams (round 23 B23-4)
def _plot(rows: list[dict], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for B in sorted({r["B"] for r in rows}):
        for impl in impls:  # nsa_core: "NSA ..." as always; another implementation by its name (attn only)
            rs = sorted((r for r in rows if r["B"] == B and r["impl"] == impl), key=lambda r: r["S"])
            S = [r["S"] for r in rs]
            if not rs:
                continue
            if impl != BUILTIN:
                a1.plot(S, [r["ms_attn"] * 1e3 for r in rs], "^-.", label=f"{impl} attn (decode_step) B={B}")
                continue
            line = a1.plot(S, [r["ms_attn"] * 1e3 for r in rs], "o-", label=f"NSA attn B={B}")[0]
            a1.plot(S, [r["ms_step"] * 1e3 for r in rs], "o:", color=line.get_color(), label=f"NSA layer step B={B}")
            a1.plot(S, [r["ms_full"] * 1e3 for r in rs], "s--", color=line.get_color(), alpha=0.6,
                    label=f"full attn (fastest baseline) B={B}")
        if BUILTIN not in impls:
            rs = sorted({r["S"]: r for r in rows if r["B"] == B}.values(), key=lambda r: r["S"])
            a1.plot([r["S"] for r in rs], [r["ms_full"] * 1e3 for r in rs], "s--", alpha=0.6,
                    label=f"full attn (fastest baseline) B={B}")
    a1.set(xscale="log", yscale="log", xlabel="cached length S", ylabel="µs per decode step", title="latency")
    a1.set_xticks(sorted({r["S"] for r in rows}), [str(s) for s in sorted({r["S"] for r in rows})])
    a1.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a1.legend(fontsize=7)
    rs = sorted({r["S"]: r for r in rows if r["impl"] == impls[0]}.values(), key=lambda r: r["S"])
    S = [r["S"] for r in rs]
    a2.plot(S, [r["reads_total"] for r in rs], "o-", label="NSA reads (counted)")
    a2.plot(S, [r["reads_bound"] for r in rs], "k:", label="paper bound (s-l)/d + n l' + w")
    a2.plot(S, S, "s--", label="full attention (s)")
    for k, st in (("reads_cmp", "^-"), ("reads_sel", "v-"), ("reads_win", ">-")):
        a2.plot(S, [r[k] for r in rs], st, alpha=0.5, label=k)
    a2.set(xscale="log", yscale="log", xlabel="cached length S", ylabel="tokens read per step per KV group",
           title="KV reads")
    a2.set_xticks(S, [str(s) for s in S])
    a2.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


class DecodeBench(Stage):
    name = "decode-bench"
    preload_flash = True  # calls the flash paths: its spare imports FA-4's CUDA-free part
    order = 60
    requires = ()
    description = "decode step latency per branch and total vs full-attention decode; read counters vs formula"
    timeout_s = 1800.0
    options = (
        Option("--S-list", int_list, None, "cached lengths S (default CUDA 4k,8k,16k,32k,64k, quick 4k,64k; "
               "CPU 256,1024)"),
        Option("--batch-list", int_list, None, "batch sizes (default CUDA 1,16; CPU 1,2)"),
        Option("--iters", positive_int, None, "timed steps per measurement, median (default CUDA 50, CPU 15)"),
        Option("--warmup", nonneg_int, None, "untimed steps first (default CUDA 10, CPU 2)"),
        Option("--profile-passes", positive_int, None,
               "profiled passes of the step for the shares (default CUDA 5, CPU 3)"),
        Option("--dtype", str, None, "cache/compute dtype (default CUDA bf16, CPU fp32)", choices=tuple(DTYPES)),
        Option("--groups", positive_int, None, "KV groups G (default CUDA 4 = paper, CPU 2)"),
        Option("--heads-per-group", positive_int, None, "query heads per group h (default CUDA 16, CPU 2)"),
        Option("--dk", positive_int, None, "key head dim (default CUDA 192, CPU 32)"),
        Option("--dv", positive_int, None, "value head dim (default CUDA 128, CPU 16)"),
        Option("--dim", positive_int, None, "model dim (default CUDA 2048, CPU 64)"),
        Option("--nsa", parse_nsa, None, "geometry, e.g. l=32,d=16,l_sel=64,n_sel=16,w=512 (default CUDA: paper; "
               "CPU: l=16,d=8,l_sel=32,n_sel=8,w=128)"),
        Option("--kernel", _kernel_list, "auto", "nsa_core's decode step kernel, or several comma-separated (one row "
               "each, same layer, context and baselines, timed round-robin): torch, triton (5 launches, PDL), fused (2 "
               "launches), split (2 launches, split-K sized from the SM count); auto: triton on CUDA, torch on CPU"),
        Option("--fill", str, "auto", f"context: prefill through the module, or random direct cache fill "
               f"(auto: prefill for S <= {PREFILL_MAX_S})", choices=("auto", "prefill", "random")),
        Option("--page-size", nonneg_int, 0, "paged raw KV cache with this many tokens per page (block table, "
               "as vLLM / FlashInfer); 0 = dense"),
        Option("--graphs", str, "on", "CUDA graphs for the timed functions (CUDA only)", choices=("on", "off")),
        seeds.option(0, "weights and inputs"),
        _parity.impl_option(),
    )

    def resolve(self, ctx) -> dict:
        """Options with device defaults filled in; ValueError naming the problem."""
        dev = "cuda" if ctx.device == "cuda" else "cpu"
        o = dict(DEFAULTS[dev])
        if dev == "cuda" and getattr(ctx, "profile", "full") == "quick":
            o.update(QUICK_CUDA)
        for k, v in (ctx.options or {}).items():
            if v is not None:
                o[k] = v
        if isinstance(o["nsa"], str):
            o["nsa"] = parse_nsa(o["nsa"])
        for k in ("groups", "heads_per_group", "dk", "dv", "dim", "iters", "profile_passes"):
            if not isinstance(o[k], int) or o[k] <= 0:
                raise ValueError(f"decode-bench: --{k.replace('_', '-')} must be a positive int, got {o[k]!r}")
        if o["dk"] % 2:
            raise ValueError(f"decode-bench: --dk must be even (RoPE rotates pairs), got {o['dk']}")
        if o["dtype"] not in DTYPES:
            raise ValueError(f"decode-bench: --dtype must be one of {', '.join(DTYPES)}, got {o['dtype']!r}")
        if not o["S_list"] or any(s < 2 for s in o["S_list"]):
            raise ValueError(f"decode-bench: every S in --S-list must be >= 2, got {o['S_list']}")
        kernels = (_kernel_list(o["kernel"]).split(",") if isinstance(o["kernel"], str) else list(o["kernel"]))
        kernels = [(AUTO_KERNEL if dev == "cuda" and _triton_ok() else "torch") if k == "auto" else k
                   for k in kernels]
        o["kernels"] = list(dict.fromkeys(kernels))
        o["kernel"] = ",".join(o["kernels"])
        tri = [k for k in o["kernels"] if k != "torch"]
        if tri and dev == "cpu":
            import os

            if os.environ.get("TRITON_INTERPRET") != "1":
                raise ValueError(f"decode-bench: --kernel {tri[0]} on CPU needs TRITON_INTERPRET=1 "
                                 "(the executor sets it)")
        o.setdefault("eager_iters", EAGER_ITERS[dev])
        o.setdefault("eager_warmup", EAGER_WARMUP[dev])
        o["impl"] = o.get("impl") or BUILTIN
        o["graphs"] = o.get("graphs", "on") in ("on", True)
        o["page_size"] = o.get("page_size") or 0
        o["iters"] = max(o["iters"], 1)
        return o

    def run(self, ctx) -> StageResult:
        o = self.resolve(ctx)
        dev = "cuda" if ctx.device == "cuda" else "cpu"
        log_lines: list[str] = []

        def log(msg: str) -> None:
            print(msg, flush=True)
            log_lines.append(msg)

        rows, problems, errors = [], [], []
        started = now_iso()
        impl_text = o["impl"] if o["impl"] != BUILTIN else None
        log(f"seed {o['seed']}; replay with: {seeds.replay_command(ctx, self.name, o['seed'], impl=impl_text)} "
            "(+ this run's options)")
        import torch

        entries = _parity.impl_entries(ctx)
        threads = torch.get_num_threads()
        if dev == "cpu":  # one thread: CPU timings on a shared machine are steadier
            torch.set_num_threads(1)
        import gc

        gc.freeze()  # the imports out of the collector's view: each point's _free collected them again (~0.13 s)
        try:
            for entry in entries:
                if _is_builtin(entry):  # nsa_core: the whole layer step, its kernels, counters and shares
                    _points(o, dev, log, rows, problems, errors)
                else:
                    _impl_points(entry, o, dev, log, rows, problems)
        finally:
            torch.set_num_threads(threads)
            gc.unfreeze()  # back in view (a stage run in-process, as tests do, leaves the collector as it was)
        files = self._write(ctx, o, dev, rows, errors + problems, started, log_lines)
        if errors:  # the stage broke on a point (exception, CUDA fault): ERROR, the other points are written
            return StageResult(Status.ERROR, f"{len(errors)} point(s) raised: {errors[0]}", files=files)
        names = [e.name for e in entries]
        measured = [r for r in rows if r["status"] in ("PASS", "FAIL")]
        skipped = list(dict.fromkeys(r["note"] for r in rows if r["status"] == "SKIP"))
        skip_note = f"; not run: {'; '.join(skipped)}"[:800] if skipped else ""
        timed = [r for r in measured if r["speedup"] == r["speedup"]]
        metrics = {"points": len(measured), "kernel": o["kernel"], "impls": names, "dtype": o["dtype"],
                   "max_speedup": max((r["speedup"] for r in timed), default=None),
                   "speedup_largest_S": {_metric_key(r, names, o["kernels"]): round(r["speedup"], 3) for r in timed
                                         if r["S"] == max(x["S"] for x in timed)},
                   "skipped": skipped}
        if problems:
            return StageResult(Status.FAIL, f"{len(problems)} check(s) failed: {problems[0]}{skip_note}"[:2000],
                               files=files, metrics=metrics)
        if not measured:
            return StageResult(Status.SKIP, f"no implementation's decode step runs here{skip_note}", files=files,
                               metrics=metrics, hint="an implementation with a decode_step part (nsa-run list "
                               "--impls); default --impl nsa_core")
        main = [r for r in measured if r["impl"] == BUILTIN] or measured
        largest = max(main, key=lambda r: (r["S"], r["B"]))
        per_impl = "" if names == [BUILTIN] else " (" + ", ".join(
            f"{n}: {sum(r['impl'] == n for r in measured)} points" for n in names) + ")"
        who = "" if names == [BUILTIN] else f"{largest['impl']} "
        speed = f"{largest['speedup']:.2f}x"
        if len(o["kernels"]) > 1:  # every kernel's ratio at the largest point, e.g. "split 8.1x, triton 6.3x"
            at = [r for r in main if (r["S"], r["B"]) == (largest["S"], largest["B"])]
            speed = ", ".join(f"{r['kernel']} {r['speedup']:.2f}x" for r in at)
            per_impl = f" ({len(o['kernels'])} kernels: {o['kernel']})" + per_impl
        return StageResult(Status.PASS, f"{len(measured)} points{per_impl}; counters = formula, parity ok; {who}"
                           f"S={largest['S']} B={largest['B']}: {speed} vs full attention, reads "
                           f"{largest['reads_total']} vs {largest['S']}{skip_note}", files=files, metrics=metrics)

    def _write(self, ctx, o, dev, rows, problems, started, log_lines) -> list[str]:
        import pandas as pd

        from nsa_core import NSAConfig

        d = ctx.dir
        cfg = NSAConfig(**o["nsa"])
        measured = [r for r in rows if r["status"] in ("PASS", "FAIL")]
        not_run = [r for r in rows if r not in measured]
        fills = sorted({r["fill"] for r in measured})
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        impl_arg = o["impl"] if o["impl"] != BUILTIN else None
        fill_note = {"prefill": "prefill of S-1 tokens through the module",
                     "random": "direct cache fill with random data (every cache independent: the compressed cache "
                               "is not the compression of the raw one)"}
        head = [
            f"# nsa-run decode-bench  run {getattr(ctx, 'run_id', '')}  started {started}",
            *[f"# {x}" for x in _env_lines(dev)],
            f"# layer: dim={o['dim']} G={o['groups']} h={o['heads_per_group']} "
            f"(HQ={o['groups'] * o['heads_per_group']}) dk={o['dk']} dv={o['dv']} dtype={o['dtype']}  "
            f"NSA {cfg.to_dict()}",
            f"# kernel={o['kernel']} (nsa_core's step)  graphs={'on' if o['graphs'] and dev == 'cuda' else 'off'}  "
            f"iters={o['iters']} warmup={o['warmup']}  seed={o['seed']}",
            f"# impls={','.join(impls) or o['impl']}: nsa_core = the whole layer step (its kernel above); another "
            "implementation = its decode_step part (nsa_runner.impls.DECODE_STEP) in the same layer",
            f"# replay: {seeds.replay_command(ctx, 'decode-bench', o['seed'], impl=impl_arg)} (+ the options above)",
            *[f"# context fill '{f}': {fill_note[f]}" for f in fills],
            "# times in ms, medians" + (" of CUDA-graph replays (CUDA events, L2 flushed before each)"
                                        if dev == "cuda" else " of perf_counter (CPU, torch.set_num_threads(1))"),
            "# the functions are timed round-robin (one replay of each per round)",
            "# step = whole layer step; attn = append + 3 branches + gates",
            "# shares: one profiled pass of the step partitioned (each kernel / op in exactly one part; sum = 100%):",
            "# cmp/sel/win = one branch's work; shared = attention work of several branches (append, sel+win",
            "# tiles, combine, fused kernels); other = projections etc.; rem = idle between kernels (CPU: no op)",
            "# speedup = full / attn (attention vs attention); reads = tokens per step per KV group",
        ]
        if any(r["impl"] != BUILTIN for r in measured):
            head += ["# an implementation's row: its decode_step, steps t = S-k..S-1 (k = d) checked against the",
                     "# float64 reference of prefill at t (same selection), its selection against the reference's, its",
                     "# read counters against the formula; attn = its step at t = S-1 again; step, shares: nsa_core's"]
        text = "\n".join(head) + "\n\n" + (_table(measured) if measured else "(no measured rows)") + "\n"
        if not_run:
            text += "\nnot run:\n" + "\n".join(f"  {r['status']} {r['impl']} S={r['S']} B={r['B']}: {r['note']}"
                                                 for r in not_run) + "\n"
        text += "\nchecks:\n" + ("\n".join(f"  FAIL {p}" for p in problems) if problems else
                                 "  counters == formula for every (b, group); parity ok; outputs finite"
                                 + ("; selections as the reference's" if len(impls) > 1 or impls != [BUILTIN] else ""))
        text += "\n"
        text += "\nlog:\n" + "\n".join(f"  {line}" for line in log_lines) + "\n"
        write_text(d / "decode_bench.txt", text)
        # measured rows only: a SKIP / ERROR point has no number to plot or compare (it is in the txt, the
        # summary and the stage's reason)
        df = pd.DataFrame(measured, columns=COLUMNS) if measured else pd.DataFrame(columns=COLUMNS)
        write_csv(d / "decode.csv", df)
        write_text(d / "decode_summary.txt", self._summary(measured, not_run, problems, o, dev, head))
        files = ["decode_bench.txt", "decode.csv", "decode_summary.txt"]
        if measured:
            what = o["kernel"] if impls == [BUILTIN] else ", ".join(
                f"{n} ({o['kernel']})" if n == BUILTIN else n for n in impls if any(r["impl"] == n for r in measured))
            _plot(measured, d / "decode.png", f"NSA decode ({what}, {o['dtype']}, G={o['groups']} h="
                  f"{o['heads_per_group']} dk={o['dk']} dv={o['dv']}) vs full attention, {_env_lines(dev)[-1][:60]}")
            files.append("decode.png")
        return files

    @staticmethod
    def _summary(rows, not_run, problems, o, dev, head) -> str:
        keep = ("# torch", "# triton", "# device", "# layer", "# kernel", "# impls")
        out = ["# decode-bench summary", *[h for h in head[1:] if h.startswith(keep)], ""]
        verdict = "FAIL" if problems else "PASS" if rows else "SKIP"
        out.append(f"verdict: {verdict} ({len(problems)} failed checks)")
        for p in problems:
            out.append(f"  - {p}")
        for r in not_run:
            out.append(f"  {r['status']} {r['impl']} S={r['S']} B={r['B']}: {r['note']}")
        out.append("")
        many = len({r["impl"] for r in rows}) > 1 or any(r["impl"] != BUILTIN for r in rows)
        kern = len(o.get("kernels") or ()) > 1  # several nsa_core kernels: each line names its kernel
        who = (lambda r: (f"{r['impl']:>10} " if many else "")
               + (f"{(r['kernel'] if r['impl'] == BUILTIN else ''):>14} " if kern else ""))
        out.append("per point: speedup (full/attn), speedup_step (full/step), NSA KV read ratio, fastest "
                   "full-attention baseline")
        for r in rows:
            out.append(f"  {who(r)}S={r['S']:>6} B={r['B']:>3}: attn {r['ms_attn'] * 1e3:9.1f} us  step "
                       f"{r['ms_step'] * 1e3:9.1f} us  full {r['ms_full'] * 1e3:9.1f} us  -> {r['speedup']:6.2f}x "
                       f"({r['speedup_step']:5.2f}x with projections)  reads {r['read_ratio']:5.1f}x fewer  "
                       f"[{r['full_backend']}]  {r['GB/s']:7.1f} GB/s NSA vs {r['GB/s_full']:7.1f} GB/s full")
        out.append("")
        out.append("shares of the step (%, one profiled pass partitioned): cmp / sel / win / shared / other / "
                   "remainder = sum")
        for r in (r for r in rows if r["impl"] == BUILTIN):
            out.append(f"  {who(r)}S={r['S']:>6} B={r['B']:>3}: {r['share_cmp']:5.1f} / {r['share_sel']:5.1f} / "
                       f"{r['share_win']:5.1f} / {r['share_shared']:5.1f} / {r['share_other']:5.1f} / "
                       f"{r['share_remainder']:5.1f} = {r['share_sum']:5.1f}   [{r['share_method']}]"
                       + (f"   (eager, no graph: {r['ms_step_eager'] * 1e3:.1f} us)" if dev == "cuda" else ""))
        out.append("")
        out.append("timings are measurements, not checks; on CPU they are CPU timings of small shapes.")
        return "\n".join(out) + "\n"


def _points(o, dev, log, rows, problems, errors) -> None:
    """Measure every (S, B); an exception in one point is logged and counted, the others still run."""
    for S in o["S_list"]:
        for B in o["batch_list"]:
            try:
                new_rows, probs = measure(S, B, o, dev, log)
            except Exception as e:  # noqa: BLE001 - one point failing must not hide the others
                msg = f"S={S} B={B}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"
                log(traceback.format_exc())
                errors.append(msg)
                continue
            finally:
                _free(dev)
            rows.extend(new_rows)
            problems += probs
            for row in new_rows:
                log(f"S={S:>6} B={B:>3} {row['kernel']:>8} step {row['ms_step']:.4f} ms attn {row['ms_attn']:.4f} ms "
                    f"full {row['ms_full']:.4f} ms speedup {row['speedup']:.2f}x reads {row['reads_total']} "
                    f"(bound {row['reads_bound']:.0f}, full {S}) parity {row['parity_rel_err']:.2e}")


def _is_builtin(entry) -> bool:
    """nsa_core as this project registers it (decode-bench runs its whole layer step, not an adapter)."""
    return (entry.name == BUILTIN and entry.impl is not None
            and entry.dist.lower().replace("_", "-") == "nsa-run")


def _impl_points(entry, o, dev, log, rows, problems) -> None:
    """Every (S, B) of one implementation through its ``decode_step`` part: a point outside its
    constraints is a SKIP row naming them; a broken adapter or a step that raises is an ERROR row
    (and a failed check: the implementation under test broke, not the stage)."""
    from nsa_core import NSAConfig
    from nsa_runner.impls import Case, adapter_code, adapter_failed, describe_failure

    impl, cfg = entry.impl, NSAConfig(**o["nsa"])
    G, h = o["groups"], o["heads_per_group"]
    if impl is not None and impl.note:
        log(f"# {entry.name}: {impl.note}")
    for S in o["S_list"]:
        for B in o["batch_list"]:
            tag = f"{entry.name} S={S} B={B}"
            if impl is None:
                why = f"{entry.name}: broken adapter: {entry.error}"
                rows.append(_unmeasured(S, B, entry.name, "ERROR", why))
                problems.append(f"{tag}: {why}")
                log(f"[ERROR] {tag}: {why}")
                continue
            case = Case(B=B, T=S, HQ=G * h, G=G, dk=o["dk"], dv=o["dv"], dtype=o["dtype"], device=dev, cfg=cfg)
            try:
                why = impl.excluded(case, "decode_step")
            except ImplError as e:  # its constraints raised: its ERROR, the others still run (round 12 B5)
                rows.append(_unmeasured(S, B, entry.name, "ERROR", str(e)))
                problems.append(f"{tag}: {e}")
                log(f"[ERROR] {tag}: {e}")
                continue
            if why is None and cfg.phi != "avg":
                why = (f"{entry.name}: phi={cfg.phi!r} has learned weights, which decode_step does not take "
                       "(its steps compress with the mean)")
            if why:
                more = impl.differences.get("decode_step")
                why += f" ({more})" if more and "does not provide" in why else ""
                rows.append(_unmeasured(S, B, entry.name, "SKIP", why))
                log(f"[SKIP] {tag}: {why}")
                continue
            try:
                with adapter_code():
                    row, probs = measure_impl(S, B, o, dev, log, impl)
            except BaseException as e:  # noqa: BLE001 - the implementation under test broke on this point
                # SystemExit / GeneratorExit / its own KeyboardInterrupt too, its text never trusted (as the
                # parity stages, round 13 B5); a real SIGINT (noted by adapter_code) stops the stage
                adapter_failed(e)
                why = f"{entry.name}: decode_step raised {describe_failure(e, 200, adapter=entry.name)}"
                rows.append(_unmeasured(S, B, entry.name, "ERROR", why))
                problems.append(f"{tag}: {why}")
                continue
            finally:
                _free(dev)
            rows.append(row)
            problems += probs
            log(f"[{row['status']}] {tag}: attn {row['ms_attn']:.4f} ms full {row['ms_full']:.4f} ms speedup "
                f"{row['speedup']:.2f}x reads {row['reads_total']} (full {S}) parity {row['parity_rel_err']:.2e} "
                f"selection {row['sel_agree']:.0%} as the reference")


def _free(dev: str) -> None:
    import gc

    gc.collect()  # scans what came after the gc.freeze() in run (the imports are frozen there)
    if dev == "cuda":
        import torch

        torch.cuda.empty_cache()


def _triton_ok() -> bool:
    return _parity.triton_available()  # any exception at triton's import: not usable (round 43 B43-3)
