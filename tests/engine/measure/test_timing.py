"""engine.measure.timing: statistics of known samples, and time_fn's bookkeeping of first call, warm-up and samples."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from engine.measure.timing import Measurement, copies_beyond_l2, summarize, time_blocks, time_first_call, time_fn


def test_summarize_one_to_hundred_uses_linear_percentiles():
    s = summarize(list(range(1, 101)))
    assert s.n == 100
    assert s.median == pytest.approx(50.5)
    assert s.p10 == pytest.approx(10.9)
    assert s.p90 == pytest.approx(90.1)
    assert s.p25 == pytest.approx(25.75)
    assert s.p75 == pytest.approx(75.25)
    assert s.iqr == pytest.approx(49.5)
    assert s.mean == pytest.approx(50.5)
    assert s.std == pytest.approx(math.sqrt(100 * 101 / 12))  # sample std (ddof=1) of 1..n is sqrt(n(n+1)/12)
    assert (s.min, s.max) == (1.0, 100.0)


def test_summarize_odd_count_median_is_the_middle_sample():
    s = summarize([5.0, 1.0, 3.0])  # order does not matter
    assert s.n == 3
    assert s.median == 3.0
    assert s.p10 == pytest.approx(1.4)  # position 0.2 of the way from 1 to 3
    assert s.p90 == pytest.approx(4.6)
    assert s.iqr == pytest.approx(2.0)
    assert s.std == pytest.approx(2.0)


def test_summarize_even_count_median_interpolates():
    s = summarize(np.array([10.0, 20.0, 30.0, 40.0]))
    assert s.median == 25.0
    assert s.p10 == pytest.approx(13.0)
    assert s.p90 == pytest.approx(37.0)
    assert s.iqr == pytest.approx(15.0)


def test_summarize_single_sample():
    s = summarize([7.5])
    assert s.n == 1
    assert s.std == 0.0
    assert s.median == s.p10 == s.p90 == s.min == s.max == s.mean == 7.5
    assert s.iqr == 0.0


def test_summarize_matches_numpy_on_random_samples():
    rng = np.random.default_rng(3)
    a = rng.lognormal(3, 0.5, 257)
    s = summarize(a)
    p10, p25, p50, p75, p90 = np.percentile(a, [10, 25, 50, 75, 90])
    assert (s.p10, s.p25, s.median, s.p75, s.p90) == pytest.approx((p10, p25, p50, p75, p90))
    assert s.std == pytest.approx(a.std(ddof=1))


@pytest.mark.parametrize("bad", [[], np.array([])])
def test_summarize_empty_raises(bad):
    with pytest.raises(ValueError, match="no samples"):
        summarize(bad)


@pytest.mark.parametrize("bad", [[1.0, float("nan"), 3.0], [1.0, float("inf")]])
def test_summarize_nan_or_inf_raises(bad):
    with pytest.raises(ValueError, match="NaN or inf"):
        summarize(bad)


class Counter:
    """A callable that counts its calls and sleeps `first_sleep` seconds on the first one only."""

    def __init__(self, first_sleep: float = 0.0):
        self.calls = 0
        self.first_sleep = first_sleep

    def __call__(self) -> int:
        self.calls += 1
        if self.calls == 1 and self.first_sleep:
            time.sleep(self.first_sleep)
        return self.calls


def test_time_fn_keeps_exactly_iters_samples_and_first_call_apart():
    fn = Counter(first_sleep=0.05)
    m = time_fn(fn, "cpu", warmup=3, iters=17)
    assert isinstance(m, Measurement)
    assert m.device == "cpu"
    assert len(m.samples_us) == 17
    assert fn.calls == 1 + 3 + 17  # first call, warm-up, timed
    assert m.first_call_us >= 50_000
    assert m.stats.median < 10_000  # the slow first call is not among the samples
    assert max(m.samples_us) < 50_000
    assert all(v >= 0 for v in m.samples_us)


def test_time_fn_warmup_calls_happen_and_are_not_timed():
    fn = Counter()
    ticks: list[int] = []
    m = time_fn(fn, "cpu", warmup=5, iters=2, on_iter=ticks.append)
    assert fn.calls == 1 + 5 + 2
    assert len(m.samples_us) == 2
    assert ticks == [0, 1]


def test_time_fn_without_first_call():
    fn = Counter(first_sleep=0.05)
    m = time_fn(fn, "cpu", warmup=0, iters=4, first_call=False)
    assert math.isnan(m.first_call_us)
    assert fn.calls == 4
    assert len(m.samples_us) == 4
    assert max(m.samples_us) >= 50_000  # with no separate first call, the slow call is a sample


def test_time_fn_samples_measure_the_call():
    m = time_fn(lambda: time.sleep(0.01), "cpu", warmup=0, iters=3, first_call=False)
    assert all(10_000 <= v < 200_000 for v in m.samples_us)


def test_time_fn_rejects_zero_iters():
    with pytest.raises(ValueError, match="iters"):
        time_fn(lambda: None, "cpu", iters=0)


def test_time_first_call_measures_wall_time():
    assert time_first_call(lambda: time.sleep(0.02), "cpu") >= 20_000


def test_time_blocks_divides_each_block_by_its_calls():
    fn = Counter()
    m = time_blocks(lambda: (fn(), time.sleep(0.002)), "cpu", block=5, reps=3)
    assert fn.calls == 15  # no warm-up or first call of its own: the caller has already warmed up
    assert len(m.samples_us) == 3
    assert all(2_000 <= v < 40_000 for v in m.samples_us)  # per call, not per block of five (≥ 10 ms)
    assert math.isnan(m.first_call_us)


def test_time_blocks_rejects_empty_blocks():
    with pytest.raises(ValueError, match="block"):
        time_blocks(lambda: None, "cpu", block=0)


def test_bench_records_loop_metrics_when_asked():
    from engine.bench.run import BenchConfig, bench_mode

    result = bench_mode(BenchConfig(mode="eager", batch_sizes=(4,), train_batch_sizes=(8,), warmup=1, iters=3,
                                    loop=True, loop_block=4, loop_reps=3))
    got = {(m.name, m.phase): m.value for m in result.metrics if m.name.startswith("loop_")}
    for phase in ("infer", "train"):
        assert got[("loop_block", phase)] == 4
        assert 0 < got[("loop_p10", phase)] <= got[("loop_median", phase)] <= got[("loop_p90", phase)]
    off = bench_mode(BenchConfig(mode="eager", phases=("infer",), batch_sizes=(4,), warmup=0, iters=2))
    assert not [m for m in off.metrics if m.name.startswith("loop_")]  # CPU default: per-call timing only


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_time_in_graph_times_each_captured_call_and_scales_with_the_work():
    import torch

    from engine.measure.timing import time_in_graph

    small, big = torch.empty(1 << 20, device="cuda"), torch.empty(1 << 27, device="cuda")
    calls = [lambda: small.fill_(1.0)] * 4
    few = time_in_graph(calls, replays=10)
    assert len(few.samples_us) == 10 and all(s > 0 for s in few.samples_us)
    heavy = time_in_graph([lambda: big.fill_(1.0)] * 4, replays=10)
    # 128× the bytes: the sample is the work, not a fixed cost (on an H200 under the parallel GPU suite a 4 MiB fill
    # takes 7.6 µs, mostly fixed cost, and a 256 MiB one 59 µs)
    assert heavy.stats.median > 8 * few.stats.median
    assert small[0].item() == 1.0 and big[-1].item() == 1.0  # the captured calls really ran


def test_rotating_copies_hold_about_three_l2s_within_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A benchmark's copies of an operand together outgrow L2 threefold, so every call reads from HBM; never fewer
    than 2 or more than `most` (a device without an L2 figure counts 50 MB)."""
    import types

    import torch

    l2 = [60 << 20]
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(L2_cache_size=l2[0]))
    assert copies_beyond_l2(20 << 20) == 10  # 3 × 60 MB / 20 MB + 1
    assert copies_beyond_l2(1 << 30) == 2 and copies_beyond_l2(1) == 16 and copies_beyond_l2(1, most=4) == 4
    l2[0] = 0
    assert copies_beyond_l2(10 << 20) == 16  # 3 × 50 MB / 10 MB + 1, at most 16
