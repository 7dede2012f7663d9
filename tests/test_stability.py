"""linattn.tools.stability: the ground truth, the sweep's numbers, epsilon, state rescaling and the CLI."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

import linattn
from linattn import State
from linattn.tools import stability as st
from linattn.tools.stability import measure


@pytest.mark.parametrize("rule", linattn.RULES)
def test_float64_ground_truth_equals_numpy_reference(rule):
    # The sweep trusts linear_attention in float64 (chunk form) at lengths the NumPy loop cannot reach.
    assert st.reference_check(rule, length=100) < 1e-10


@pytest.mark.parametrize("rule", linattn.RULES)
def test_float64_ground_truth_does_not_depend_on_form(rule):
    x = st.make_inputs(rule, 300, 1.0, dim=8, dtypes=[])
    chunk, _ = measure._attend(x, torch.float64, rule=rule, form="chunk", chunk_size=st.REFERENCE_CHUNK)
    rec, _ = measure._attend(x, torch.float64, rule=rule, form="recurrent", chunk_size=1)
    assert (chunk - rec).abs().max().item() < 1e-12


def test_common_grid_is_exact_in_every_dtype():
    x = torch.randn(4000, dtype=torch.float64) * torch.logspace(-9, 4, 4000, dtype=torch.float64)
    y = st.common_grid(x, ["bfloat16", "float16"])
    for dt in (torch.bfloat16, torch.float16, torch.float32):
        assert torch.equal(y.to(dt).to(torch.float64), y)
    assert (y - x).abs().max() <= x.abs().max() * 2**-8  # still the same numbers, to bfloat16 precision
    with pytest.raises(ValueError, match="overflow float16"):
        st.common_grid(torch.tensor([1e5], dtype=torch.float64), ["float16"])


def test_error_stats_counts_nonfinite_and_measures_the_rest():
    ref = torch.ones(1, 3, 1, 2, dtype=torch.float64)
    out = ref.clone()
    out[0, 0, 0, 0] = float("nan")
    out[0, 1, 0, 1] = float("inf")
    out[0, 2, 0, 0] = 1.5
    s = st.error_stats(out, ref)
    assert (s["nan_count"], s["inf_count"]) == (1, 1)
    assert s["max_abs_err"] == pytest.approx(0.5) and s["max_rel_err"] == pytest.approx(0.5)
    assert st.error_stats(torch.full_like(ref, float("nan")), ref)["max_rel_err"] is None


def test_sweep_errors_scale_with_dtype_precision():
    recs = st.stability_sweep(rules=["accumulate", "delta"], dtypes=["float32", "bfloat16"], lengths=[64, 512],
                              scales=[1.0], chunk_sizes=[16], dim=16)
    assert len(recs) == 2 * 2 * 1 * 2
    by = {(r["rule"], r["dtype"], r["length"]): r for r in recs}
    for length in (64, 512):
        f32 = by[("accumulate", "float32", length)]
        bf16 = by[("accumulate", "bfloat16", length)]
        assert f32["error"] is None and f32["max_rel_err"] < 1e-5  # float32 eps 1.2e-7, times a few roundings
        assert 1e-4 < bf16["max_rel_err"] < 0.1  # bfloat16 eps 7.8e-3
        assert f32["nan_count"] == f32["inf_count"] == f32["state_nonfinite"] == 0
        # smallest denominator: positive (relu+1 features), and the float32 one agrees with float64
        assert f32["min_den_float64"] > 0
        assert f32["min_den"] == pytest.approx(f32["min_den_float64"], rel=1e-5)
        assert by[("delta", "float32", length)]["min_den"] is None  # no normalizer
        assert by[("delta", "float32", length)]["max_rel_err"] < 1e-5
    # the state after 512 tokens holds sums of ~512 relu+1 features: its size is recorded
    assert by[("accumulate", "float32", 512)]["state_abs_max"] > 300


def test_float16_overflow_is_caught():
    # den = q^T z grows ~ T * |features|^2 * sqrt(r); at scale 10 it passes 65504 within 1024 tokens in float16
    recs = st.stability_sweep(rules=["accumulate"], dtypes=["float16", "float32"], lengths=[1024], scales=[10.0],
                              chunk_sizes=[64], dim=32)
    f16, f32 = recs
    # den passes float16's 65504: those outputs are inf / inf = NaN or inf, counted apart from the measured errors
    assert f16["dtype"] == "float16" and f16["nan_count"] + f16["inf_count"] > 1000
    assert f32["max_rel_err"] < 1e-5


def test_case_grid_one_factor_at_a_time():
    assert st.case_grid([0.1, 1.0, 10.0], [16, 64, 256]) == [(0.1, 64), (1.0, 64), (10.0, 64), (1.0, 16),
                                                              (1.0, 256)]
    assert len(st.case_grid([0.1, 1.0], [16, 64], full_grid=True)) == 4


def test_sweep_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dtype"):
        st.stability_sweep(rules=["accumulate"], dtypes=["float8"], lengths=[8])
    with pytest.raises(ValueError, match="lengths"):
        st.stability_sweep(rules=["accumulate"], dtypes=["float32"], lengths=[0])
    with pytest.raises(ValueError, match="form"):
        st.stability_sweep(rules=["delta"], form="scan", dtypes=["float32"], lengths=[8])


def test_epsilon_changes_follow_the_formulas():
    res = st.epsilon_tradeoff(length=256, offsets=(0.0, -6.0, -12.0), eps_values=(1e-12, 1e-6), dim=8)
    assert res["den_min"] < 1e-6 < res["den_max"]  # the inputs do reach tiny denominators
    cases = {(c["eps_mode"], c["eps"]): c for c in res["cases"]}
    for c in res["cases"]:
        assert c["formula_max_dev"] < 1e-12
    # add: a token changes by more than 1e-3 while den < 999 eps; clamp: only while den < eps (then by 1 - den/eps)
    add, clamp = cases[("add", 1e-6)], cases[("clamp", 1e-6)]
    assert 1e-6 < add["max_den_changed_1e-3"] < 1e-3
    assert clamp["max_den_changed_1e-3"] < 1e-6
    assert add["frac_changed_1e-6"] > clamp["frac_changed_1e-6"] > 0
    if res["den_min"] > 1e-12:
        assert cases[("clamp", 1e-12)]["max_rel_change"] == 0.0  # clamp below every den is exact division


def _split_run(mode: str, factor: float, scale_eps: bool):
    """Whole sequence in one call vs first half, rescale_state, second half with keys scaled by the factor."""
    x = st.epsilon_inputs(200, (0.0, -9.0), 8, 0)  # the second head has tiny denominators, so eps is visible
    fm = linattn.FEATURE_MAPS["elu1"]
    qf, kf, v = fm(x["q"]), fm(x["k"]), x["v"]
    eps = 1e-6
    full, _ = linattn.linear_attention(qf, kf, v, eps=eps, eps_mode=mode)
    _, s1 = linattn.linear_attention(qf[:, :100], kf[:, :100], v[:, :100], eps=eps, eps_mode=mode,
                                     output_final_state=True)
    s1r, eps_r = st.rescale_state(s1, factor, eps)
    assert eps_r == eps * factor and torch.equal(s1r.S, s1.S * factor) and torch.equal(s1r.z, s1.z * factor)
    tail, _ = linattn.linear_attention(qf[:, 100:], kf[:, 100:] * factor, v[:, 100:], eps=eps_r if scale_eps else eps,
                                       eps_mode=mode, initial_state=s1r)
    return (tail - full[:, 100:]).abs().max().item()


@pytest.mark.parametrize("mode", ["add", "clamp"])
def test_rescale_state_keeps_outputs_only_with_eps_scaled(mode):
    assert _split_run(mode, 2.0**-20, scale_eps=True) < 1e-12
    assert _split_run(mode, 2.0**-20, scale_eps=False) > 1e-3  # eps left alone: the tiny-den head changes


def test_rescale_state_rejects_bad_input():
    s = State.zeros(1, 1, 2, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="factor"):
        st.rescale_state(s, 0.0)
    with pytest.raises(ValueError, match="factor"):
        st.rescale_state(s, math.inf)
    with pytest.raises(ValueError, match="z is None"):
        st.rescale_state(State(s.S), 0.5)
    with pytest.raises(TypeError, match="State"):
        st.rescale_state(s.S, 0.5)


def test_run_segmented_float64_unchanged_and_float16_kept_in_range():
    x = st.make_inputs("accumulate", 1024, 10.0, dim=32, dtypes=["float16"])
    q, k, v = x["q"], x["k"], x["v"]
    ref, _ = measure._attend(x, torch.float64, rule="accumulate", form="chunk", chunk_size=64)
    out64, info64 = st.run_segmented(q, k, v, dtype=torch.float64, segment=32, limit=2.0**4)
    assert info64["n_rescales"] >= 1 and info64["key_factor"] <= 2.0**-10  # the state was shrunk a lot ...
    assert st.token_rel_change(out64, ref).max().item() < 1e-12  # ... and no output moved
    plain, _ = measure._attend(x, torch.float16, rule="accumulate", form="chunk", chunk_size=64)
    plain_stats = st.error_stats(plain, ref)
    assert plain_stats["nan_count"] + plain_stats["inf_count"] > 1000  # den overflowed
    res, info = st.run_segmented(q, k, v, dtype=torch.float16, segment=128, limit=2.0**10)
    stats = st.error_stats(res, ref)
    assert info["n_rescales"] >= 1 and info["peak_state_abs"] < 65504
    assert stats["max_rel_err"] < 2e-2 and stats["nan_count"] == stats["inf_count"] == 0


def test_cli_writes_valid_json_and_png_and_refuses_overwrite(tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    args = ["--rule", "accumulate", "--dtype", "float32", "--dtype", "bfloat16", "--lengths", "64,128",
            "--scales", "1", "--chunk-sizes", "16", "--dim", "8", "--no-progress", "--output", str(out),
            "--plot", str(png)]
    res = CliRunner().invoke(st.command, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert len(doc["records"]) == 4 and doc["reference"]["max_abs_diff_vs_numpy"]["accumulate"] < 1e-10
    assert doc["reference"]["passed"] is True and ": PASS" in res.output.splitlines()[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "accumulate" in res.output and "bfloat16" in res.output
    again = CliRunner().invoke(st.command, args)
    assert again.exit_code != 0 and "--overwrite" in again.output


@pytest.mark.parametrize("args, needle", [(["--lengths", "10,-5"], "--lengths"), (["--dtype", "float8"], "float8"),
                                          (["--rule", "delta", "--form", "scan"], "--form")])
def test_cli_bad_input_is_a_usage_error(args, needle):
    res = CliRunner().invoke(st.command, [*args, "--no-progress"])
    assert res.exit_code == 2 and needle in res.output
