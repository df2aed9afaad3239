"""The shared timer of the stages and benches: median / p20 / p80 in milliseconds.

    from nsa_runner.measure.timing import bench, bench_regions

    t = bench(lambda: f(q, k, v), device="cuda", rep_ms=200)     # -> Timing(ms, p20, p80, n, method)
    parts, total = bench_regions(instrumented, device="cuda")   # consecutive regions of one pass

Rules it enforces (DESIGN §7: speed is measured in benches, as ratios within one run):

* **Inputs are built outside the timed function.** ``fn`` takes no arguments: build tensors
  first and close over them; only the call is timed.
* **Warm-up is outside the timing.** The first call (compilation, autotuning, caches) and then
  ``warmup`` calls (or ``warmup_ms`` worth) run untimed.
* **Iteration count by time, not by a fixed large number.** With ``iters=None`` the count is
  ``rep_ms`` / (time of one call), clamped to ``[min_iters, max_iters]``: a 500 ms call is timed
  ``min_iters`` times, a 50 µs call up to ``max_iters`` times. ``iters=N`` fixes it.
* **CUDA:** each call is bracketed by its own pair of CUDA events on the current stream (the
  same method as ``triton.testing.do_bench``); the L2 cache is flushed before each call by
  writing a 256 MiB buffer, outside the events (``flush_l2=False`` to keep it warm). One
  synchronisation at the end; the events are read then.
* **CPU:** ``time.perf_counter`` around each call (torch CPU ops are synchronous).
* **Statistics:** median, 20th and 80th percentile (linear interpolation, as ``do_bench``'s
  ``quantiles=[0.5, 0.2, 0.8]``) of the per-call samples.

``graph_replays`` captures functions in CUDA graphs (the replay is what gets timed: one launch
for the whole function, as a serving engine runs a decode step); ``before`` (bench,
bench_round_robin) runs untimed before each timed call, e.g. to reset gradients.
``profile_partition`` attributes ONE pass to labels by the profiler's own intervals (kernels on
CUDA, CPU ops on CPU) so that the parts plus an explicit remainder add up to the pass exactly.

``bench_regions`` times one *instrumented* pass that calls ``regions.end_as(label)`` /
``regions.begin(label)`` at its own boundaries (for example from wrappers around the parts of a
larger function, or from autograd hooks during a backward pass). Consecutive regions tile the
pass from its first stamp to its last, so per pass the regions add up to the instrumented pass
exactly (and their summaries, central-pass means, add up exactly too: ``summarize_regions``);
the caller compares their sum with the uninstrumented whole timed by ``bench`` or, better, in
turns with it by ``bench_round_robin``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

L2_FLUSH_BYTES = 256 << 20
OTHER = "other"  # label of a region nobody named


@dataclass(frozen=True)
class Timing:
    """Median and spread of per-call samples, in milliseconds."""

    ms: float  # median
    p20: float
    p80: float
    n: int  # timed calls
    method: str  # "cuda-events" or "perf_counter"

    def __str__(self) -> str:
        return f"{self.ms:.4g} ms (p20 {self.p20:.4g}, p80 {self.p80:.4g}, n={self.n}, {self.method})"

    def to_dict(self) -> dict:
        return {"ms": self.ms, "p20": self.p20, "p80": self.p80, "n": self.n, "method": self.method}


def quantile(samples, q: float) -> float:
    """The q-quantile (0..1) of ``samples`` with linear interpolation (numpy's default)."""
    xs = sorted(float(x) for x in samples)
    if not xs:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(samples_ms, method: str) -> Timing:
    """Timing from per-call samples (ms)."""
    xs = [float(x) for x in samples_ms]
    if not xs:
        raise ValueError("no samples to summarize")
    return Timing(quantile(xs, 0.5), quantile(xs, 0.2), quantile(xs, 0.8), len(xs), method)


def _is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def _sync(device) -> None:
    if _is_cuda(device):
        import torch

        torch.cuda.synchronize()


_FLUSH: dict = {}


def _flush_buffer(device):
    import torch

    key = str(device)
    if key not in _FLUSH:
        _FLUSH[key] = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
    return _FLUSH[key]


class _Clock:
    """Stamps on the device timeline: CUDA events (read after one sync) or perf_counter."""

    def __init__(self, device):
        self.cuda = _is_cuda(device)
        if self.cuda:
            import torch

            self._event = lambda: torch.cuda.Event(enable_timing=True)

    def stamp(self):
        if self.cuda:
            e = self._event()
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b) -> float:
        """Milliseconds from stamp a to stamp b (CUDA: call after a synchronize)."""
        return a.elapsed_time(b) if self.cuda else (b - a) * 1e3


