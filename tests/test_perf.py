"""``linattn perf``: FLOP/byte formulas, case selection, peak memory, one tiny run at 1 and 2 threads (structure,
fractions of the in-run rates, thread scaling, rendering), and peers that are missing. Nothing here asserts a
timing; peers are stand-ins so the tests need no optional package."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from linattn.tools.harness.results import load_schema, validate
from linattn.tools.perf import cli as perf_cli
from linattn.tools.perf import cpu as perf
from linattn.tools.perf import peers as pp
from linattn.tools.perf import report, work
from linattn.tools.perf.work import decode_bytes, decode_flops, rule_flops, sdpa_flops, seq_bytes


def _recurrent_as_peer(fn, inp: pp.Inputs) -> torch.Tensor:
    """A stand-in peer: linattn's token loop, the same function as the chunk form, by another route."""
    return fn(inp.q, inp.k, inp.v, form="recurrent", eps=pp.EPS)[0]


FAKE = pp.Peer("test.recurrent_as_peer", "linattn", "linear_attention", "accumulate", "chunk", _recurrent_as_peer,
               "linattn")
MISSING = pp.Peer("test.missing", "linattn_no_such_module_xyz", "f", "delta", "chunk", _recurrent_as_peer,
                  "no-such-dist")
ONLY = ("fwd/accumulate/*/B1_T128", "fwd/delta/*/B1_T128", "decode/accumulate/linattn/B4")
# The quick configuration at two thread counts and two decode batches: the full run's structure, in seconds.
TINY = replace(work.QUICK, threads=(1, 2), decode_batches=(1, 4), seq_shapes=((1, 128), (1, 512), (2, 128)),
               long=(1, 512), memory=True, quick=False)


# --- formulas ------------------------------------------------------------------------------------------------------


def test_accumulate_flops_is_the_issue_formula():
    # 4*T*H*Dk*Dv + 2*T*H*64*(Dk+Dv) at T=8192, H=8, D=64: 2^30 + 2^30
    assert rule_flops("accumulate", 1, 8192, 8, 64, 64) == 2**31
    assert rule_flops("accumulate", 3, 10, 2, 5, 7) == 3 * 10 * 2 * (4 * 5 * 7 + 2 * 64 * (5 + 7))
    # gates are elementwise: the same fixed count for both gated variants
    assert rule_flops("gated_head", 1, 8192, 8, 64, 64) == 2**31
    assert rule_flops("gated_channel", 3, 10, 2, 5, 7) == rule_flops("accumulate", 3, 10, 2, 5, 7)


def test_delta_flops_and_backward_factor():
    # 6*Dk*Dv + 2*64*(3*Dk + 2*Dv) per token and head: 24576 + 40960 = 65536 at D=64
    assert rule_flops("delta", 1, 8192, 8, 64, 64) == 2**32
    assert rule_flops("gated_delta", 2, 10, 3, 5, 7) == 2 * 10 * 3 * (6 * 35 + 2 * 64 * (15 + 14))
    assert rule_flops("delta", 1, 100, 2, 8, 8, backward=True) == 3 * rule_flops("delta", 1, 100, 2, 8, 8)
    assert sdpa_flops(2, 100, 3, 16) == 2 * 2 * 3 * 100 * 100 * 16
    assert sdpa_flops(1, 10, 1, 4, backward=True) == 3 * 2 * 10 * 10 * 4


def test_decode_counts():
    assert decode_flops("accumulate", 64, 8, 64, 64) == 64 * 8 * 4 * 64 * 64
    assert decode_flops("gated_delta", 1, 2, 3, 5) == 2 * 6 * 15
    # normalized rules move S plus z (one more value column), read once and written once, plus the token
    assert decode_bytes("accumulate", 64, 8, 64, 64) == (2 * 64 * 8 * 64 * 65 + 64 * 8 * 256) * 4
    assert decode_bytes("gated_channel", 1, 1, 4, 2) == (2 * 4 * 3 + 12 + 4) * 4
    assert decode_bytes("delta", 2, 1, 4, 2) == (2 * 2 * 4 * 2 + 2 * 12 + 2) * 4
    assert decode_bytes("gated_delta", 1, 1, 4, 2) == (2 * 4 * 2 + 12 + 2) * 4


