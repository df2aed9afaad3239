"""Stage ``selection-map``: which key blocks each query selects (paper Fig. 2, right).

Runs ``nsa_core.functional.select_blocks`` on a SAMPLE input — seeded random q and k (seed
``--seed``, default 0; not a trained model, so which non-forced blocks win is arbitrary) — on
this run's device, and writes:

- ``sel_ranges.jsonl``: one line per sampled (t, group) of batch 0 (every ``T // 256``-th query
  and the last one), ``{"schema_version": 1, "b", "t", "group", "count", "blocks", "forced",
  "ranges"}``; ``ranges`` are the attended token ranges ``[start, end)`` (adjacent blocks merged,
  the current block cut at ``t + 1``);
- ``selection.png``: x = key block, y = query t, one panel per group; colours: selected by
  score, forced initial block 0, forced local blocks (t // l' and t // l' - 1), candidate not
  selected, future (not a candidate);
- ``selection_map.txt``: input, config and the checks.

Checks over every (b, t, g) — FAIL when one does not hold: ``block_count == min(n, t // l' + 1)``;
the first ``count`` ids are ascending, unique, in ``0..t // l'`` (causal); the rest are -1; the
forced blocks (0, t // l', t // l' - 1 when >= 0) are among them. Each implementation's ``select`` gets
a copy of the sample; one that wrote into it FAILs naming the input.
Shapes: T = 2048 with the paper config (l=32, d=16, l'=64, n=16; HQ=64, G=4, dk=192) on CUDA;
T = 512 with a small config (l=16, d=8, l'=32, n=6; HQ=4, G=2, dk=32) on CPU.
"""

from __future__ import annotations

import json
import textwrap

from nsa_runner._figures import drawing
from nsa_runner.artifacts import now_iso, write_text
from nsa_runner.impls import (
    BadOutput,
    ImplError,
    adapter_code,
    adapter_failed,
    describe_failure,
    plain_tensor,
    text_of,
    type_name,
)
from nsa_runner.stage import Option, Stage, StageResult, Status, positive_int

from . import _parity
from . import _seed as seeds

SCHEMA_VERSION = 1
# value codes of the picture
FUTURE, NOT_SELECTED, SELECTED, FORCED_INITIAL, FORCED_LOCAL = range(5)
COLORS = ("#eeeeee", "#ffffff", "#1f6feb", "#f0883e", "#2da44e")
LABELS = ("future (not a candidate)", "candidate, not selected", "selected (top-n score)",
          "forced: initial block 0", "forced: local blocks")
SHAPES = {
    "cuda": dict(T=2048, B=1, HQ=64, G=4, dk=192, cfg=dict(l=32, d=16, l_sel=64, n_sel=16, w=512)),
    "cpu": dict(T=512, B=1, HQ=4, G=2, dk=32, cfg=dict(l=16, d=8, l_sel=32, n_sel=6, w=128)),
}
MAX_LINES_T = 256  # sampled queries per group in sel_ranges.jsonl


# ---------------------------------------------------------------------------------------------
# pure helpers (tested on their own)


def forced_blocks(t: int, l_sel: int) -> list[int]:
    """Blocks query t must select: 0, t // l_sel, t // l_sel - 1 (those >= 0), ascending."""
    cur = t // l_sel
    return sorted({0, cur, *([cur - 1] if cur >= 1 else [])})


def token_ranges(blocks: list[int], t: int, l_sel: int) -> list[list[int]]:
    """Attended token ranges [start, end) of the selected blocks: adjacent blocks merged, capped at t+1."""
    out: list[list[int]] = []
    for j in sorted(blocks):
        s, e = j * l_sel, min((j + 1) * l_sel, t + 1)
        if s >= e:
            continue
        if out and out[-1][1] == s:
            out[-1][1] = e
        else:
            out.append([s, e])
    return out