def _counts(one_call_ms: float, warmup, iters, warmup_ms, rep_ms, min_iters, max_iters) -> tuple[int, int]:
    per = max(one_call_ms, 1e-4)
    n_warm = warmup if warmup is not None else max(1, min(max_iters, int(warmup_ms / per)))
    n_iter = iters if iters is not None else max(min_iters, min(max_iters, int(rep_ms / per)))
    return n_warm, n_iter


def _check_counts(warmup, iters, min_iters, max_iters) -> None:
    if iters is not None and (not isinstance(iters, int) or iters < 1):
        raise ValueError(f"iters must be a positive int, got {iters!r}")
    if warmup is not None and (not isinstance(warmup, int) or warmup < 0):
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if min_iters < 1 or max_iters < min_iters:
        raise ValueError(f"need 1 <= min_iters <= max_iters, got {min_iters}, {max_iters}")


def bench(fn: Callable[[], object], *, device="cuda", warmup: int | None = None, iters: int | None = None,
          warmup_ms: float = 25.0, rep_ms: float = 100.0, min_iters: int = 3, max_iters: int = 200,
          flush_l2: bool = True, before: Callable[[], object] | None = None) -> Timing:
    """Time ``fn()`` (no arguments; build inputs before) on ``device`` -> Timing (ms).

    The first call is untimed (compile / autotune), then ``warmup`` untimed calls (default: about
    ``warmup_ms`` worth, at least 1), then ``iters`` timed calls (default: about ``rep_ms`` worth,
    clamped to ``[min_iters, max_iters]``). See the module docstring for the method.
    """
    _check_counts(warmup, iters, min_iters, max_iters)
    clock = _Clock(device)
    flush = _flush_buffer(device) if (clock.cuda and flush_l2) else None
    fn()  # first call: compilation / autotuning / allocator
    _sync(device)
    a = clock.stamp()
    fn()
    b = clock.stamp()
    _sync(device)
    n_warm, n_iter = _counts(clock.ms(a, b), warmup, iters, warmup_ms, rep_ms, min_iters, max_iters)
    for _ in range(max(0, n_warm - 1)):  # the estimating call above was warm-up too
        fn()
    _sync(device)
    stamps = []
    for _ in range(n_iter):
        if before is not None:
            before()
        if flush is not None:
            flush.zero_()
        s = clock.stamp()
        fn()
        stamps.append((s, clock.stamp()))
    _sync(device)
    return summarize([clock.ms(s, e) for s, e in stamps], "cuda-events" if clock.cuda else "perf_counter")


class Regions:
    """Consecutive labelled regions of one pass, stamped where the pass says.

    ``begin(label)``: close the open region (keeping its label) and open one named ``label``.
    ``end_as(label, then=None)``: close the open region naming it ``label`` and open one named
    ``then`` (unnamed when None: it takes the label of whoever closes it with ``end_as``, else
    ``OTHER``).
    ``close()``: close the open region (done by ``bench_regions`` after the pass).
    Regions tile the pass from the first stamp to the last without gaps.
    """

    def __init__(self, device="cpu"):
        self._clock = _Clock(device)
        self._stamps: list = []
        self._labels: list[str | None] = []  # label of the region that starts at stamps[i]
        self._closed = False

    def _stamp(self, next_label: str | None) -> None:
        if self._closed:
            raise RuntimeError("Regions: stamp after close()")
        self._stamps.append(self._clock.stamp())
        self._labels.append(next_label)

    def begin(self, label: str) -> None:
        self._stamp(label)

    def end_as(self, label: str, then: str | None = None) -> None:
        """Close the open region naming it ``label``; the next region is named ``then`` (or unnamed)."""
        if not self._stamps:
            raise RuntimeError("Regions.end_as: no region is open (call begin() first)")
        self._labels[-1] = label
        self._stamp(then)

    def close(self) -> None:
        if self._stamps and not self._closed:
            self._stamp(None)
            self._closed = True

    def durations(self) -> list[tuple[str, float]]:
        """[(label, ms)] in pass order (CUDA: after a synchronize). Empty regions are kept."""
        out = []
        for i in range(len(self._stamps) - 1):
            out.append((self._labels[i] or OTHER, self._clock.ms(self._stamps[i], self._stamps[i + 1])))
        return out

    def by_label(self) -> dict[str, float]:
        """{label: total ms} over the pass (a label stamped twice is summed), in first-seen order."""
        out: dict[str, float] = {}
        for label, ms in self.durations():
            out[label] = out.get(label, 0.0) + ms
        return out