def test_sequence_bytes():
    # forward: q, k, v, gate, beta read once, o written once
    assert seq_bytes("accumulate", 2, 10, 3, 4, 5) == 2 * 10 * 3 * (2 * 4 + 5 + 5) * 4
    assert seq_bytes("gated_channel", 1, 10, 1, 4, 5) == 10 * (2 * 4 + 5 + 4 + 5) * 4
    assert seq_bytes("gated_delta", 1, 10, 1, 4, 5) == 10 * (2 * 4 + 5 + 2 + 5) * 4
    assert seq_bytes("softmax", 1, 10, 1, 4, 4) == 10 * 16 * 4
    # forward+backward: grad_o read, inputs read again and their gradients written
    assert seq_bytes("delta", 1, 10, 1, 4, 5, backward=True) == 10 * (3 * (2 * 4 + 5 + 1) + 2 * 5) * 4


def test_unknown_variant_is_named():
    with pytest.raises(ValueError, match="variant: unknown 'linear'"):
        rule_flops("linear", 1, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="variant"):
        pp.make_inputs("linear", 1, 1, 1, 1)


# --- selection and measurement helpers -----------------------------------------------------------------------------


def test_select_patterns():
    cases = perf.build_cases(TINY, peers=(FAKE,))
    names = [c.name for c in work.select(cases, ("fwd/",))]
    assert names and all(n.startswith("fwd/") for n in names)  # a substring; "fwdbwd/" does not contain "fwd/"
    assert [c.name for c in work.select(cases, ("decode/delta/*/B4",))] == ["decode/delta/linattn/B4",
                                                                          "decode/delta/linattn.cpu/B4"]
    assert len(work.select(cases, ())) == len(cases)
    with pytest.raises(ValueError, match="only: no case matches"):
        work.select(cases, ("nothing/like/this",))


def test_cases_run_shorter_sequences_first():
    cases = perf.build_cases(work.FULL, peers=())
    ts = [c.T for c in cases if c.group == "fwd" and c.variant == "delta" and c.B == 1 and c.impl == "linattn"]
    assert ts == [2048, 8192, 32768]
    assert [c.group for c in cases][:20] == ["decode"] * 20  # torch and compiled step for each variant


def test_peak_bytes_is_a_running_maximum():
    def f():
        a = torch.empty(1000, 1000)  # 4 MB
        del a
        return torch.empty(500, 1000)  # 2 MB, after the first is freed

    assert perf.peak_bytes(f) == 4_000_000
    assert perf.peak_bytes(lambda: torch.empty(250, 1000).neg()) == 2_000_000  # input and result coexist


def test_measure_counts_calls():
    calls = []
    m = perf._measure(lambda: calls.append(1), repeats=3, min_sample_s=0.0, budget_s=100.0)
    assert len(calls) == 1 + 3 and m["samples"] == 3 and m["calls_per_sample"] == 1


