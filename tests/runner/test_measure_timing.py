"""nsa_runner.measure.timing on CPU: statistics, iteration counts by time, warm-up outside the
timing, consecutive regions that tile a pass."""

from __future__ import annotations

import time

import pytest

from nsa_runner.measure import timing


def test_quantile_linear_interpolation_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 3.0, 10.0, 7.5, 2.25]
    for q in (0.0, 0.2, 0.5, 0.8, 1.0):
        assert timing.quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)))
    with pytest.raises(ValueError):
        timing.quantile([], 0.5)
    with pytest.raises(ValueError):
        timing.quantile([1.0], 1.5)


def test_summarize_median_and_spread():
    t = timing.summarize([4.0, 1.0, 2.0, 3.0, 5.0], "perf_counter")
    assert (t.ms, t.n, t.method) == (3.0, 5, "perf_counter")
    assert t.p20 == pytest.approx(1.8) and t.p80 == pytest.approx(4.2)
    assert t.p20 <= t.ms <= t.p80
    assert set(t.to_dict()) == {"ms", "p20", "p80", "n", "method"}


def test_bench_measures_a_known_sleep_and_warms_up_untimed():
    calls = []

    def fn():
        calls.append(time.perf_counter())
        # the first (compile-like) call is slow; it must not be in the samples
        time.sleep(0.2 if len(calls) == 1 else 0.01)

    t = timing.bench(fn, device="cpu", warmup=2, iters=5)
    assert t.method == "perf_counter" and t.n == 5
    assert 9.0 <= t.ms < 60.0, t  # ~10 ms; the 200 ms first call stays out
    assert t.p80 < 150.0
    # 1 first call + 1 estimating call + (warmup - 1) + iters
    assert len(calls) == 1 + 1 + 1 + 5


def test_bench_picks_iterations_by_time():
    n = {"fast": 0, "slow": 0}

    def fast():
        n["fast"] += 1

    def slow():
        n["slow"] += 1
        time.sleep(0.03)

    tf = timing.bench(fast, device="cpu", rep_ms=5.0, warmup_ms=1.0, max_iters=50)
    ts = timing.bench(slow, device="cpu", rep_ms=5.0, warmup_ms=1.0, min_iters=3, max_iters=50)
    assert tf.n == 50  # a near-zero call: capped by max_iters
    assert ts.n == 3  # a 30 ms call with a 5 ms budget: min_iters
    assert ts.ms > tf.ms


def test_bench_rejects_bad_counts():
    for kw in ({"iters": 0}, {"warmup": -1}, {"min_iters": 0}, {"min_iters": 5, "max_iters": 2}):
        with pytest.raises(ValueError):
            timing.bench(lambda: None, device="cpu", **kw)


def test_regions_tile_the_pass_and_label():
    r = timing.Regions("cpu")
    r.begin("a")
    time.sleep(0.01)
    r.end_as("a2")  # relabels the open region
    time.sleep(0.02)
    r.end_as("b")
    r.begin("c")  # closes an empty unnamed region -> OTHER
    time.sleep(0.01)
    r.close()
    d = r.durations()
    assert [k for k, _ in d] == ["a2", "b", timing.OTHER, "c"]
    assert d[0][1] >= 9.0 and d[1][1] >= 19.0 and d[3][1] >= 9.0
    assert sum(ms for _, ms in d) == pytest.approx((r._stamps[-1] - r._stamps[0]) * 1e3)
    with pytest.raises(RuntimeError):
        r.begin("late")
    with pytest.raises(RuntimeError):
        timing.Regions("cpu").end_as("x")


