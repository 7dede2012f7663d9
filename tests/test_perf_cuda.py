"""``linattn perf --device cuda`` on a CPU: the plan (a dry run), the refusal without a CUDA device, and the
measure -> ratios -> schema -> Markdown path with stand-in implementations on CPU tensors. Nothing here asserts a
timing; the real measurement needs a GPU (scripts/gpu_check.sh)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from linattn.tools.harness.results import load_schema, validate
from linattn.tools.perf import cli as perf_cli
from linattn.tools.perf import cuda as pc
from linattn.tools.perf import peers as pp
from linattn.tools.perf import work
from linattn.tools.perf.cuda_report import attach_ratios, render_markdown

FLA_SHAPES = [(1, 8192, 96, 128), (2, 16384, 16, 128)]


def test_plan_covers_fla_shapes_the_seed_every_variant_both_passes():
    cases = pc.plan()
    names = [c.name for c in cases]
    assert len(names) == len(set(names)) == 3 * (2 + 5 * 2 * 2)
    assert {c.shape for c in cases} == {*FLA_SHAPES, (1, 8192, 8, 64)}
    for shape in {c.shape for c in cases}:
        here = [c for c in cases if c.shape == shape]
        assert {(c.group, c.impl) for c in here if c.variant == "softmax"} == {("fwd", "torch.sdpa"),
                                                                              ("fwdbwd", "torch.sdpa")}
        for variant in pp.VARIANTS:
            got = {(c.group, c.impl) for c in here if c.variant == variant}
            assert got == {(g, i) for g in ("fwd", "fwdbwd") for i in ("linattn.triton", pc.FLA[variant])}
    # the work counts are perf's fixed formulas (forward+backward three times the forward)
    c = next(c for c in cases if c.name == "fwdbwd/gated_delta/linattn.triton/B1_T8192_H96_D128")
    assert c.flops == work.rule_flops("gated_delta", 1, 8192, 96, 128, 128, backward=True)
    assert pc.FLA == {"accumulate": "fla.chunk_linear_attn", "gated_head": "fla.chunk_simple_gla",
                      "gated_channel": "fla.chunk_gla", "delta": "fla.chunk_delta_rule",
                      "gated_delta": "fla.chunk_gated_delta_rule"}


def test_estimate_counts_every_timed_call():
    cfg = replace(pc.FULL, warmup=2, repeats=10, samples=10)
    case = pc.CudaCase("x", "fwd", "delta", "linattn.triton", (1, 1, 1, 1), int(50e12))
    back = replace(case, group="fwdbwd")
    est = pc.estimate([case, back], cfg, tflops=50.0)
    assert est["timed_calls_s"] == pytest.approx((2 + 10 + 10) + (2 + 5 + 10))


def test_dry_run_lists_cases_without_a_gpu():
    out = CliRunner().invoke(perf_cli.command, ["--device", "cuda", "--list", "--only", "fwd/delta/"])
    assert out.exit_code == 0, out.output
    lines = out.output.strip().splitlines()
    assert [ln.split()[0] for ln in lines[:-1]] == [
        f"fwd/delta/{impl}/{tag}" for tag in ("B1_T8192_H96_D128", "B2_T16384_H16_D128", "B1_T8192_H8_D64")
        for impl in ("linattn.triton", "fla.chunk_delta_rule")]
    assert lines[-1].startswith("6 cases;") and "no case starts after 200 s" in lines[-1]
    bad = CliRunner().invoke(perf_cli.command, ["--device", "cuda", "--list", "--only", "no/such"])
    assert bad.exit_code == 2 and "no case matches" in bad.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_the_run_is_refused_by_name(tmp_path):
    out = CliRunner().invoke(perf_cli.command, ["--device", "cuda", "--output", str(tmp_path / "x.json")])
    assert out.exit_code == 1
    assert "--device cuda: no CUDA device is present" in out.output
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(pc.NoCudaDevice, match="no CUDA device is present"):
        pc.run(pc.QUICK)


def test_interpreter_is_refused_on_a_cuda_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(pc.NoCudaDevice, match="TRITON_INTERPRET=1"):
        pc.require_cuda()


def _stand_ins(impl, variant, cfg):
    """linattn's torch chunk form for linattn and a token loop for the peer (the same function by two routes),
    SDPA as itself; the gated-per-channel peer fails, as a peer may."""
    if impl == pc.SDPA:
        return pp.sdpa
    if impl == pc.LINATTN:
        return pc.linattn_fn(cfg.chunk_size, backend="torch")
    if variant == "gated_channel":
        raise RuntimeError("stand-in peer failure")

    def loop(x):
        return pc.linattn_fn(cfg.chunk_size, backend="torch")(x) * 1.0

    return loop


TINY = replace(pc.QUICK, shapes=((1, 40, 2, 16),), check_shape=(1, 20, 2, 16), repeats=2, samples=1, warmup=1,
               matmul_n=64, copy_numel=1 << 12)


def test_run_on_cpu_with_stand_ins_gives_a_valid_document_and_report():
    doc = pc.run(TINY, only=("fwd/gated_delta", "fwdbwd/gated_channel", "softmax"), device="cpu",
                 impls=_stand_ins)
    validate(json.loads(json.dumps(doc)), load_schema("perf_cuda"))
    rows = {r["name"]: r for r in doc["cases"]}
    ok = rows["fwd/gated_delta/linattn.triton/B1_T40_H2_D16"]
    peer = rows["fwd/gated_delta/fla.chunk_gated_delta_rule/B1_T40_H2_D16"]
    assert ok["status"] == peer["status"] == "ok" and ok["median_ms"] > 0
    assert ok["fla_over_linattn"] == pytest.approx(peer["median_ms"] / ok["median_ms"])
    assert peer["fla_over_linattn"] == ok["fla_over_linattn"]
    sdpa = rows["fwd/softmax/torch.sdpa/B1_T40_H2_D16"]
    assert ok["sdpa_over_this"] == pytest.approx(sdpa["median_ms"] / ok["median_ms"])
    assert ok["tflops"] == pytest.approx(ok["flops"] / ok["median_ms"] / 1e9)
    assert ok["frac_matmul"] == pytest.approx(ok["tflops"] / doc["machine"]["matmul"]["tflops"])
    failed = rows["fwdbwd/gated_channel/fla.chunk_gla/B1_T40_H2_D16"]
    assert failed["status"] == "error" and "stand-in peer failure" in failed["reason"]
    assert rows["fwdbwd/gated_channel/linattn.triton/B1_T40_H2_D16"]["fla_over_linattn"] is None
    # the cross-check: the torch form against float64 on bfloat16-rounded inputs, output and gradients
    for c in doc["crosscheck"]:
        assert c[pc.LINATTN]["out_max_rel_err"] < 2e-2 and c[pc.LINATTN]["grad_max_rel_err"] < 2e-2, c
    assert "error" in next(c for c in doc["crosscheck"] if c["variant"] == "gated_channel")["fla.chunk_gla"]
    md = render_markdown(doc)
    assert "## B=1, T=40, H=2, D=16" in md and "| gated_delta | fla.chunk_gated_delta_rule | fwd |" in md
    assert "fwdbwd/gated_channel/fla.chunk_gla/B1_T40_H2_D16: error" in md


def test_budget_skips_cases_not_started_in_time():
    doc = pc.run(replace(TINY, budget_s=1e-9), only=("fwd/delta/",), device="cpu", impls=_stand_ins)
    assert [r["status"] for r in doc["cases"]] == ["skipped", "skipped"]
    assert "budget" in doc["cases"][0]["reason"]
    validate(json.loads(json.dumps(doc)), load_schema("perf_cuda"))


def test_ratios_leave_missing_pairs_empty():
    def row(impl, ms, variant="delta"):
        return {"group": "fwd", "variant": variant, "impl": impl, "median_ms": ms,
                "shape": {"B": 1, "T": 8, "H": 1, "D": 4}}

    rows = [row("linattn.triton", 2.0), row("fla.chunk_delta_rule", 3.0), row("linattn.triton", 1.0, "gated_head"),
            row("torch.sdpa", 4.0, "softmax")]
    attach_ratios(rows)
    assert rows[0]["fla_over_linattn"] == rows[1]["fla_over_linattn"] == 1.5
    assert rows[2]["fla_over_linattn"] is None and rows[2]["sdpa_over_this"] == 4.0
    assert rows[3]["sdpa_over_this"] is None


@pytest.mark.slow
def test_run_with_the_triton_kernels_under_the_interpreter():
    """The real linattn path (backend='triton', interpreted on CPU tensors), the peer a stand-in."""
    import linattn.kernels.triton as kt

    if torch.cuda.is_available() or not kt.interpreted():
        pytest.skip("needs the interpreter on a CPU machine")

    def impls(impl, variant, cfg):
        return pc.impl_fn(impl, variant, cfg) if impl == pc.LINATTN else _stand_ins(impl, variant, cfg)

    doc = pc.run(TINY, only=("fwdbwd/delta/", "fwd/gated_head/"), device="cpu", impls=impls)
    assert all(r["status"] == "ok" for r in doc["cases"])
    for c in doc["crosscheck"]:
        assert c[pc.LINATTN]["out_max_rel_err"] < 2e-2 and c[pc.LINATTN]["grad_max_rel_err"] < 2e-2, c