def test_targets_judge_ratios_and_mismatches():
    cfg = work.FULL

    def row(group, variant, impl, ms, T=8192, mem=100):
        return {"group": group, "variant": variant, "impl": impl, "shape": {"B": 1, "T": T}, "status": "ok",
                "reason": None, "median_ms": ms, "frac_matmul": 0.5, "gflops": 165.0, "peak_mem_bytes": mem}

    results = [row("fwd", "accumulate", "linattn", 10.0), row("fwd", "accumulate", "fla.naive_chunk_linear_attn", 60.0),
               row("fwd", "delta", "linattn", 10.0), row("fwd", "delta", "fla.delta_rule_chunkwise", 40.0),
               row("fwd", "gated_delta", "linattn", 10.0),
               row("fwd", "gated_delta", "hf.torch_chunk_gated_delta_rule", 90.0)]
    results += [row("fwd", v, "linattn", 10.0) for v in ("gated_head", "gated_channel")]
    results += [row("fwd", v, "linattn", 41.0 if v == "delta" else 46.0, T=32768, mem=400) for v in pp.VARIANTS]
    checks = [{"peer": "hf.torch_chunk_gated_delta_rule", "status": "MISMATCH"}]
    rates = {"matmul": {"gflops": 330.0}}
    t = {x["id"]: x for x in report.evaluate_targets(results, rates, cfg, checks)}
    assert t["fwd_accumulate_vs_fla.naive_chunk_linear_attn"]["value"] == pytest.approx(6.0)
    assert t["fwd_accumulate_vs_fla.naive_chunk_linear_attn"]["status"] == "met"
    assert t["fwd_delta_vs_fla.delta_rule_chunkwise"]["status"] == "missed"
    assert t["fwd_gated_delta_vs_hf.torch_chunk_gated_delta_rule"]["status"] == "not measured"
    assert "MISMATCH" in t["fwd_gated_delta_vs_hf.torch_chunk_gated_delta_rule"]["detail"]
    assert t["fwd_gated_delta_vs_fla.naive_chunk_gated_delta_rule"]["status"] == "not measured"
    assert t["fwd_accumulate_matmul_fraction"]["status"] == "met"
    growth = t["fwd_linear_time"]  # worst variant 4.6x > 4.5x: missed, and the worst is the one shown
    assert (growth["value"], growth["status"]) == (pytest.approx(4.6), "missed")
    assert t["fwd_linear_peak_memory"]["status"] == "met" and t["fwd_linear_peak_memory"]["value"] == 4.0
    assert t["fwdbwd_linear_time"]["status"] == "not measured"
    assert t["decode_b64_copy_fraction"]["status"] == "not measured"


# --- one tiny run --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def doc():
    return perf.run(TINY, only=ONLY, peers=(FAKE, MISSING), progress=False)


def test_run_document_is_valid_and_complete(doc):
    validate(doc, load_schema("perf"), source="perf run")
    json.dumps(doc, allow_nan=False)
    assert [r["threads"] for r in doc["runs"]] == [1, 2]
    for run in doc["runs"]:
        assert {c["name"] for c in run["cases"]} == {
            "fwd/accumulate/linattn/B1_T128", "fwd/accumulate/test.recurrent_as_peer/B1_T128",
            "fwd/delta/linattn/B1_T128", "fwd/delta/test.missing/B1_T128", "decode/accumulate/linattn/B4",
            "fwd/accumulate/linattn.cpu/B1_T128", "fwd/delta/linattn.cpu/B1_T128"}
        assert all(c["status"] == "ok" for c in run["cases"] if c["impl"] == "linattn.cpu")
        assert run["machine"]["matmul"]["gflops"] > 0 and run["machine"]["copy"]["gbps"] > 0
    assert torch.get_num_threads() == THREADS  # the caller's setting is restored


THREADS = torch.get_num_threads()


def test_missing_peer_is_reported_not_raised(doc):
    case = next(c for c in doc["runs"][0]["cases"] if c["impl"] == "test.missing")
    assert case["status"] == "not installed" and "no-such-dist" in case["reason"] and case["median_ms"] is None
    check = next(c for c in doc["crosscheck"] if c["peer"] == "test.missing")
    assert check["status"] == "not installed"
    fake = next(c for c in doc["crosscheck"] if c["peer"] == FAKE.name)
    assert fake["status"] == "match" and fake["rel_diff"] < 1e-5