def summarize_regions(per_pass: list[dict[str, float]], method: str) -> tuple[dict[str, Timing], Timing]:
    """Per-pass ``{label: ms}`` -> ({label: Timing}, Timing of the pass totals).

    The parts must add up: a sum of per-label medians does not equal the median of the sums when
    the machine is noisy (a slow moment lands in a different part each pass). So a part's ``ms``
    is its MEAN over the *central* passes — those whose total lies between the 20th and 80th
    percentile of the totals — and the parts' ``ms`` add up exactly to the mean total of those
    passes; ``p20`` / ``p80`` of a part are its own percentiles over the central passes and ``n``
    is their count. The pass Timing is the plain median / p20 / p80 of all totals.
    """
    if not per_pass:
        raise ValueError("summarize_regions: no passes")
    totals = [sum(d.values()) for d in per_pass]
    lo, hi = quantile(totals, 0.2), quantile(totals, 0.8)
    central = [d for d, t in zip(per_pass, totals, strict=True) if lo <= t <= hi] or per_pass
    labels: list[str] = []
    for d in per_pass:
        labels += [k for k in d if k not in labels]
    parts = {}
    for k in labels:
        xs = [d.get(k, 0.0) for d in central]
        parts[k] = Timing(sum(xs) / len(xs), quantile(xs, 0.2), quantile(xs, 0.8), len(xs), method)
    return parts, summarize(totals, method)


def bench_regions(fn: Callable[[Regions], object], *, device="cuda", warmup: int | None = None,
                  iters: int | None = None, warmup_ms: float = 25.0, rep_ms: float = 100.0, min_iters: int = 3,
                  max_iters: int = 200, flush_l2: bool = True) -> tuple[dict[str, Timing], Timing]:
    """Time an instrumented pass ``fn(regions)`` -> ({label: Timing}, Timing of the whole pass).

    Each timed call gets a fresh ``Regions`` opened (``begin(OTHER)``) just before ``fn`` and
    closed just after, so the regions of one call add up to that call exactly; the per-label
    figures are summarised by :func:`summarize_regions` (central-pass means that add up exactly).
    Warm-up and iteration counts as in :func:`bench`. A label missing from some calls counts 0 ms.
    """
    _check_counts(warmup, iters, min_iters, max_iters)
    clock = _Clock(device)
    flush = _flush_buffer(device) if (clock.cuda and flush_l2) else None

    def one() -> Regions:
        r = Regions(device)
        r.begin(OTHER)
        fn(r)
        r.close()
        return r

    one()
    _sync(device)
    r = one()
    _sync(device)
    n_warm, n_iter = _counts(sum(ms for _, ms in r.durations()), warmup, iters, warmup_ms, rep_ms, min_iters,
                             max_iters)
    for _ in range(max(0, n_warm - 1)):
        one()
    _sync(device)
    passes = []
    for _ in range(n_iter):
        if flush is not None:
            flush.zero_()
        passes.append(one())
    _sync(device)
    method = "cuda-events" if clock.cuda else "perf_counter"
    return summarize_regions([p.by_label() for p in passes], method)


def bench_round_robin(fns: dict[str, Callable[[], object]] | None = None,
                      regions: dict[str, Callable[[Regions], object]] | None = None, *, device="cuda",
                      warmup: int | None = None, iters: int | None = None, warmup_ms: float = 25.0,
                      rep_ms: float = 100.0, min_iters: int = 3, max_iters: int = 200, flush_l2: bool = True,
                      before: Callable[[], object] | None = None
                      ) -> tuple[dict[str, Timing], dict[str, tuple[dict[str, Timing], Timing]]]:
    """Several functions timed in turns (one call of each per round), so that a slow moment of the
    machine hits all of them alike — use it for numbers that are compared with each other.

    ``fns``: plain functions as in :func:`bench`; ``regions``: instrumented passes as in
    :func:`bench_regions`. -> ({name: Timing}, {name: ({label: Timing}, Timing of the pass)}).
    The iteration count follows the slowest function (``rep_ms`` of it, at least ``min_iters``).
    """
    fns, regions = dict(fns or {}), dict(regions or {})
    if not fns and not regions:
        raise ValueError("bench_round_robin: nothing to time")
    if set(fns) & set(regions):
        raise ValueError(f"bench_round_robin: names used twice: {sorted(set(fns) & set(regions))}")
    _check_counts(warmup, iters, min_iters, max_iters)
    clock = _Clock(device)
    flush = _flush_buffer(device) if (clock.cuda and flush_l2) else None

    def one_region(fn) -> Regions:
        r = Regions(device)
        r.begin(OTHER)
        fn(r)
        r.close()
        return r

    def plain(fn):
        s = clock.stamp()
        fn()
        return s, clock.stamp()

    calls = {**{k: (lambda f=f: plain(f)) for k, f in fns.items()},
             **{k: (lambda f=f: one_region(f)) for k, f in regions.items()}}
    for c in calls.values():  # first calls: compilation / autotuning
        c()
    _sync(device)
    probe = {k: c() for k, c in calls.items()}
    _sync(device)
    per = max([clock.ms(*probe[k]) for k in fns] + [sum(ms for _, ms in probe[k].durations()) for k in regions])
    n_warm, n_iter = _counts(per, warmup, iters, warmup_ms, rep_ms, min_iters, max_iters)
    for _ in range(max(0, n_warm - 1)):
        for c in calls.values():
            c()
    _sync(device)
    got: dict[str, list] = {k: [] for k in calls}
    for _ in range(n_iter):
        for k, c in calls.items():
            if before is not None:
                before()
            if flush is not None:
                flush.zero_()
            got[k].append(c())
    _sync(device)
    method = "cuda-events" if clock.cuda else "perf_counter"
    plain_out = {k: summarize([clock.ms(s, e) for s, e in got[k]], method) for k in fns}
    reg_out = {k: summarize_regions([p.by_label() for p in got[k]], method) for k in regions}
    return plain_out, reg_out


