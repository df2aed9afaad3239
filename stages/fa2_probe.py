"""Stage ``fa2-probe``: which flash kernels exist and work here, do the flash paths of the
compressed and sliding branches match the reference, and from which length do they pay (DESIGN §5).

1. Probe (``nsa_runner.measure.flash_probe``): flash_attn (FA-2), flash_attn_interface (FA-3),
   flash_attn.cute (FA-4), torch ``varlen_attn``, SDPA flash / cuDNN / memory-efficient —
   present? version? a real tiny call through nsa_core's adapter works? and the reason + install
   command when not. Each flash-attn adapter is labelled GPU-verified or not
   (``adapters.GPU_VERIFIED``): FA-2 and FA-4 are (this stage on an H100); FA-3 is not.
2. Parity (fa2_varlen.csv): every available path, both branches, fp16 + bf16, forward and
   backward (dq, dk, dv) against the float64 reference over the case matrix
   (``_flash_bench.parity_cases``: seven cases; the quick profile three, and cuDNN's rows on one of
   them, h=16 / head dim 128, bf16 only, as cuDNN builds a graph per new configuration, 2.4 s per row
   on the H100). Any row over tolerance -> FAIL.
3. Bench (fa2_bench.csv): paths whose parity passed vs ``backend="sdpa"`` over ``--S-list``;
   (full profile: 1K, 4K, 16K, 64K; quick: 4K, cuDNN not timed; the selection-score recompute rows only with
   ``--score-rows yes``); the smallest S from which each path stays >= 1.2x faster (forward and forward+backward) is
   written as routing thresholds: fa2_thresholds.json in the run folder, merged into the
   routing thresholds file (docs/routing.md; ``--thresholds none`` to skip that).

No CUDA -> SKIP with the reason and the install hint (the probe table is still written).
Wall time per part (probe, parity, bench) is in fa2_probe.json ``wall_s`` and fa2_probe.txt; each
parity row has ``wall_s`` (its fwd+bwd, a JIT compile included: FA-4 compiles per head dims / GQA
ratio / mask kind / dtype), each bench row ``bench_s`` (the time spent timing it).
"""

from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from nsa_runner.artifacts import write_csv, write_json, write_text
from nsa_runner.stage import Option, Stage, StageResult, Status, int_list

from . import _seed as seeds

SCHEMA_VERSION = 1
QUICK_S = [4096]  # a smoke check: every path timed once (a quick run never replaces a full run's routing)
# every 4x from 1K to 64K (was every 2x: 7 lengths). Each length costs the bench a fresh cuDNN
# graph per branch and pass and ~100 ms of timing per (path, pass) at least; the routing ladder
# switches paths only at measured lengths, so it keeps one point per 4x (issue 13: the warm full
# oneshot's budget). --S-list gives any other grid.
FULL_S = [1024, 4096, 16384, 65536]
QUICK_APART_CASE = 1  # of parity_cases("quick"): h=16, T % d != 0, B=2, head dim 128
HINT = ("run on a CUDA GPU (sm_80+) with a CUDA build of torch (the torch-bundled varlen / SDPA flash "
        "paths need nothing else); for FA-2: pip install flash-attn --no-build-isolation")


def _fmt_probe(rows: list[dict]) -> str:
    lines = [f"{'kernel':30} {'present':8} {'version':16} {'works':6} reason"]
    for r in rows:
        works = {True: "yes", False: "NO", None: "-"}[r["works"]]
        lines.append(f"{r['name']:30} {'yes' if r['present'] else 'NO':8} {str(r['version'] or '-'):16} "
                     f"{works:6} {r['reason']}")
        if r.get("gpu_verified"):
            lines.append(f"{'':30} nsa-run adapter: {r['gpu_verified']}")
    return "\n".join(lines)


def _table(df, cols) -> str:
    cols = [c for c in cols if c in df.columns]
    return df[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}") if len(df) else "(none)"


def _same_machine(old: dict | None, entry: dict) -> dict | None:
    """The entry of ``old`` (a thresholds document) that ``entry`` would replace (same GPU,
    capability and torch: ``routing.merge_thresholds``), or None."""
    key = (entry.get("gpu"), entry.get("capability"), entry.get("torch"))
    for e in (old or {}).get("entries", []):
        if (e.get("gpu"), e.get("capability"), e.get("torch")) == key:
            return e
    return None


def _longest(e: dict) -> int:
    """The longest S an entry measured (its S_measured, else its paths' max_measured)."""
    S = [s for s in e.get("S_measured") or [] if isinstance(s, int) and not isinstance(s, bool)]
    S += [r.get("max_measured") for ps in (e.get("branches") or {}).values() if isinstance(ps, dict)
          for r in ps.values() if isinstance(r, dict) and isinstance(r.get("max_measured"), int)]
    return max(S, default=0)