@pytest.mark.parametrize("which", [0, 1])
def test_derived_numbers_are_fractions_of_the_same_pass_rates(doc, which):
    run = doc["runs"][which]
    by = {c["name"]: c for c in run["cases"]}
    ours, peer = by["fwd/accumulate/linattn/B1_T128"], by["fwd/accumulate/test.recurrent_as_peer/B1_T128"]
    assert ours["status"] == peer["status"] == "ok"
    s = ours["median_ms"] / 1e3
    assert ours["tokens_per_s"] == pytest.approx(128 / s)
    assert ours["gflops"] == pytest.approx(rule_flops("accumulate", 1, 128, 2, 16, 16) / s / 1e9)
    assert ours["frac_matmul"] == pytest.approx(ours["gflops"] / run["machine"]["matmul"]["gflops"])
    assert ours["bytes_moved"] == seq_bytes("accumulate", 1, 128, 2, 16, 16)
    assert ours["frac_copy"] == pytest.approx(ours["bytes_moved"] / s / 1e9 / run["machine"]["copy"]["gbps"])
    ratio = peer["median_ms"] / ours["median_ms"]
    assert peer["linattn_speedup"] == pytest.approx(ratio) and ours["speedup_vs"][FAKE.name] == pytest.approx(ratio)
    assert ours["peak_mem_bytes"] >= 128 * 2 * 16 * 4  # at least the float32 output
    dec = by["decode/accumulate/linattn/B4"]
    assert dec["bytes_moved"] == decode_bytes("accumulate", 4, 2, 16, 16)
    assert dec["frac_copy"] == pytest.approx(dec["gbps"] / run["machine"]["copy"]["gbps"])
    assert dec["frac_matmul"] == pytest.approx(dec["gflops"] / run["machine"]["matmul"]["gflops"])
    assert dec["tokens_per_s"] == pytest.approx(4 / (dec["median_ms"] / 1e3))
    frac = next(t for t in run["targets"] if t["id"] == "fwd_accumulate_matmul_fraction")
    assert frac["value"] == ours["frac_matmul"] and frac["status"] == ("met" if frac["value"] >= 0.3 else "missed")
    vs_fla = next(t for t in run["targets"] if t["id"] == "fwd_accumulate_vs_fla.naive_chunk_linear_attn")
    assert vs_fla["status"] == "not measured" and "not selected" in vs_fla["detail"]


def test_thread_scaling_pairs_each_case_across_the_passes(doc):
    one, two = ({c["name"]: c for c in r["cases"]} for r in doc["runs"])
    rows = {r["name"]: r for r in doc["scaling"]}
    assert set(rows) == {n for n, c in one.items() if c["status"] == "ok"}  # the missing peer has no ratio
    for name, r in rows.items():
        assert r["threads"] == [1, 2] and r["median_ms"] == [one[name]["median_ms"], two[name]["median_ms"]]
        assert r["speedup"] == pytest.approx(one[name]["median_ms"] / two[name]["median_ms"])
        assert r["frac_matmul"] == [one[name]["frac_matmul"], two[name]["frac_matmul"]]
    t = {x["id"]: x for x in doc["scaling_targets"]}
    assert t["scaling_fwd_delta"]["value"] == rows["fwd/delta/linattn.cpu/B1_T128"]["speedup"]
    assert t["scaling_fwd_gated_delta"]["status"] == "not measured"  # not selected


def test_thread_scaling_needs_two_thread_counts():
    runs = [{"threads": 1, "cases": [{"name": "a", "status": "ok", "median_ms": 1.0}]}]
    assert report.thread_scaling(runs) == [] and report.thread_scaling(runs + runs) == []
    assert all(t["status"] == "not measured" for t in report.scaling_targets([], TINY))


def _decode_scaling(B: int, speedups: dict[str, float], H: int = 8, D: int = 64) -> list[dict]:
    return [{"name": f"decode/{v}/{work.CPU_IMPL}/B{B}", "threads": [1, 2], "speedup": x,
             "shape": {"B": B, "T": None, "H": H, "D": D}} for v, x in speedups.items()]


