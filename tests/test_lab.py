"""``linattn lab``: every check passes on correct kernels, and a broken kernel turns its line into FAIL, exit 1."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import linattn.ops.accumulate
import linattn.ops.delta
import linattn.ops.gated
from linattn.tools import lab
from linattn.tools.cli import main
from linattn.tools.lab import checks as lab_checks

REQUIRED = (
    "recurrent vs dense kernel",
    "recurrent vs chunkwise",
    "gated scan coefficients",
    "delta unit-key convergence",
    "prefill then decode vs one pass",
    "delta chunk vs recurrent",
    "gated delta chunk vs recurrent",
    "delta overshoot diverges",
)
LINE = re.compile(r"^(?P<name>.+): (?P<verdict>PASS|FAIL)  max_err=(?P<err>\S+) tol=(?P<tol>\S+)$")


def lines_of(output: str) -> dict[str, re.Match]:
    """The check lines of the lab's output, by name (detail and summary lines do not match the pattern)."""
    return {m["name"]: m for m in map(LINE.match, output.splitlines()) if m}


@pytest.mark.parametrize("seed", [1, 2])  # the command tests below run seeds 3 and 0
def test_every_check_passes(seed):
    results = lab.run_checks(seed)
    assert [r.name for r in results] == [c.check_name for c in lab.CHECKS]
    for r in results:
        assert r.passed, f"{r.line()}: {r.detail}"
        assert 0.0 <= r.max_error <= r.tolerance
    names = {r.name for r in results}
    assert set(REQUIRED) <= names
    exact = [r for r in results if "float32" not in r.name and "bfloat16" not in r.name]
    assert all(r.tolerance == 1e-10 for r in exact)


def test_command_prints_one_line_per_check_and_exits_zero():
    result = CliRunner().invoke(lab.command, ["--seed", "3"])
    assert result.exit_code == 0, result.output
    found = lines_of(result.output)
    assert list(found) == [c.check_name for c in lab.CHECKS]
    for m in found.values():
        assert m["verdict"] == "PASS"
        assert float(m["err"]) <= float(m["tol"])
    assert f"{len(lab.CHECKS)} of {len(lab.CHECKS)} checks passed (seed 3" in result.output


def test_console_group_runs_lab_with_verbose_detail():
    result = CliRunner().invoke(main, ["lab", "--seed", "0", "--verbose"])
    assert result.exit_code == 0, result.output
    assert "    worst: " in result.output  # --verbose adds where each check's worst error was
    assert "divergence detected" in result.output


def test_negative_seed_is_a_usage_error():
    result = CliRunner().invoke(lab.command, ["--seed", "-1"])
    assert result.exit_code == 2
    assert "--seed" in result.output


def test_same_seed_same_numbers_and_seeds_differ():
    a, b, c = (lab.check_recurrent_vs_chunk(s) for s in (5, 5, 6))
    assert a.max_error == b.max_error and a.detail == b.detail
    assert lab_checks._generator(5, "x").initial_seed() != lab_checks._generator(6, "x").initial_seed()
    assert lab_checks._generator(5, "x").initial_seed() != lab_checks._generator(5, "y").initial_seed()
    assert c.passed


def test_perturbed_parallel_form_fails_the_lab(monkeypatch):
    """An error of 1e-8 in the dense form (far below what a plot would show) must be a FAIL, and only there.

    The kernel's output carries the normalizer's column too, so the error after division is a few 1e-9.
    """
    original = linattn.ops.accumulate.FORMS["parallel"]

    def perturbed(*args, **kwargs):
        o, S = original(*args, **kwargs)
        return o + 1e-8, S

    monkeypatch.setitem(linattn.ops.accumulate.FORMS, "parallel", perturbed)
    result = CliRunner().invoke(lab.command, ["--seed", "0"])
    assert result.exit_code == 1
    found = lines_of(result.output)
    assert found["recurrent vs dense kernel"]["verdict"] == "FAIL"
    assert 1e-9 < float(found["recurrent vs dense kernel"]["err"]) < 2e-8
    assert found["recurrent vs chunkwise"]["verdict"] == "PASS"
    assert found["delta chunk vs recurrent"]["verdict"] == "PASS"
    assert "parallel o" in result.output  # a failing line always prints where its worst error was