# ---- CUDA graphs ---------------------------------------------------------------------------------

def graph_replays(fns: dict[str, Callable[[], object]], *, optional=(), warmup: int = 2
                  ) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Capture each function in a CUDA graph -> ({name: replay}, {name: why it was left out}).

    A name in ``optional`` whose capture fails is left out (the reason, one line, in the second
    dict); any other failure raises. Time the replays with :func:`bench` / :func:`bench_round_robin`.
    """
    import torch

    from nsa_core.decode.static import capture_graph

    runs, failed = {}, {}
    for name, fn in fns.items():
        try:
            runs[name] = capture_graph(fn, warmup=warmup).replay
        except RuntimeError as e:
            if name not in optional:
                raise
            failed[name] = f"graph capture failed: {(str(e).strip().splitlines() or [''])[0][:100]}"
            torch.cuda.synchronize()
    return runs, failed


# ---- one pass partitioned by the profiler -------------------------------------------------------

REMAINDER = "remainder"  # the part of a pass no interval covers (GPU: idle between kernels)
PASS_SCOPE = "nsa-run::pass"


@dataclass(frozen=True)
class Partition:
    """One pass split into labelled parts that add up to the pass exactly (means over passes, ms).

    ``parts``: {label: ms} including ``REMAINDER``; ``total``: ms of the pass (sum of ``parts``);
    ``items``: {(label, interval name): ms} (kernels on CUDA, ops / scopes on CPU); ``method``.
    """

    parts: dict[str, float]
    total: float
    items: dict[tuple[str, str], float]
    method: str
    passes: int

    def shares(self) -> dict[str, float]:
        """{label: % of the pass}; they sum to 100 (up to float rounding) by construction."""
        return {k: 100.0 * v / self.total if self.total > 0 else float("nan") for k, v in self.parts.items()}


def partition_intervals(passes: list[tuple[float, float, list[tuple[str, str, float]]]], method: str) -> Partition:
    """Per pass ``(start, end, [(name, label, duration)])`` (any one time unit, µs from the profiler)
    -> Partition in ms. The intervals of a pass must not overlap (one stream / one thread); what
    they leave of ``end - start`` is the ``REMAINDER``. Pure function: the profiler feeds it."""
    if not passes:
        raise ValueError("partition_intervals: no passes")
    parts: dict[str, float] = {}
    items: dict[tuple[str, str], float] = {}
    total = 0.0
    for start, end, ivs in passes:
        span = end - start
        if span < 0:
            raise ValueError(f"partition_intervals: pass ends before it starts ({start} > {end})")
        busy = 0.0
        for name, label, dur in ivs:
            parts[label] = parts.get(label, 0.0) + dur
            items[(label, name)] = items.get((label, name), 0.0) + dur
            busy += dur
        parts[REMAINDER] = parts.get(REMAINDER, 0.0) + (span - busy)
        total += span
    n, us = len(passes), 1e-3
    return Partition({k: v * us / n for k, v in parts.items()}, total * us / n,
                     {k: v * us / n for k, v in items.items()}, method, n)


def _cpu_intervals(root, classify, scope_prefix: str) -> list[tuple[str, str, float]]:
    """Intervals of a CPU pass: every op gets its whole time under the label of its nearest
    enclosing scope (``scope_prefix``*, labelled by ``classify``; "other" outside any); a scope's
    own time (Python between its ops, interpreted Triton launches) goes to its label."""
    out = []

    def walk(e, label):
        if e.name.startswith(scope_prefix):
            lab = classify(e.name) or label
            kids = e.cpu_children
            own = e.time_range.elapsed_us() - sum(c.time_range.elapsed_us() for c in kids)
            out.append((e.name, lab, own))
            for c in kids:
                walk(c, lab)
        else:
            out.append((e.name, label, e.time_range.elapsed_us()))

    for c in root.cpu_children:
        walk(c, "other")
    return out


def pass_windows(events, passes: int) -> list:
    """The ``(start, end, event)`` of each profiled pass: the CPU-side ``PASS_SCOPE`` ranges.

    With CUDA activities on, torch.profiler also mirrors every ``record_function`` on the GPU
    timeline (a device-type CUDA user annotation of the same name): seen on the H100 as twice the
    passes asked for. Those mirrors are not passes and are left out here.
    """
    from torch.autograd import DeviceType

    windows = sorted(((e.time_range.start, e.time_range.end, e) for e in events
                      if e.name == PASS_SCOPE and e.device_type == DeviceType.CPU), key=lambda w: w[:2])
    if len(windows) != passes:
        raise RuntimeError(f"profile_partition: found {len(windows)} of {passes} passes in the profile")
    return windows


def profile_partition(fn: Callable[[], object], classify: Callable[[str], str | None], *, device="cuda",
                      passes: int = 5, flush_l2: bool = True, scope_prefix: str = "nsa::") -> Partition:
    """Run ``fn`` ``passes`` times under torch.profiler and split each pass into labelled parts.

    CUDA: the intervals are the device activities (kernels, memcpy/memset) the pass ran, each
    labelled by ``classify(kernel name)`` (None -> "other") and cut where they overlap
    (``cut_overlaps``: kernels under programmatic dependent launch start before the previous one ends);
    the pass is the span from its first kernel's start to its last kernel's end, and the REMAINDER is
    the idle time between kernels (never negative).
    A pass is one ``fn()`` (e.g. one CUDA-graph replay) between two synchronisations, the L2
    flushed before it (outside the pass). CPU: the pass is one ``fn()`` inside a
    ``record_function(PASS_SCOPE)``; its ops are labelled by their enclosing ``scope_prefix``
    scope (``classify(scope name)``), the REMAINDER is pass time outside any op or scope.
    Either way each interval belongs to exactly one label and the parts sum to the pass.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = _is_cuda(device)
    flush = _flush_buffer(device) if (cuda and flush_l2) else None
    fn()
    _sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(passes):
            if flush is not None:
                flush.zero_()
            _sync(device)
            with record_function(PASS_SCOPE):
                fn()
                _sync(device)
    events = list(prof.events())
    windows = pass_windows(events, passes)
    out = []
    if not cuda:
        for start, end, e in windows:
            out.append((start, end, _cpu_intervals(e, classify, scope_prefix)))
        return partition_intervals(out, "torch.profiler CPU ops by scope")
    dev = [e for e in events if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
           and e.name != PASS_SCOPE and not e.name.startswith(scope_prefix)]  # GPU mirrors of the scopes
    for start, end, _ in windows:
        ks = sorted((e for e in dev if start <= e.time_range.start < end), key=lambda e: e.time_range.start)
        if not ks:
            raise RuntimeError("profile_partition: a pass ran no device activity the profiler saw")
        cut = cut_overlaps([(e.name, e.time_range.start, e.time_range.end) for e in ks])
        ivs = [(name, classify(name) or "other", dur) for name, dur in cut]
        out.append((ks[0].time_range.start, max(e.time_range.end for e in ks), ivs))
    return partition_intervals(out, "torch.profiler kernel times (CUPTI), overlaps cut")


def cut_overlaps(spans: list[tuple[str, float, float]]) -> list[tuple[str, float]]:
    """``(name, start, end)`` device intervals of one pass, sorted by start -> ``(name, duration)`` that
    do not overlap: each instant belongs to the interval that started first and still runs. Kernels
    launched with programmatic dependent launch start while the previous kernel runs and wait for it
    (griddepcontrol.wait), so their raw intervals overlap and summed they exceed the pass (a negative
    remainder); cut, a waiting kernel is charged from the moment the one it waited for ended. A kernel
    wholly inside an earlier one is charged 0. Pure function."""
    out, reached = [], float("-inf")
    for name, start, end in spans:
        out.append((name, max(0.0, end - max(start, reached))))
        reached = max(reached, end)
    return out
