"""The tools' own checks can fail: each is run against a deliberately wrong kernel or peer and must say so.

``linattn bench`` and ``linattn stability`` report that linattn "matches the float64 reference", and ``linattn perf``
reports "match" for each peer. A check that compares the reference with itself, or a mismatch branch that is never
taken, would keep saying so after a real regression. Here the kernel (or the peer) is perturbed by monkeypatching
what the tool calls, and the tool must report ``passed=False``, the decision ``reject_reference_mismatch``, a
``FAIL`` line or ``MISMATCH``. The perturbation is one value column shifted by ``delta``: it changes the outputs of
every rule (normalized or not) by about ``delta``, well above each tool's tolerance.
"""

from __future__ import annotations

import ctypes
import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import linattn
from linattn import backends
from linattn.kernels import cpu_decode
from linattn.ops import accumulate, delta, gated, gated_delta
from linattn.tools import stability as st
from linattn.tools.bench import cli as bench
from linattn.tools.bench import plan as bench_plan
from linattn.tools.bench import report as bench_report
from linattn.tools.perf import cpu as perf
from linattn.tools.perf import peers as pp
from linattn.tools.perf import work
from linattn.tools.perf.report import render_markdown

RULE_MODULES = {"accumulate": accumulate, "gated": gated, "delta": delta, "gated_delta": gated_delta}


def shifted(kernel, shift: float):
    """``kernel`` computing on values whose first column is off by ``shift`` (a wrong kernel, by construction)."""

    def wrong(q, k, v, **kwargs):
        v = v.clone()
        v[..., 0] += shift
        return kernel(q, k, v, **kwargs)

    return wrong


# ------------------------------------------------------------------------------------------------- bench
IDENTITY = {
    "semantic_id": "ARCH-RECURRENT-STATE-MECHANISM",
    "workload_id": "arch-linear-recurrence-v2",
    "run_label": "t",
    "profile_id": "cpu-float32",
    "created_utc": "2025-01-01T00:00:00Z",
    "linattn_version": "0.1.0",
}


def test_bench_reference_check_rejects_a_wrong_decode_step(monkeypatch):
    # The state path decodes with linattn.step: the one-call compiled decode (kernels/cpu_decode.py) for the plain
    # case, a compiled step (linattn.backends.step) where one covers the call, else the rule module's ``step``.
    # All three are made wrong.
    for mod in (accumulate, gated_delta):
        monkeypatch.setattr(mod, "step", shifted(mod.step, 1e-3))  # tolerance in float32: 1e-4
    compiled = backends.step

    def wrong_compiled(backend, *, v, **kwargs):
        v = v.clone()
        v[..., 0] += 1e-3
        return compiled(backend, v=v, **kwargs)

    monkeypatch.setattr(backends, "step", wrong_compiled)
    one_call = cpu_decode.decode

    def wrong_one_call(*args):
        status = one_call(*args)
        o_address, B, HV, Dv = args[7], args[8], args[10], args[12]  # see cpu_decode._decode's signature
        o = torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(o_address, ctypes.POINTER(ctypes.c_float)),
                                                   (B, HV, Dv)))
        o[..., 0] += 1e-3
        return status

    monkeypatch.setattr(cpu_decode, "decode", wrong_one_call)
    plan = bench_plan.Plan(sequence_lengths=(4, 8), query_heads=2, head_dim=4, warmup=1, repeats=2,
                           rules=("accumulate", "gated_delta"))
    doc = bench.run(plan, IDENTITY)
    checks = doc["metrics"]["reference_checks"]
    assert [c["passed"] for c in checks] == [False, False]
    assert all(c["max_abs_error"] > c["tolerance"] for c in checks)
    assert doc["decision"]["outcome"] == "reject_reference_mismatch"
    assert "FAILED" in bench_report.format_table([doc])


# ------------------------------------------------------------------------------------------------- stability
@pytest.mark.parametrize("rule", linattn.RULES)
def test_stability_reference_check_sees_a_wrong_float64_chunk_form(monkeypatch, rule):
    assert st.reference_check(rule, length=64) < st.REFERENCE_TOL  # the real kernel passes ...
    mod = RULE_MODULES[rule]
    monkeypatch.setitem(mod.FORMS, st.REFERENCE_FORM, shifted(mod.FORMS[st.REFERENCE_FORM], 1e-6))
    assert st.reference_check(rule, length=64) > 1e-8  # ... a wrong one by 1e-6 does not


def test_stability_cli_prints_fail_for_a_wrong_ground_truth(monkeypatch, tmp_path):
    args = ["--rule", "accumulate", "--dtype", "float32", "--lengths", "64", "--scales", "1", "--chunk-sizes", "16",
            "--dim", "8", "--no-progress"]
    # (test_stability's CLI test sees PASS with the real kernel)
    monkeypatch.setitem(accumulate.FORMS, "chunk", shifted(accumulate.FORMS["chunk"], 1e-6))
    bad = CliRunner().invoke(st.command, [*args, "--output", str(tmp_path / "bad.json")])
    assert bad.exit_code == 0, bad.output
    ref = json.loads((tmp_path / "bad.json").read_text())["reference"]
    assert ref["passed"] is False and ref["max_abs_diff_vs_numpy"]["accumulate"] > ref["tolerance"]
    assert ": FAIL" in bad.output.splitlines()[0]


# ------------------------------------------------------------------------------------------------- perf
def _gated_recurrent_as_peer(fn, inp: pp.Inputs) -> torch.Tensor:
    return fn(inp.q, inp.k, inp.v, rule="gated", form="recurrent", g=inp.g, eps=pp.EPS)[0]


def _gated_log2_peer(fn, inp: pp.Inputs) -> torch.Tensor:
    """A peer with another gate convention: alpha = 2^g where linattn has alpha = e^g (adapter passes g as is)."""
    return fn(inp.q, inp.k, inp.v, rule="gated", form="recurrent", g=inp.g * math.log(2), eps=pp.EPS)[0]


RIGHT = pp.Peer("test.gated_recurrent", "linattn", "linear_attention", "gated_head", "chunk",
                _gated_recurrent_as_peer, "linattn")
WRONG = pp.Peer("test.gated_log2", "linattn", "linear_attention", "gated_head", "chunk", _gated_log2_peer, "linattn")


def test_perf_crosscheck_reports_a_peer_computing_another_function():
    rows = {r["peer"]: r for r in pp.crosscheck((RIGHT, WRONG), B=1, T=32, H=2, D=8)}
    assert rows[RIGHT.name]["status"] == "match" and rows[RIGHT.name]["rel_diff"] < 1e-5
    assert rows[WRONG.name]["status"] == "MISMATCH" and rows[WRONG.name]["rel_diff"] > rows[WRONG.name]["tol"]


def test_perf_run_marks_the_mismatch_in_its_report():
    doc = perf.run(replace(work.QUICK, threads=(1,)), only=("fwd/gated_head/test.gated_log2/B1_T128",), peers=(WRONG,),
                   progress=False)
    (check,) = doc["crosscheck"]
    assert check["status"] == "MISMATCH"
    assert f"| {WRONG.name} | gated_head | chunk |" in render_markdown(doc)
    assert "| MISMATCH |" in render_markdown(doc)
