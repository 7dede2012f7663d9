"""The tools' shared harness: the timer's call counts, order and statistics, the machine description, the
plotting helper's refusal. No test asserts a duration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from linattn.tools.harness import machine, plotting, timer


def test_timing_statistics_are_numpy_quantiles():
    t = timer.Timing((3.0, 1.0, 2.0, 10.0))
    assert t.median_s == 2.5 and t.min_s == 1.0 and t.max_s == 10.0 and t.mean_s == 4.0
    assert t.quantile(0.9) == pytest.approx(float(np.quantile([1, 2, 3, 10], 0.9)))


def test_time_call_times_the_first_call_apart_and_sizes_the_samples():
    calls = []
    t = timer.time_call(lambda: calls.append(1), repeats=4, warmup=3)
    assert len(calls) == 1 + 2 + 4 and len(t.samples_s) == 4 and t.calls_per_sample == 1
    assert t.first_call_s is not None and all(s >= 0 for s in t.samples_s)
    calls.clear()
    t = timer.time_call(lambda: calls.append(1), repeats=2, min_sample_s=1e-3)  # a fast call repeats in a sample
    assert t.calls_per_sample > 1 and len(calls) == 1 + 2 * t.calls_per_sample
    with pytest.raises(ValueError, match="repeats"):
        timer.time_call(lambda: None, repeats=0)


def test_time_call_fits_a_slow_call_into_the_budget():
    import time

    t = timer.time_call(lambda: time.sleep(0.02), repeats=50, budget_s=0.05)
    assert 1 <= len(t.samples_s) <= 3


def test_time_turns_takes_turns_in_blocks_with_a_hook_before_each_call():
    order, hooks, seen = [], [], []
    fns = [lambda: order.append("a") or "A", lambda: order.append("b") or "B"]
    out = timer.time_turns(fns, repeats=3, warmup=1, block=2, before=lambda: hooks.append(len(order)),
                           observe=lambda j, o: seen.append((j, o)), cpu_time=True)
    assert order == ["a", "b", "a", "a", "b", "b", "a", "b"]
    assert hooks == list(range(8))  # before every call, warm-up included
    assert seen[:2] == [(0, "A"), (1, "B")] and len(seen) == 8
    assert [len(t.samples_s) for t in out] == [3, 3] and all(len(t.cpu_samples_s) == 3 for t in out)


def test_time_batch_returns_first_and_last_output():
    it = iter(range(5))
    mean_s, first, last = timer.time_batch(lambda: next(it), 5)
    assert (first, last) == (0, 4) and mean_s >= 0


def test_machine_description_and_rates():
    d = machine.describe()
    assert d["processor"] == machine.processor_name() and d["cores"] and d["threads"] >= 1
    assert d["versions"]["torch"] and set(machine.DISTRIBUTIONS) == set(d["versions"])
    mm = machine.matmul_rate(64, repeats=2, min_sample_s=0.0)
    cp = machine.copy_bandwidth(1024, repeats=2, min_sample_s=0.0)
    assert mm["n"] == 64 and mm["gflops"] > 0 and math.isfinite(mm["median_ms"])
    assert cp["bytes_per_side"] == 4096 and cp["gbps"] > 0


def test_save_figure_refuses_an_existing_file_and_closes_the_figure(tmp_path):
    plt = plotting.pyplot()
    out = tmp_path / "f.png"
    fig = plt.figure()
    assert plotting.save_figure(fig, out) == out and out.stat().st_size > 0
    assert not plt.fignum_exists(fig.number)
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        plotting.save_figure(plt.figure(), out)
    assert plt.get_fignums() == []  # closed even when refused