@pytest.mark.parametrize("split_min_work, status", [
    (None, "missed"),  # no threshold given: every ratio is judged
    (8 * 64 * 65, "missed"),  # the delta rules' 8*64*64 entries stay serial; the normalized rules' 8*64*65 split
    (8 * 64 * 65 + 1, "same kernel"),  # no variant splits: the ratios are one kernel's spread, not judged
])
def test_decode_scaling_judges_only_steps_that_split(split_min_work, status):
    ratios = {"accumulate": 0.7, "gated_head": 1.2, "gated_channel": 1.1, "delta": 0.5, "gated_delta": 1.3}
    cfg = TINY
    rows = [r for Bd in cfg.decode_batches for r in _decode_scaling(Bd, ratios)]
    t = {x["id"]: x for x in report.scaling_targets(rows, cfg, split_min_work)}["scaling_decode_b1"]
    assert t["status"] == status
    if split_min_work is None:
        assert t["value"] == 0.5 and "same kernel" not in t["detail"]
    elif status == "missed":  # judged: the normalized rules only, whose worst is accumulate's 0.7
        assert t["value"] == 0.7 and "delta 0.50x (same kernel)" in t["detail"]
        assert "accumulate 0.70x," in t["detail"]
    else:
        assert t["value"] == 0.5 and f"{split_min_work:,} entries" in t["detail"]


def test_decode_scaling_is_met_when_the_split_steps_are_not_slower():
    cfg = TINY
    ratios = {"accumulate": 1.4, "gated_head": 1.2, "gated_channel": 1.1, "delta": 0.5, "gated_delta": 0.9}
    rows = [r for Bd in cfg.decode_batches for r in _decode_scaling(Bd, ratios)]
    t = {x["id"]: x for x in report.scaling_targets(rows, cfg, 8 * 64 * 65)}
    assert t["scaling_decode_b1"]["status"] == "met" and t["scaling_decode_b1"]["value"] == 1.1
    assert t["scaling_decode_b4"]["status"] == "missed" and t["scaling_decode_b4"]["value"] == 0.5  # all split


def test_run_judges_decode_against_the_kernels_own_split_threshold():
    from linattn.backends import policy

    assert perf.decode_split_min_work() == policy.DECODE_SPLIT_MIN_ENTRIES


def test_markdown_rendering(doc):
    md = report.render_markdown(doc)
    assert md.startswith("# linattn CPU kernel benchmark\n")
    assert "## 1 thread" in md and "## 2 threads" in md and "## Thread scaling: 1 -> 2 threads" in md
    assert "### Targets at 1 thread" in md and "### Chunk forward, 2 threads" in md and "### Decode step" in md
    assert "% matmul | % copy |" in md and "| % copy | % matmul |" in md  # both fractions, every kernel
    assert "| accumulate | test.recurrent_as_peer | 1 | 128 |" in md
    assert "| delta | test.missing | 1 | 128 | not installed:" in md
    assert "| test.recurrent_as_peer | accumulate | chunk |" in md  # cross-check table
    assert "| fwd/delta/linattn.cpu/B1_T128 |" in md  # a scaling row
    assert "Chunk forward+backward" not in md  # no such case selected


# --- CLI -----------------------------------------------------------------------------------------------------------


def test_cli_writes_files_and_refuses_to_overwrite(tmp_path):
    out, md = tmp_path / "perf.json", tmp_path / "perf.md"
    args = ["--quick", "--threads", "1", "--only", "decode/gated_head/linattn/B1", "-o", str(out), "--markdown",
            str(md), "--no-progress"]
    first = CliRunner().invoke(perf_cli.command, args)
    assert first.exit_code == 0, first.output
    saved = json.loads(out.read_text())
    validate(saved, load_schema("perf"))
    assert [c["name"] for c in saved["runs"][0]["cases"]] == ["decode/gated_head/linattn/B1"]
    assert saved["scaling"] == []  # one thread count: no ratio
    assert md.read_text().startswith("# linattn CPU kernel benchmark (quick smoke configuration)")
    assert first.output.startswith("linattn perf --quick:")  # --quick prints its short summary
    again = CliRunner().invoke(perf_cli.command, args)
    assert again.exit_code == 2 and "exists; refusing to overwrite" in again.output
    assert json.loads(out.read_text()) == saved
    assert CliRunner().invoke(perf_cli.command, [*args, "--overwrite", "--no-memory"]).exit_code == 0
    assert json.loads(out.read_text())["runs"][0]["cases"][0]["peak_mem_bytes"] is None