def check_selection(block_idx, block_count, cfg) -> list[dict]:
    """The structural checks of the module docstring.

    block_idx [B, T, G, n] int, block_count [B, T, G] int (queries t = 0..T-1). Returns rows
    ``{"check", "ok", "violations", "detail"}``; ``detail`` names the first violating (b, t, g).
    """
    import torch

    idx = block_idx.detach().to("cpu", torch.int64)
    cnt = block_count.detach().to("cpu", torch.int64)
    B, T, G, n = idx.shape
    if tuple(cnt.shape) != (B, T, G):
        return [{"check": "shapes", "ok": False, "violations": 1,
                 "detail": f"block_count {tuple(cnt.shape)} does not match block_idx {tuple(idx.shape)}"}]
    if n != cfg.n_sel:
        return [{"check": "shapes", "ok": False, "violations": 1,
                 "detail": f"block_idx has {n} slots, n_sel is {cfg.n_sel}"}]
    t = torch.arange(T)
    cur = (t // cfg.l_sel)[None, :, None]  # [1, T, 1]
    want = torch.clamp(t // cfg.l_sel + 1, max=n)[None, :, None]
    slot = torch.arange(n)
    valid = slot[None, None, None, :] < cnt[..., None]  # [B, T, G, n]
    live = torch.where(valid, idx, torch.full_like(idx, -1))

    def member(j):  # [B, T, G] bool: block j (broadcast) among the live ids
        return ((live == j[..., None]) & valid).any(-1)

    rows = []

    def add(name: str, bad, what: str) -> None:
        nbad = int(bad.sum())
        detail = "holds for every (b, t, g)"
        if nbad:
            b, tt, g = (int(x) for x in bad.nonzero()[0][:3])
            detail = f"{nbad} violation(s); first at b={b} t={tt} g={g}: {what.format(b=b, t=tt, g=g)} " \
                     f"(ids {idx[b, tt, g].tolist()}, count {int(cnt[b, tt, g])})"
        rows.append({"check": name, "ok": nbad == 0, "violations": nbad, "detail": detail})

    add("count == min(n, t // l' + 1)", cnt != want, "count differs from min(n, t // l' + 1)")
    add("padding is -1 after count", (~valid & (idx != -1)).any(-1), "a slot after count is not -1")
    add("ids causal (0 <= id <= t // l')", (valid & ((idx < 0) | (idx > cur[..., None]))).any(-1),
        "an id is negative or a future block")
    asc = (live[..., 1:] > live[..., :-1]) | ~valid[..., 1:]
    add("ids ascending and unique", (~asc).any(-1), "ids not strictly ascending")
    zero = torch.zeros_like(cur)
    add("forced initial block 0 present", ~member(zero.expand(B, T, G)), "block 0 missing")
    add("forced local block t // l' present", ~member(cur.expand(B, T, G)), "block t // l' missing")
    prev = (cur - 1).expand(B, T, G)
    add("forced local block t // l' - 1 present", (prev >= 0) & ~member(prev), "block t // l' - 1 missing")
    return rows


def stored_mean(dtype):
    """phi for a float64 reference of a ``dtype`` pipeline: the mean of each block in float64,
    rounded once to ``dtype`` (the compressed keys/values an implementation holds in its working
    dtype; the gradient passes straight through the rounding). Without it a bf16 implementation
    that compresses exactly right still picks other blocks than a float64 reference on ~0.5% of
    rows: bf16 rounding of the compressed keys moves scores by ~1e-3, far over the 1e-5 near-tie
    band of DESIGN §7 (seen on the H100: nsa_core and fla identical, both "wrong")."""
    def phi(blocks):
        x = blocks.mean(-2)
        return x + (x.to(dtype).to(x.dtype) - x).detach()
    return phi


def against_reference(block_idx, block_count, q, k, cfg, *, stored_dtype=None) -> dict:
    """Does a selection equal the float64 reference's (``select_blocks(backend="reference")`` on the
    same q, k)? A differing (b, t, g) row is accepted only as a near-tie: the reference scores of the
    two block sets within 1e-5 relative (DESIGN §7), and near-ties at most 0.1% of rows (at least 1).
    ``stored_dtype``: the reference's compressed keys are rounded once to it (:func:`stored_mean`).
    Returns ``{"ok", "rows", "differ", "near_ties", "detail"}``."""
    import torch

    from nsa_core import functional as F

    q64, k64 = q.detach().double(), k.detach().double()
    phi = stored_mean(stored_dtype) if stored_dtype is not None else None
    ref_idx, ref_cnt = F.select_blocks(q64, k64, cfg, phi=phi, backend="reference")
    nb = cfg.num_sel_blocks(q.shape[1])

    def member(ix, ct):  # [B, T, G, NB] bool: block j chosen
        ix, ct = ix.to(ref_idx.device).long(), ct.to(ref_idx.device).long()
        live = (torch.arange(ix.shape[-1], device=ix.device) < ct[..., None]) & (ix >= 0) & (ix < nb)
        m = torch.zeros(*ix.shape[:-1], nb + 1, dtype=torch.bool, device=ix.device)
        m.scatter_(-1, torch.where(live, ix, torch.full_like(ix, nb)), True)
        return m[..., :nb]

    a, b = member(block_idx, block_count), member(ref_idx, ref_cnt)
    differ = (a != b).any(-1)  # [B, T, G]
    rows, n_diff = differ.numel(), int(differ.sum())
    near = torch.zeros_like(differ)
    if n_diff:
        scores = F.block_scores(q64, F.compress(k64, cfg, phi), q.shape[1], cfg)  # [B, T, G, NB]
        sa, sb = (scores * a).sum(-1), (scores * b).sum(-1)
        near = (sa - sb).abs() <= 1e-5 * sb.abs().clamp_min(1e-30)
    ties = int((near & differ).sum())
    far = n_diff - ties
    ok = far == 0 and ties <= max(1, rows // 1000)
    detail = f"{rows - n_diff}/{rows} (t, group) rows identical, {ties} near-tie(s) accepted, {far} differ"
    if far:
        bb, tt, gg = (int(x) for x in (differ & ~near).nonzero()[0][:3])
        detail += (f"; first at b={bb} t={tt} g={gg}: {block_idx[bb, tt, gg].tolist()} vs reference "
                   f"{ref_idx[bb, tt, gg].tolist()}")
    elif not ok:
        detail += " (near-ties over 0.1% of rows)"
    return {"ok": ok, "rows": rows, "differ": n_diff, "near_ties": ties, "detail": detail}


def selection_image(block_idx, block_count, cfg, b: int = 0, g: int = 0):
    """uint8 [T, NB] picture codes (FUTURE, NOT_SELECTED, SELECTED, FORCED_INITIAL, FORCED_LOCAL)."""
    import numpy as np

    idx = block_idx[b, :, g].detach().cpu().numpy()
    cnt = block_count[b, :, g].detach().cpu().numpy()
    T = idx.shape[0]
    NB = cfg.num_sel_blocks(T)
    t = np.arange(T)
    cur = t // cfg.l_sel
    j = np.arange(NB)
    img = np.where(j[None, :] <= cur[:, None], NOT_SELECTED, FUTURE).astype(np.uint8)
    for i in range(idx.shape[1]):
        rows = np.nonzero(i < cnt)[0]
        cols = idx[rows, i]
        ok = (cols >= 0) & (cols < NB)
        img[rows[ok], cols[ok]] = SELECTED
    sel = img == SELECTED
    img[sel & (j[None, :] == 0)] = FORCED_INITIAL
    local = (j[None, :] == cur[:, None]) | (j[None, :] == cur[:, None] - 1)
    img[sel & local & (j[None, :] != 0)] = FORCED_LOCAL
    return img


@drawing()  # matplotlib's own settings, whatever an adapter left in rcParams (round 23 B23-4)
def plot(images: list, cfg, title: str, path) -> None:
    """selection.png: one panel per group."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    from nsa_runner.artifacts import write_bytes

    G = len(images)
    fig = Figure(figsize=(2.2 + 2.6 * G, 7.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, G, squeeze=False)[0]
    cmap = ListedColormap(COLORS)
    for g, (ax, img) in enumerate(zip(axes, images, strict=True)):
        T, NB = img.shape
        ax.imshow(img, cmap=cmap, vmin=-0.5, vmax=len(COLORS) - 0.5, aspect="auto", interpolation="nearest",
                  extent=(-0.5, NB - 0.5, T - 0.5, -0.5))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"KV group {g}", fontsize=10)
        ax.set_xlabel(f"key block (l' = {cfg.l_sel} tokens)")
        if g == 0:
            ax.set_ylabel("query position t")
    fig.legend(handles=[Patch(facecolor=c, edgecolor="#888", label=lab) for c, lab in zip(COLORS, LABELS, strict=True)],
               loc="lower center", ncol=3, fontsize=8, frameon=False)
    width = max(40, int(12 * (2.2 + 2.6 * G)))  # characters per line at 9 pt
    fig.suptitle("\n".join(textwrap.fill(part, width) for part in title.split("\n")), fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 0.93))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    write_bytes(path, buf.getvalue())


def jsonl_lines(block_idx, block_count, cfg, b: int = 0) -> list[str]:
    """sel_ranges.jsonl lines for the sampled queries of batch ``b`` (every group)."""
    idx = block_idx[b].detach().cpu().tolist()
    cnt = block_count[b].detach().cpu().tolist()
    T, G = len(idx), len(idx[0]) if idx else 0
    step = max(1, T // MAX_LINES_T)
    ts = sorted(set(range(0, T, step)) | ({T - 1} if T else set()))
    lines = []
    for t in ts:
        for g in range(G):
            blocks = idx[t][g][: cnt[t][g]]
            lines.append(json.dumps({"schema_version": SCHEMA_VERSION, "b": b, "t": t, "group": g,
                                     "count": cnt[t][g], "blocks": blocks, "forced": forced_blocks(t, cfg.l_sel),
                                     "ranges": token_ranges(blocks, t, cfg.l_sel)}))
    return lines


# ---------------------------------------------------------------------------------------------


def sample(device: str, T: int, seed: int):
    """The seeded sample (q, k_cmp, cfg) every implementation's select runs on (the same in an adapter's process)."""
    import torch

    from nsa_core import NSAConfig

    shape = SHAPES["cuda" if device == "cuda" else "cpu"]
    cfg = NSAConfig(**shape["cfg"])
    B, HQ, G, dk = shape["B"], shape["HQ"], shape["G"], shape["dk"]
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, T, HQ, dk, generator=gen).to(device)
    k = torch.randn(B, T, G, dk, generator=gen).to(device)
    return q, k, cfg


def select_in_host(job: dict, out_path: str) -> None:
    """(In an adapter's own process, ``_impl_host``.) ``SelectionMap._per_impl`` of the adapter ``job["name"]`` on the
    sample, saved to ``out_path`` as tensors and plain values (read back with ``torch.load(weights_only=True)``)."""
    import torch

    q, k, cfg = sample(job["device"], int(job["T"]), int(job["seed"]))
    runs, others, skips, wrote = SelectionMap._per_impl([_parity.load_impl(job["name"])], q, k, cfg, job["device"])
    torch.save({"runs": [[str(n), i.detach().cpu().contiguous(), c.detach().cpu().contiguous()] for n, i, c in runs],
                "others": [[str(n), str(w), bool(b)] for n, w, b in others],
                "skips": [[str(n), str(w)] for n, w in skips], "wrote": [[str(n), str(w)] for n, w in wrote]},
               out_path + ".part")
    import os

    os.replace(out_path + ".part", out_path)


def isolated_select(name: str, device: str, T: int, seed: int, want_idx: tuple):
    """``_per_impl`` of a plugin's adapter in a process of its own (``_parity.in_own_process``): what its select
    returned comes back as plain tensors and texts, checked; a process that ends without them is that
    implementation's failure, named."""
    import torch

    def read(path: str):
        data = torch.load(path, weights_only=True)  # tensors and plain values only: nothing of the adapter runs
        lists = ("runs", "others", "skips", "wrote")
        if not (isinstance(data, dict) and all(isinstance(data.get(x), list) for x in lists)):
            raise ValueError("not the lists of a select's outcome")
        integer = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
        runs = [(n, i.to(device), c.to(device)) for n, i, c in data["runs"]
                if n == name and isinstance(i, torch.Tensor) and isinstance(c, torch.Tensor)
                and i.dtype in integer and c.dtype in integer]
        for _, i, c in runs:  # (round 48 B48b-2: wrong shapes from its process took the whole stage down)
            if tuple(i.shape) != want_idx or tuple(c.shape) != want_idx[:3]:
                raise ValueError(f"select gave shapes {tuple(i.shape)} / {tuple(c.shape)}, want {want_idx} / "
                                 f"{want_idx[:3]}")
        others = [(n, w, b) for n, w, b in data["others"] if n == name and isinstance(w, str)]
        skips = [(n, w) for n, w in data["skips"] if n == name and isinstance(w, str)]
        wrote = [(n, w) for n, w in data["wrote"] if n == name and isinstance(w, str)]
        if len(runs) + len(others) + len(skips) != 1:
            raise ValueError("not one outcome of its select")
        return runs, others, skips, wrote

    job = {"kind": "select", "name": name, "device": device, "T": T, "seed": seed}
    got, problem = _parity.in_own_process(job, read)
    if got is None:
        return [], [(name, f"{name}: {problem}", True)], [], []
    return got


class SelectionMap(Stage):
    name = "selection-map"
    order = 25
    requires = ()
    description = "selected key blocks per query and group on a seeded sample (sel_ranges.jsonl, selection.png)"
    options = (
        Option("--T", positive_int, default=None, help="sequence length (default 2048 on CUDA, 512 on CPU)"),
        seeds.option(0, "the random sample input"),
        _parity.impl_option(),
    )
    timeout_s = 600.0

    def run(self, ctx) -> StageResult:
        T = int(ctx.options.get("T") or SHAPES["cuda" if ctx.device == "cuda" else "cpu"]["T"])
        seed = int(ctx.options.get("seed") or 0)
        q, k, cfg = sample(ctx.device, T, seed)
        B, _, HQ, dk = q.shape
        G = k.shape[2]
        what = (f"sample input: seeded random q, k (seed {seed}), B={B} T={T} HQ={HQ} G={G} dk={dk}, fp32, "
                f"device {ctx.device}; cfg l={cfg.l} d={cfg.d} l'={cfg.l_sel} n={cfg.n_sel}")
        print(what, flush=True)
        impl_text = ctx.options.get("impl")
        replay = seeds.announce(ctx, self.name, seed, T=ctx.options.get("T"),
                                impl=impl_text if impl_text not in (None, "nsa_core") else None)
        runs, others, skips, wrote, names = [], [], [], [], []
        for name in _parity.impl_names(ctx):
            if _parity.in_stage_process(name):  # nsa-run's own library, in this process
                got = self._per_impl([_parity.load_impl(name)], q, k, cfg, ctx.device)
            else:  # a plugin's adapter (fla's too) in a process of its own (as in triton-fwd: round 47)
                got = isolated_select(name, ctx.device, T, seed, (B, T, G, cfg.n_sel))
            for have, more in zip((runs, others, skips, wrote), got, strict=True):
                have += more
            names.append(name)
        for name, why in skips:
            print(f"[SKIP] {name}: {why}", flush=True)
        if not runs:
            failed = [f"{n}: {why}" for n, why in wrote] + [f"{n}: {why}" for n, why, broken in others if broken]
            if failed:
                return StageResult(Status.FAIL, "; ".join(failed)[:1000])
            return StageResult(Status.SKIP, "no implementation's select runs on this sample: "
                               + "; ".join(w for _, w in skips)[:800])
        primary, block_idx, block_count = runs[0]
        checks = check_selection(block_idx, block_count, cfg)
        if primary != "nsa_core" or len(names) > 1:
            checks = [{**c, "check": f"{primary}: {c['check']}"} for c in checks]
        for name, idx_, cnt_ in runs[1:]:
            checks += [{**c, "check": f"{name}: {c['check']}"} for c in check_selection(idx_, cnt_, cfg)]
        for name, _, _ in runs:
            if name == "nsa_core":
                continue  # nsa_core's own select is the library under test, its reference is its oracle
            idx_, cnt_ = next((i, c_) for n, i, c_ in runs if n == name)
            d = against_reference(idx_, cnt_, q, k, cfg)
            checks.append({"check": f"{name}: same blocks as the float64 reference", "ok": d["ok"],
                           "violations": d["differ"] - d["near_ties"], "detail": d["detail"]})
        checks += [{"check": f"{n}: select", "ok": False, "violations": 1, "detail": why} for n, why, _ in others]
        # first: a select that wrote into the sample is that implementation's FAIL whatever it returned (B5)
        checks = [{"check": f"{n}: select inputs", "ok": False, "violations": 1, "detail": why}
                  for n, why in wrote] + checks
        for c in checks:
            print(f"[{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}", flush=True)
        lines = jsonl_lines(block_idx, block_count, cfg)
        write_text(ctx.dir / "sel_ranges.jsonl", "\n".join(lines) + "\n")
        images = [selection_image(block_idx, block_count, cfg, 0, g) for g in range(G)]
        plot(images, cfg, f"NSA block selection per query (Fig. 2 right) — {ctx.run_id}\n{what}",
             ctx.dir / "selection.png")
        bad = [c for c in checks if not c["ok"]]
        text = [f"nsa-run selection-map  run {ctx.run_id}  {now_iso()}", what, f"replay: {replay}",
                f"implementations: {', '.join(names)}; picture and sel_ranges.jsonl: {primary}",
                *[f"  [SKIP] {n}: {why}" for n, why in skips], "",
                f"sel_ranges.jsonl: {len(lines)} lines (batch 0, every {max(1, T // MAX_LINES_T)}-th query, "
                f"all {G} groups)", "", "checks:"]
        text += [f"  [{'ok' if c['ok'] else 'FAIL'}] {c['check']}: {c['detail']}" for c in checks]
        write_text(ctx.dir / "selection_map.txt", "\n".join(text) + "\n")
        files = ["sel_ranges.jsonl", "selection.png", "selection_map.txt"]
        metrics = {"T": T, "seed": seed, "cfg": cfg.to_dict(), "groups": G, "lines": len(lines),
                   "checks": len(checks), "failed": len(bad),
                   "mean_count": round(float(block_count.float().mean()), 3),
                   "impls": names, "skipped": [f"{n}: {w}" for n, w in skips]}
        skip_note = ("; not run: " + "; ".join(w for _, w in skips))[:600] if skips else ""
        if bad:
            return StageResult(Status.FAIL, ("; ".join(f"{c['check']}: {c['detail']}" for c in bad) + skip_note)[:1000],
                               files=files, metrics=metrics, hint=f"replay: {replay}")
        ran = "" if [n for n, _, _ in runs] == ["nsa_core"] else f" of {', '.join(n for n, _, _ in runs)}"
        return StageResult(Status.PASS, f"{len(checks)} selection checks{ran} hold over {B * T * G} (t, group) rows "
                                        f"(T={T}, n={cfg.n_sel}, l'={cfg.l_sel}; seeded sample, seed {seed})"
                                        + skip_note, files=files, metrics=metrics)

    @staticmethod
    def _per_impl(entries, q, k, cfg, device):
        """Run each implementation's ``select`` on the sample: (runs [(name, idx, cnt)], failures
        [(name, why, broken)], skips [(name, why)], wrote [(name, why)]). A part that raises or returns the
        wrong shapes is a failure naming it; a sample outside its constraints is a skip naming the constraint.
        Each part gets copies of q, k of its own (the reference, the next implementation and the picture read
        the sample itself); one that wrote into them is in ``wrote`` naming the inputs (round 16 B5)."""
        import torch

        from nsa_runner.impls import Case

        B, T, HQ, dk = q.shape
        G = k.shape[2]
        case = Case(B=B, T=T, HQ=HQ, G=G, dk=dk, dv=dk, dtype="fp32", device=device, cfg=cfg)
        runs, others, skips, wrote = [], [], [], []
        for e in entries:
            if e.impl is None:
                others.append((e.name, f"broken adapter: {e.error}", True))
                continue
            try:
                why = e.impl.excluded(case, "select")
            except ImplError as ex:  # its constraints raised: a failure naming it (round 12 B5)
                others.append((e.name, str(ex), True))
                continue
            if why:
                skips.append((e.name, why))
                continue
            print(f"# {e.name}: select ...", flush=True)  # a TIMEOUT names what ran last (round 18 B U-c)
            try:  # any BaseException of its code is its failure (round 13 B5); a real SIGINT stops the stage
                with adapter_code():
                    mine = _parity.handed(q, k)
                    got = e.impl.parts["select"](*mine, cfg)
                    names = _parity.written(zip(("q", "k_cmp"), (q, k), mine, strict=True))
                    if names:
                        wrote.append((e.name, _parity.written_text(f"{e.name}'s select", names)))
                    idx, cnt = got if type(got) in (tuple, list) and len(got) == 2 else (got, None)
                    if not (isinstance(idx, torch.Tensor) and isinstance(cnt, torch.Tensor)):
                        others.append((e.name, f"select returned {type_name(got)}, want (block_idx, block_count) "
                                               "tensors", True))
                        continue
                    # plain tensors made here, in the guard: what the checks below use runs none of an adapter's
                    # Tensor subclass (round 15 B-R3: its __torch_function__ ended the stage, nsa_core's lost)
                    idx = plain_tensor(idx, "select's block_idx", integer=True)
                    cnt = plain_tensor(cnt, "select's block_count", integer=True)
            except BadOutput as ex:
                others.append((e.name, f"select returned a wrong value: {text_of(ex, 300)}", True))
                continue
            except BaseException as ex:  # noqa: BLE001 - the code under test broke: a failed check
                adapter_failed(ex)
                others.append((e.name, f"select raised {describe_failure(ex, adapter=e.name)}", True))
                continue
            if tuple(idx.shape) != (B, T, G, cfg.n_sel) or tuple(cnt.shape) != (B, T, G):
                others.append((e.name, f"select returned shapes {tuple(idx.shape)} / {tuple(cnt.shape)}, want "
                                       f"{(B, T, G, cfg.n_sel)} / {(B, T, G)}", True))
                continue
            runs.append((e.name, idx, cnt))
        return runs, others, skips, wrote