def test_bench_regions_parts_add_up_to_the_pass(monkeypatch):
    # a fake clock (not wall time: a loaded CI machine must not decide this test); pass k takes
    # k ms more in its second region, so the passes differ and the central-pass selection matters
    now = [0.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    calls = [0]

    def instrumented(r):
        calls[0] += 1
        now[0] += 0.004
        r.end_as("first")
        now[0] += 0.008 + 0.001 * calls[0]
        r.end_as("second")
        now[0] += 0.002  # the tail nobody names -> OTHER

    parts, total = timing.bench_regions(instrumented, device="cpu", warmup=1, iters=7)
    assert list(parts) == ["first", "second", timing.OTHER]
    assert total.n == 7 and all(1 <= p.n <= 7 for p in parts.values())  # parts: the central passes
    assert parts["first"].ms == pytest.approx(4.0) and parts[timing.OTHER].ms == pytest.approx(2.0)
    assert 8.0 < parts["second"].ms < 16.0 and parts["second"].ms > parts["first"].ms
    s = sum(p.ms for p in parts.values())
    assert abs(s - total.ms) / total.ms < 0.1  # central means of the parts vs the median of the passes


@pytest.mark.gpu
def test_bench_cuda_events():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    a = torch.randn(2048, 2048, device="cuda")
    t = timing.bench(lambda: a @ a, device="cuda", rep_ms=20)
    assert t.method == "cuda-events" and t.ms > 0 and t.n >= 3


def test_round_robin_times_plain_and_instrumented_functions_in_turns():
    order = []

    def a():
        order.append("a")
        time.sleep(0.002)

    def b(r):
        order.append("b")
        time.sleep(0.003)
        r.end_as("x")
        time.sleep(0.001)

    plain, reg = timing.bench_round_robin({"a": a}, {"b": b}, device="cpu", warmup=1, iters=5)
    assert plain["a"].n == 5 and plain["a"].ms >= 1.5
    parts, total = reg["b"]
    assert set(parts) == {"x", timing.OTHER} and total.n == 5
    assert parts["x"].ms >= 2.5 and total.ms >= 3.5
    # first calls, the probe, then 5 rounds: always a then b (turns, not blocks)
    assert order[-10:] == ["a", "b"] * 5
    with pytest.raises(ValueError):
        timing.bench_round_robin({}, {}, device="cpu")
    with pytest.raises(ValueError):
        timing.bench_round_robin({"a": a}, {"a": b}, device="cpu")


def test_summarize_regions_parts_add_up_even_when_noise_moves_between_parts():
    # a slow moment lands in a different part in each pass: the medians of the parts would sum
    # to 3 while every pass took 12; the central-pass means add up to the central mean total
    passes = [{"a": 10.0, "b": 1.0, "c": 1.0}, {"a": 1.0, "b": 10.0, "c": 1.0}, {"a": 1.0, "b": 1.0, "c": 10.0}] * 3
    parts, total = timing.summarize_regions(passes, "perf_counter")
    assert total.ms == 12.0
    assert sum(p.ms for p in parts.values()) == pytest.approx(12.0)
    assert sum(timing.quantile([d[k] for d in passes], 0.5) for k in "abc") == 3.0  # what medians would say
    # outlier passes (total outside p20..p80) do not enter the parts
    passes = [{"a": 1.0, "b": 2.0}] * 8 + [{"a": 100.0, "b": 2.0}, {"a": 0.1, "b": 0.1}]
    parts, total = timing.summarize_regions(passes, "perf_counter")
    assert parts["a"].ms == pytest.approx(1.0) and parts["b"].ms == pytest.approx(2.0) and parts["a"].n == 8
    with pytest.raises(ValueError):
        timing.summarize_regions([], "perf_counter")


# ---- before, partitions (issue 14: shares that add up to 100%) --------------------------------

def test_bench_runs_before_untimed_before_every_timed_call():
    from nsa_runner.measure.timing import bench

    calls = []
    t = bench(lambda: calls.append("f"), device="cpu", warmup=0, iters=4, before=lambda: calls.append("b"))
    assert t.n == 4
    assert calls[-8:] == ["b", "f"] * 4  # each timed call preceded by its `before`
    t2 = bench(lambda: None, device="cpu", warmup=0, iters=3, before=lambda: time.sleep(0.02))
    assert t2.ms < 0.01 * 1e3  # the 20 ms sleep of `before` is not in the timing


def test_partition_intervals_add_up_with_an_explicit_remainder():
    from nsa_runner.measure.timing import REMAINDER, partition_intervals

    p = partition_intervals([(0.0, 100.0, [("k1", "cmp", 30.0), ("k2", "sel", 50.0)]),
                             (10.0, 110.0, [("k1", "cmp", 40.0), ("k3", "other", 20.0)])], "test")
    assert p.total == pytest.approx(0.1)  # µs in, ms out: 100 µs per pass
    assert p.parts == pytest.approx({"cmp": 0.035, "sel": 0.025, "other": 0.01, REMAINDER: 0.03})
    assert sum(p.parts.values()) == pytest.approx(p.total)
    assert sum(p.shares().values()) == pytest.approx(100.0)
    assert p.items[("cmp", "k1")] == pytest.approx(0.035) and p.passes == 2
    with pytest.raises(ValueError, match="no passes"):
        partition_intervals([], "x")


def test_overlapping_kernels_are_cut_so_the_remainder_is_never_negative():
    """Programmatic dependent launch: the next kernel starts (and waits) while the previous one runs, so
    raw kernel times summed exceed the pass. Cut, each instant is charged once: the parts add up to the
    pass with a remainder >= 0 (the idle gap), and a kernel is charged from when the one it waited for ended."""
    from nsa_runner.measure.timing import REMAINDER, cut_overlaps, partition_intervals

    spans = [("a", 0.0, 40.0), ("b", 10.0, 70.0), ("c", 65.0, 66.0), ("d", 80.0, 100.0)]
    cut = cut_overlaps(spans)
    assert cut == [("a", 40.0), ("b", 30.0), ("c", 0.0), ("d", 20.0)]
    raw = sum(e - s for _, s, e in spans)
    assert raw > 100.0  # what the old sum charged: more than the pass
    p = partition_intervals([(0.0, 100.0, [(n, n, d) for n, d in cut])], "t")
    assert p.parts[REMAINDER] == pytest.approx(10e-3)  # 70..80 idle, in ms
    assert sum(p.parts.values()) == pytest.approx(p.total) and min(p.parts.values()) >= 0.0


def test_profile_partition_on_cpu_sums_to_100_and_follows_the_scopes():
    import torch
    from torch.profiler import record_function

    from nsa_runner.measure.timing import REMAINDER, profile_partition

    a = torch.randn(128, 128)

    def step():
        with record_function("nsa::cmp"):
            a @ a
            with record_function("nsa::sel"):  # nested: the inner scope's ops are sel's
                for _ in range(20):
                    (a @ a).sum()
        a.exp()  # outside any scope: other
        time.sleep(0.003)  # no op at all: the remainder

    p = profile_partition(step, lambda n: n.removeprefix("nsa::"), device="cpu", passes=3)
    assert set(p.parts) == {"cmp", "sel", "other", REMAINDER}
    assert sum(p.shares().values()) == pytest.approx(100.0)
    assert sum(p.parts.values()) == pytest.approx(p.total)
    assert p.parts[REMAINDER] >= 2.5  # the sleep (ms)
    assert p.parts["sel"] > 0 and p.parts["cmp"] > 0  # (no timing race: which op went where is checked below)
    assert ("other", "aten::exp") in p.items and ("sel", "aten::sum") in p.items
    assert ("cmp", "aten::matmul") in p.items and ("sel", "aten::matmul") in p.items
    assert not any(lab == "cmp" and name == "aten::sum" for lab, name in p.items)


def test_pass_windows_leave_out_the_gpu_mirrors_of_the_pass_scope():
    """With CUDA activities, torch.profiler lists each record_function twice: the CPU range and a
    CUDA-typed user annotation of the same name (the H100 decode-bench ERROR 'found 20 of 10
    passes'). Only the CPU ranges are passes; a count that is still off raises."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from nsa_runner.measure.timing import PASS_SCOPE, pass_windows

    def ev(start, end, dtype, name=PASS_SCOPE):
        return NS(name=name, device_type=dtype, time_range=NS(start=start, end=end))

    cpu = [ev(100 * i, 100 * i + 50, DeviceType.CPU) for i in (2, 0, 1)]
    mirrors = [ev(100 * i + 5, 100 * i + 40, DeviceType.CUDA) for i in range(3)]
    kernel = ev(10, 20, DeviceType.CUDA, name="some_kernel")
    w = pass_windows(cpu + mirrors + [kernel], 3)
    assert [(a, b) for a, b, _ in w] == [(0, 50), (100, 150), (200, 250)]
    assert all(e.device_type == DeviceType.CPU for _, _, e in w)
    with pytest.raises(RuntimeError, match="found 3 of 4 passes"):
        pass_windows(cpu + mirrors, 4)


def test_decode_labels_name_every_decode_kernel():
    """Every @triton.jit kernel of the decode step has an attribution label (else its time would
    silently land in 'other')."""
    import ast
    import inspect

    from nsa_core.decode import kernels
    from nsa_core.decode.labels import KERNEL_LABEL, label_of

    tree = ast.parse(inspect.getsource(kernels))  # JITFunction or InterpretedFunction: read the source
    launched = {f.name for f in tree.body if isinstance(f, ast.FunctionDef) and f.name.endswith("_kernel")
                and any("jit" in ast.unparse(d) for d in f.decorator_list)}
    assert launched and launched <= set(KERNEL_LABEL), launched - set(KERNEL_LABEL)
    assert label_of("nsa::win") == "win" and label_of("_selwin_kernel") == "shared"
    assert label_of("nsa::bogus") is None and label_of("sm90_xmma_gemm_bf16") is None


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_graph_replays_and_profile_partition_on_cuda():
    import torch

    from nsa_runner.measure.timing import graph_replays, profile_partition

    x = torch.randn(1 << 20, device="cuda")
    runs, failed = graph_replays({"f": lambda: (x * 2).sum(), "bad": lambda: x.cpu()}, optional=["bad"])
    assert set(runs) == {"f"} and "bad" in failed
    p = profile_partition(runs["f"], lambda n: None, device="cuda", passes=3)
    assert sum(p.shares().values()) == pytest.approx(100.0) and p.parts["other"] > 0