def test_cli_only_and_list():
    listed = CliRunner().invoke(perf_cli.command,
                                ["--quick", "--list", "--only", "decode/*/B1,recurrent/delta/linattn"])
    assert listed.exit_code == 0
    expected = [f"decode/{v}/{impl}/B1" for v in pp.VARIANTS for impl in ("linattn", "linattn.cpu")]
    expected += ["recurrent/delta/linattn/B1_T128"]
    assert listed.output.split() == expected
    bad = CliRunner().invoke(perf_cli.command, ["--quick", "--only", "no/such/case"])
    assert bad.exit_code == 2 and "--only" in bad.output and "no case matches" in bad.output
    for threads in ("0", "1,1", "x", ""):
        bad = CliRunner().invoke(perf_cli.command, ["--quick", "--list", "--threads", threads])
        assert bad.exit_code == 2 and "--threads" in bad.output, threads


def test_quick_summary_is_short_and_judges_nothing(doc):
    quick = {**doc, "config": {**doc["config"], "quick": True}}
    text = report.render_quick(quick)
    lines = text.splitlines()
    assert lines[0].startswith("linattn perf --quick:") and "mean nothing" in lines[0]
    assert not any("not installed" in line for line in lines)  # named once by the command, before measuring
    assert lines[-1].endswith(", 2 cases of peers left out (test.missing).")  # one case at each thread count
    assert "test.missing/" not in text
    assert "target" not in text.replace("judge no target", "") and "met" not in text.split()
    run = doc["runs"][0]
    ms = {c["name"]: c["median_ms"] for c in run["cases"]}
    cpu_row = next(line for line in lines if line.startswith("fwd/delta/linattn.cpu/B1_T128"))
    want = ms["fwd/delta/linattn/B1_T128"] / ms["fwd/delta/linattn.cpu/B1_T128"]
    assert cpu_row.split()[-1] == f"{want:.2f}x"  # linattn's torch form / this row: bigger is faster
    assert "above 1, this row is faster" in text


def test_quick_runs_one_thread_count_by_the_tools_rule_and_no_targets(monkeypatch, tmp_path):
    from linattn.tools.harness import cli as hcli

    assert work.QUICK.threads == (1,) and work.QUICK.quick and not work.QUICK.memory
    monkeypatch.setattr(hcli.os, "cpu_count", lambda: 2)
    out = tmp_path / "q.json"
    res = CliRunner().invoke(perf_cli.command, ["--quick", "--only", "decode/accumulate/*/B1", "-o", str(out),
                                                "--no-progress"])
    assert res.exit_code == 0, res.output
    saved = json.loads(out.read_text())
    assert [r["threads"] for r in saved["runs"]] == [1]  # a small machine: one thread
    assert saved["runs"][0]["targets"] == [] and saved["scaling_targets"] == []
    assert res.output.startswith("linattn perf --quick:") and "decode/accumulate/linattn.cpu/B1" in res.output


def test_quick_names_missing_peers_once(monkeypatch):
    from linattn.tools.perf import cpu

    missing = pp.Peer("test.absent", "linattn_no_such_module_xyz", "f", "delta", "chunk", _recurrent_as_peer,
                      "no-such-dist")
    monkeypatch.setattr(pp, "PEERS", (missing,))
    real_build = cpu.build_cases
    monkeypatch.setattr(cpu, "build_cases", lambda cfg, peers=None: real_build(cfg, (missing,)))
    res = CliRunner().invoke(perf_cli.command, ["--quick", "--only", "fwd/delta/", "--no-progress"])
    assert res.exit_code == 0, res.output
    text = res.stderr + res.stdout
    assert sum("test.absent" in line for line in text.splitlines()) == 2  # the warning and the count line
    assert sum("installed" in line for line in text.splitlines()) == 1  # one line says they are missing