def test_off_by_one_gate_in_scan_fails_coefficients(monkeypatch):
    """A classic bug: decaying token i by alpha_i too (gates i..t instead of i+1..t)."""
    original = linattn.ops.gated.FORMS["scan"]

    def shifted(q, k, v, *, g=None, **kwargs):
        g = None if g is None else torch.cat([g[:, :, 1:], torch.zeros_like(g[:, :, :1])], dim=2)
        return original(q, k, v, g=g, **kwargs)

    monkeypatch.setitem(linattn.ops.gated.FORMS, "scan", shifted)
    result = lab.check_gated_scan_coefficients(0)
    assert not result.passed
    assert result.max_error > 1e-3
    assert "scan" in result.detail


def test_wrong_delta_step_fails_convergence_and_overshoot(monkeypatch):
    """A decode step that writes with 1.01 beta: the per-write factor no longer matches 1 - beta |k|^2."""
    original = linattn.ops.delta.step

    def strong(q, k, v, *, beta, **kwargs):
        return original(q, k, v, beta=1.01 * beta, **kwargs)

    monkeypatch.setattr(linattn.ops.delta, "step", strong)
    for check in (lab.check_delta_unit_key_convergence, lab.check_delta_overshoot_diverges):
        result = check(1)
        assert not result.passed and result.max_error > 1e-4, result.line()
    assert not lab.check_prefill_then_decode(1).passed
    assert lab.check_delta_chunk(1).passed  # whole-sequence forms do not use step


def test_convergent_writes_are_not_reported_as_divergence():
    result = lab.check_delta_overshoot_diverges(0, beta_k2=(0.5, 1.5))
    assert not result.passed
    assert "NO divergence detected" in result.detail
    growth = float(re.search(r"smallest growth \|e_25\|/\|e_0\| = (\S+) ", result.detail)[1])
    assert growth < 1e-3  # the writes converged, so there is nothing to detect


def test_exception_inside_a_check_is_a_fail_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    monkeypatch.setitem(linattn.ops.gated.FORMS, "chunk", broken)
    result = lab.check_recurrent_vs_chunk(0)
    assert not result.passed and math.isnan(result.max_error) and result.tolerance == 1e-10
    assert result.detail == "raised RuntimeError: kernel exploded"
    assert result.line() == "recurrent vs chunkwise: FAIL  max_err=nan tol=1e-10"
    assert lab.check_recurrent_vs_dense(0).passed  # other checks are unaffected


def test_compare_fails_on_wrong_data_and_nan():
    good = np.arange(6.0).reshape(2, 3)
    assert lab.compare("x", 1e-10, {"same": (good, good.copy())}).passed
    wrong = lab.compare("x", 1e-10, {"same": (good, good), "off": (good + 1e-9, good)})
    assert not wrong.passed and "off" in wrong.detail
    assert wrong.max_error == pytest.approx(1e-9 / 5)  # relative to max(1, max |expected|) = 5
    nan = good.copy()
    nan[0, 0] = math.nan
    result = lab.compare("x", 1e-10, {"nan": (nan, good), "off": (good + 1e-3, good)})
    assert not result.passed and math.isnan(result.max_error) and "nan" in result.detail
    with pytest.raises(ValueError, match="shape"):
        lab.max_rel_error(good, good[0])
    with pytest.raises(ValueError, match="no pairs"):
        lab.compare("x", 1e-10, {})


def test_result_line_format():
    r = lab.CheckResult("recurrent vs dense kernel", True, 3.1e-15, 1e-10)
    assert r.line() == "recurrent vs dense kernel: PASS  max_err=3.1e-15 tol=1e-10"
    assert lab.CheckResult("a", False, math.nan, 1e-10).line() == "a: FAIL  max_err=nan tol=1e-10"
