"""scripts/hf_families_bench.py's pure parts: the split of a token's time and Amdahl's bound from it, the gradient
comparison, and the clock around the replaced functions (one count per call, HF's functions back afterwards)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402

from linattn.integrations import transformers as lt  # noqa: E402

_SPEC = importlib.util.spec_from_file_location(
    "hf_families_bench", Path(__file__).resolve().parents[1] / "scripts" / "hf_families_bench.py")
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_share_row_splits_the_time_and_bounds_the_speedup_by_amdahl():
    # HF: 10 ms, 6 of them in the functions; linattn: 5 ms, 1 in the functions; the rest (4 ms) unchanged
    row = bench.share_row(10.0, 6.0, 5.0, 1.0)
    assert row["hf_rest"] == 4.0 and row["linattn_rest"] == 4.0
    assert row["hf_share"] == 0.6 and row["linattn_share"] == 0.2
    assert row["function_speedup"] == 6.0 and row["speedup"] == 2.0
    assert row["amdahl_speedup"] == 10.0 / (4.0 + 1.0)
    assert row["amdahl_limit"] == 10.0 / 4.0


def test_share_row_reports_where_the_rest_changed():
    # the rest grew on linattn's path (2 -> 3 ms): the measured speedup falls below Amdahl's
    row = bench.share_row(8.0, 6.0, 4.0, 1.0)
    assert row["hf_rest"] == 2.0 and row["linattn_rest"] == 3.0
    assert row["amdahl_speedup"] == 8.0 / 3.0 and row["speedup"] == 2.0 < row["amdahl_speedup"]
    assert row["amdahl_limit"] == 4.0
    assert bench.share_row(5.0, 5.0, 1.0, 1.0)["amdahl_limit"] == float("inf")  # all the time in the functions


def test_grad_rel_diff_names_the_worst_parameter_and_refuses_different_sets():
    hf = {"a": torch.tensor([1.0, -2.0]), "b": torch.tensor([4.0, 0.0])}
    ours = {"a": torch.tensor([1.0, -2.02]), "b": torch.tensor([4.0, 0.2])}
    diff, name = bench.grad_rel_diff(ours, hf)
    assert name == "b" and diff == pytest.approx(0.05)
    with pytest.raises(RuntimeError, match="different parameters"):
        bench.grad_rel_diff({"a": hf["a"]}, hf)


def test_the_clock_counts_each_call_of_the_path_in_force_and_puts_it_back():
    module = lt.modeling("lfm2")
    x, w = torch.randn(1, 6, 9), torch.randn(6, 4)
    before = module.causal_conv1d_fn
    with lt.use_hf_torch_fallback(("lfm2",)):
        hf = module.causal_conv1d_fn
        with bench.RecurrentClock("lfm2") as clock:
            assert module.causal_conv1d_fn is not hf
            y = module.causal_conv1d_fn(x, w, None, None)
            module.causal_conv1d_fn(x, w, None, None)
        assert module.causal_conv1d_fn is hf
    assert module.causal_conv1d_fn is before
    assert clock.calls == 2 and clock.seconds > 0
    torch.testing.assert_close(y, hf(x, w, None, None), rtol=0, atol=0)  # the wrapper returns the function's result


def test_the_clock_counts_a_call_made_from_inside_another_once():
    module = lt.modeling("lfm2")
    x, w = torch.randn(1, 6, 9), torch.randn(6, 4)

    def update_calling_fn(hidden_states, conv_state, weight, bias=None, activation=None):
        return module.causal_conv1d_fn(hidden_states, weight, bias, activation)  # looked up at call time: the clock's

    with lt.use_hf_torch_fallback(("lfm2",)), lt.Patch([(module, "causal_conv1d_update", update_calling_fn)]):
        with bench.RecurrentClock("lfm2") as clock:
            module.causal_conv1d_update(x, None, w)
    assert clock.calls == 1