def _longer_entry(old: dict | None, entry: dict) -> int | None:
    """The longest S of the entry ``entry`` would replace, when it measured longer than ``entry``
    (a quick run's 1K..4K must not replace a full run's 1K..64K: routing would then route 64K by
    what won at 4K); else None."""
    prev = _same_machine(old, entry)
    if prev is None:
        return None
    n = _longest(prev)
    return n if n > _longest(entry) else None


def _longer_run(old: dict | None, entry: dict) -> str:
    prev = _same_machine(old, entry) or {}
    return f"{prev.get('source_run', '?')}, {prev.get('measured', '?')}"


class Fa2Probe(Stage):
    name = "fa2-probe"
    preload_flash = True  # calls the flash paths: its spare imports FA-4's CUDA-free part
    order = 50
    requires = ()  # decides itself: a CPU run must show SKIP with the reason, never PASS
    # keep the "not GPU-verified:" list equal to nsa_core.flash.adapters.GPU_VERIFIED (a test checks)
    description = ("flash kernels present/working; cmp/win flash-path parity vs fp64; speed vs SDPA -> thresholds. "
                   "flash-attn adapters not GPU-verified: FA-3 (no test runs it); FA-2 2.8.3 and FA-4 4.0.0b36 "
                   "GPU-verified on an H100")
    timeout_s = 1200.0
    options = (
        Option("--S-list", int_list, None, "bench lengths, e.g. 1k,4k,16k (default: quick 4K; full 1K..64K)"),
        Option("--thresholds", str, "default",
               "merge measured thresholds into: 'default' (the per-user file, see docs/routing.md), a path, or "
               "'none'; an entry of the same GPU and torch measured over longer S is kept, not replaced"),
        Option("--bench", str, "yes", "run the speed measurement", choices=("yes", "no")),
        seeds.option(0, "the random parity inputs (a base)"),
        Option("--score-rows", str, "no", "also time torch's selection-score recompute beside the cmp branch "
               "(a settled design question; two slow fp32 passes per S)", choices=("yes", "no")),
    )

    def run(self, ctx) -> StageResult:
        import torch

        from nsa_core.flash import adapters as flash
        from nsa_runner.measure import flash_probe as _flash_probe

        d = Path(ctx.dir)
        opts = dict(ctx.options or {})
        device = str(ctx.device)
        t0 = time.perf_counter()
        probe = _flash_probe.probe(device)
        wall = {"probe": round(time.perf_counter() - t0, 3)}
        doc = {"schema_version": SCHEMA_VERSION, "device": device, "torch": torch.__version__,
               "cuda": torch.version.cuda, "probe": probe, "wall_s": wall}
        txt = [f"fa2-probe on {device} (torch {torch.__version__}, CUDA {torch.version.cuda})", "",
               _fmt_probe(probe), ""]
        files = ["fa2_probe.txt", "fa2_probe.json"]

        def finish(result: StageResult) -> StageResult:
            doc["status"], doc["reason"] = result.status.value, result.reason
            wall["total"] = round(time.perf_counter() - t0, 3)
            txt.append("wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in wall.items()))
            txt.append(f"{result.status.value}: {result.reason}")
            if result.hint:
                txt.append(f"hint: {result.hint}")
            write_json(d / "fa2_probe.json", doc)
            write_text(d / "fa2_probe.txt", "\n".join(txt) + "\n")
            result.files = files
            return result

        if not device.startswith("cuda") or not torch.cuda.is_available():
            return finish(StageResult(Status.SKIP, f"no flash backend on device {device}: flash kernels "
                                      "(flash-attn, torch varlen / SDPA flash) run on CUDA GPUs only", hint=HINT))
        avail = {p: st for p, st in flash.available_paths("cuda").items() if st["present"]}
        if not avail:
            why = "; ".join(f"{p}: {st['reason']}" for p, st in flash.available_paths("cuda").items())
            return finish(StageResult(Status.SKIP, f"no flash path usable on this GPU ({why})", hint=HINT))
        paths = {b: [p for p, st in avail.items() if b in st["branches"]] for b in ("cmp", "win")}
        txt.append(f"flash paths tested: cmp {paths['cmp']}, win {paths['win']}")
        return finish(self._measure(ctx, d, opts, device, paths, doc, txt, files))

    def _measure(self, ctx, d, opts, device, paths, doc, txt, files) -> StageResult:
        import pandas as pd
        import torch

        from nsa_core.config import NSAConfig
        from nsa_runner.measure import flash_bench as _flash_bench

        cfg = NSAConfig()
        cases = _flash_bench.parity_cases("full" if ctx.profile == "full" else "quick")
        seed = int(opts.get("seed") or 0)
        replay = seeds.announce(ctx, self.name, seed, bench="no")
        doc["seed"], doc["replay"] = seed, replay
        txt.append(f"seed {seed}; replay the parity with: {replay}")
        t0 = time.perf_counter()
        # cuDNN's rows (a graph built per new configuration in each process) in child processes
        # beside this one's: the same rows, inputs and order (flash_bench.parity_apart)
        # quick: cuDNN's rows on one case (h=16, head dim 128) in bf16, in this process (2.4 s per row on
        # the H100: a graph built per configuration)
        one, full = min(QUICK_APART_CASE, len(cases) - 1), ctx.profile == "full"
        rows, pinfo = _flash_bench.parity_apart(device, paths, [torch.float16, torch.bfloat16], cases, cfg,
                                                seed=seed, log=lambda m: print(m, flush=True),
                                                apart_cases=None if full else [one],
                                                apart_dtypes=None if full else [torch.bfloat16])
        doc.setdefault("wall_s", {})["parity"] = round(time.perf_counter() - t0, 3)
        doc["parity_children"] = pinfo
        if "apart_cases" in pinfo:
            txt.append(f"parity (quick profile): the {', '.join(pinfo['apart'])} rows on case "
                       f"{cases[one].id('<dtype>', cfg.w)} in {', '.join(pinfo.get('apart_dtypes', ['fp16', 'bf16']))} "
                       "only (the full profile: every case, fp16 and bf16)")
        if pinfo["children"]:
            txt.append(f"parity: the {', '.join(pinfo['apart'])} rows ran in {pinfo['children']} child processes "
                       "beside this one" + "".join(f"; {w} (its rows were computed here)" for w in pinfo["fallback"]))
        par = pd.DataFrame(rows)
        par["seed"] = seed
        write_csv(d / "fa2_varlen.csv", par)
        files.append("fa2_varlen.csv")
        n_fail = int((par["status"] == "FAIL").sum())
        n_pass = int((par["status"] == "PASS").sum())
        doc["parity"] = {"pass": n_pass, "fail": n_fail, "na": int((par["status"] == "N/A").sum()),
                         "cases": [c.id("<dtype>", cfg.w) + f"  ({c.why})" for c in cases]}
        txt += ["", f"parity (fa2_varlen.csv): {n_pass} PASS, {n_fail} FAIL, "
                    f"{doc['parity']['na']} N/A; fwd + bwd vs float64 reference, cfg {cfg.to_dict()}",
                _table(par, ["case", "branch", "path", "status", "rel_o", "rel_dq", "rel_dk", "rel_dv", "tol",
                             "note"])]
        failed = {(r["branch"], r["path"]) for r in rows if r["status"] == "FAIL"}
        good = {b: [p for p in ps if (b, p) not in failed] for b, ps in paths.items()}
        reason = f"{n_pass} parity rows passed over {len(cases)} cases x fp16/bf16 x paths {paths}"
        if n_fail:
            bad = par[par["status"] == "FAIL"]
            reason = f"{n_fail} parity rows FAILED: " + ", ".join(
                f"{r.case}/{r.branch}/{r.path}" for r in bad.head(5).itertuples()) + (" ..." if n_fail > 5 else "")
        metrics = {"parity_pass": n_pass, "parity_fail": n_fail}
        if opts.get("bench", "yes") == "yes" and any(good.values()):
            S_list = opts.get("S_list") or (FULL_S if ctx.profile == "full" else QUICK_S)
            timed = good
            if ctx.profile != "full":  # a smoke check: no cuDNN graph builds for the bench (2.3 s of 7.3 on the H100)
                timed = {b: [p for p in ps if p not in _flash_bench.BUILDS_PER_PROCESS] for b, ps in good.items()}
                left = sorted({p for b, ps in good.items() for p in ps if p not in timed[b]})
                if left:
                    txt.append(f"bench (quick profile): {', '.join(left)} not timed (its parity ran; the full "
                               "profile times it)")
            if any(timed.values()):
                reason += "; " + self._bench(ctx, d, device, timed, S_list, doc, txt, files, metrics, opts, cfg)
        probe = {r["name"]: r for r in doc["probe"]}
        pk = [n for n in ("flash_attn (FA-2)", "flash_attn_interface (FA-3)", "flash_attn.cute (FA-4)")
              if probe.get(n, {}).get("present")]
        if not pk:
            reason += "; flash_attn (FA-2) NOT installed: only torch-bundled paths were tested"
        else:
            reason += "; flash-attn packages tested: " + ", ".join(pk) + "".join(
                "" if n in pk else f"; {n} NOT installed" for n in ("flash_attn (FA-2)",))
        return StageResult(Status.FAIL if n_fail else Status.PASS, reason, metrics=metrics)

    def _bench(self, ctx, d, device, good, S_list, doc, txt, files, metrics, opts, cfg) -> str:
        import pandas as pd
        import torch

        from nsa_core import routing
        from nsa_runner.measure import flash_bench as _flash_bench

        t0 = time.perf_counter()
        rows, timer = _flash_bench.bench(device, good, list(S_list), cfg,
                                         score_rows=opts.get("score_rows", "no") == "yes")
        doc.setdefault("wall_s", {})["bench"] = round(time.perf_counter() - t0, 3)
        thr = _flash_bench.thresholds(rows)
        if not thr:  # every path ran out of memory (or none was timed): nothing to recommend
            write_csv(d / "fa2_bench.csv", pd.DataFrame(rows))
            files.append("fa2_bench.csv")
            txt += ["", "bench: no flash path could be timed (see fa2_bench.csv notes); no thresholds written"]
            return "bench: no flash path timed, no thresholds"
        for r in rows:
            rec = thr.get(r["branch"], {}).get(r["path"])
            r["recommended_min_len"] = ("never" if rec["min_len"] is None else rec["min_len"]) if rec else ""
        bench = pd.DataFrame(rows)
        write_csv(d / "fa2_bench.csv", bench)
        files.append("fa2_bench.csv")
        cap = torch.cuda.get_device_capability()
        entry = {"gpu": torch.cuda.get_device_name(), "capability": f"{cap[0]}.{cap[1]}", "torch": torch.__version__,
                 "measured": _dt.date.today().isoformat(), "source_run": str(ctx.run_id or "unknown"),
                 "speedup_required": _flash_bench.SPEEDUP, "S_measured": list(S_list),
                 "shape": {k: rows[0][k] for k in ("B", "HQ", "G", "D", "dtype")}, "cfg": cfg.to_dict(),
                 "timer": timer, "branches": thr}
        tdoc = routing.merge_thresholds(None, entry)
        write_json(d / "fa2_thresholds.json", tdoc)
        files.append("fa2_thresholds.json")
        doc["bench"] = {"timer": timer, "S_list": list(S_list), "thresholds": thr}
        txt += ["", f"bench (fa2_bench.csv): median ms ({timer}), shape {entry['shape']}, speedup = sdpa / path",
                _table(bench, ["branch", "path", "S", "fwd_ms", "fwdbwd_ms", "speedup_fwd", "speedup_fwdbwd",
                               "note"]),
                "", f"recommended thresholds (smallest S from which a path stays >= {_flash_bench.SPEEDUP}x "
                    "faster than sdpa, fwd and fwd+bwd; 'never' = not in the measured range):"]
        for b, ps in thr.items():
            for p, rec in ps.items():
                ml = "never" if rec["min_len"] is None else rec["min_len"]
                txt.append(f"  {b:4} {p:16} min_len={ml}  (speedup at S={rec['max_measured']}: "
                           f"{rec['speedup_at_max']}x)")
        target = opts.get("thresholds") or "default"
        note = ""
        if target != "none":
            tpath = routing.DEFAULT_THRESHOLDS if target == "default" else Path(target)
            try:
                old = routing.load_thresholds(tpath) if tpath.exists() else None
                longer = _longer_entry(old, entry)
                if longer is not None:  # a quick run must not shrink what a full run measured
                    doc["thresholds_file_kept"] = str(tpath)
                    note = (f"thresholds NOT merged: {tpath} holds an entry for this GPU and torch measured up to "
                            f"S={longer} (run {_longer_run(old, entry)}), longer than this run's S up to "
                            f"{max(S_list)}; routing keeps it (this run's are in fa2_thresholds.json; remove "
                            "that entry or the file to replace it)")
                else:
                    write_json(tpath, routing.merge_thresholds(old, entry))
                    doc["thresholds_file"] = str(tpath)
                    note = f"thresholds merged into {tpath}"
            except (ValueError, OSError) as e:  # a bad existing file is left as it is, and said so
                doc["thresholds_file_error"] = str(e)
                note = f"thresholds NOT merged ({e}); they are in fa2_thresholds.json"
        else:
            note = "thresholds not merged (--thresholds none); they are in fa2_thresholds.json"
        txt.append(note)
        r = routing.decide(device, thresholds=d / "fa2_thresholds.json")
        txt += ["", "routing with these thresholds:"] + [
            f"  {b}: {r.backend(b)} ({r.reason(b)})" for b in ("cmp", "slc", "win")]
        doc["routing_with_these_thresholds"] = r.to_json()["branches"]
        metrics["thresholds"] = {b: {p: rec["min_len"] for p, rec in ps.items()} for b, ps in thr.items()}
        return note
