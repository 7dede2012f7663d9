"""`linattn bench` and the shared result-file helpers: formulas, schema, files, decision, CLI (tiny sizes only)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from linattn.tools.bench import cli as bench
from linattn.tools.bench import plan as bench_plan
from linattn.tools.bench import report as bench_report
from linattn.tools.bench import workload as bench_workload
from linattn.tools.harness import results

TINY = ["--sequence-lengths", "4,8", "--query-heads", "2", "--head-dim", "4", "--warmup", "1", "--repeats", "3"]


# ------------------------------------------------------------------------------------------------- formulas
def test_state_bytes_formulas_match_the_issue_numbers():
    assert bench_plan.state_matrix_bytes(1, 8, 64, 64, "bfloat16") == 65_536
    assert bench_plan.state_matrix_bytes(1, 8, 64, 64, "float32") == 131_072
    assert bench_plan.kv_history_bytes(1, 8, 512, 64, "bfloat16") == 2**20  # 1 MiB
    assert bench_plan.kv_history_bytes(1, 8, 8192, 64, "bfloat16") == 16 * 2**20
    # z adds B*H*Dk elements; rules without a normalizer keep S alone
    assert bench_plan.recurrent_state_bytes(1, 8, 64, 64, "float32", normalizer=True) == 131_072 + 8 * 64 * 4
    assert bench_plan.recurrent_state_bytes(1, 8, 64, 64, "float32", normalizer=False) == 131_072


@pytest.mark.parametrize("rule", ["accumulate", "delta"])
def test_paths_keep_exactly_the_bytes_of_the_formulas(rule):
    plan = bench_plan.Plan(
        sequence_lengths=(6, 12), query_heads=3, head_dim=8, dtype="bfloat16", state_dtype="float32", rules=(rule,)
    )
    tokens = bench_workload.make_tokens(plan)
    with torch.no_grad():
        for L in plan.sequence_lengths:
            kv = bench_workload.KVHistoryPath(tokens, L, "cpu")
            assert bench_workload._storage_bytes(kv.kept()) == bench_plan.kv_history_bytes(1, 3, L, 8, "bfloat16")
            st = bench_workload.RecurrentStatePath(rule, tokens, L, "cpu", "float32")
            st.step()
            want = bench_plan.recurrent_state_bytes(1, 3, 8, 8, "float32", normalizer=rule == "accumulate")
            assert bench_workload._storage_bytes(st.kept()) == want
            assert st.matrix_bytes() == bench_plan.state_matrix_bytes(1, 3, 8, 8, "float32")


def test_state_step_updates_in_place():
    plan = bench_plan.Plan(sequence_lengths=(5,), query_heads=2, head_dim=4)
    path = bench_workload.RecurrentStatePath("accumulate", bench_workload.make_tokens(plan), 5, "cpu", "float32")
    with torch.no_grad():
        path.step()
        ptr = path.state.S.untyped_storage().data_ptr()
        before = path.state.z.clone()
        path.step()
    assert path.state.S.untyped_storage().data_ptr() == ptr
    assert not torch.equal(path.state.z, before)  # it did write


def test_baseline_step_equals_softmax_attention_over_history_and_token():
    plan = bench_plan.Plan(sequence_lengths=(7,), query_heads=2, head_dim=4)
    tok = bench_workload.make_tokens(plan)
    o = bench_workload.KVHistoryPath(tok, 7, "cpu").step()
    K = torch.cat([tok.k_hist[:, :, :6], tok.k.unsqueeze(2)], dim=2)
    V = torch.cat([tok.v_hist[:, :, :6], tok.v.unsqueeze(2)], dim=2)
    w = torch.softmax(torch.einsum("bhd,bhld->bhl", tok.q, K) / 2.0, dim=-1)  # 1/sqrt(4)
    torch.testing.assert_close(o, torch.einsum("bhl,bhld->bhd", w, V))


# ------------------------------------------------------------------------------------------------- planning
def test_parse_lengths():
    assert bench_plan.parse_lengths("2048, 512,8192") == (512, 2048, 8192)
    for bad in ("", "a,b", "1,4", "4,4"):
        with pytest.raises(ValueError, match="sequence lengths"):
            bench_plan.parse_lengths(bad)


def test_device_and_dtype_resolution():
    assert bench_plan.resolve_device("auto", cuda_available=True) == "cuda"
    assert bench_plan.resolve_device("auto", cuda_available=False) == "cpu"
    assert bench_plan.resolve_device("cuda", cuda_available=False) == "cuda"  # preflight reports it
    with pytest.raises(ValueError, match="device"):
        bench_plan.resolve_device("tpu", cuda_available=False)
    assert bench_plan.resolve_dtype("auto", "cuda") == "bfloat16"
    assert bench_plan.resolve_dtype("auto", "cpu") == "float32"
    assert bench_plan.resolve_dtype("bfloat16", "cpu") == "bfloat16"


def test_plan_rejects_bad_values():
    with pytest.raises(ValueError, match="rules"):
        bench_plan.Plan(rules=("softmax",))
    with pytest.raises(ValueError, match="repeats"):
        bench_plan.Plan(repeats=0)
    with pytest.raises(ValueError, match="device"):
        bench_plan.Plan(device="auto")


def test_preflight_without_cuda_fails_with_a_reason():
    checks, failure = bench_plan.preflight(bench_plan.Plan(device="cuda", dtype="bfloat16"), cuda_available=False)
    assert failure["stage"] == "preflight" and "cuda" in failure["message"]
    assert checks[-1] == {"check": "device", "ok": False, "detail": checks[-1]["detail"]}


def test_preflight_cuda_plan_passes_when_device_dtype_and_memory_are_fine():
    plan = bench_plan.Plan(device="cuda", dtype="bfloat16")
    checks, failure = bench_plan.preflight(plan, cuda_available=True, available_bytes=10**12, smoke_test=lambda p: None)
    assert failure is None and [c["check"] for c in checks] == ["device", "dtype", "memory"]


def test_preflight_memory_and_dtype_failures():
    plan = bench_plan.Plan()
    need = bench_plan.estimate_bytes(plan)["host"]
    _, failure = bench_plan.preflight(plan, available_bytes=need // 2)
    assert failure["message"].startswith("memory:")

    def broken(p):
        raise RuntimeError("bfloat16 not supported here")

    _, failure = bench_plan.preflight(plan, available_bytes=10**12, smoke_test=broken)
    assert failure["message"].startswith("dtype:") and "not supported" in failure["message"]


# ------------------------------------------------------------------------------------------------- decision
def _rows(hist=(2048, 4096), state=(100, 100), finite=True, cand="fixed_recurrent_state"):
    rows = []
    for L, hb, sb in zip((4, 8), hist, state, strict=True):
        common = {
            "sequence_length": L,
            "mean_step_ms": 1.0,
            "median_step_ms": 1.0,
            "p90_step_ms": 1.0,
            "peak_memory_mb": 1.0,
            "outputs_finite": True,
            "repeats": 3,
        }
        rows.append({**common, "path": bench_plan.BASELINE, "state_bytes": hb, "state_matrix_bytes": None})
        rows.append({**common, "path": cand, "state_bytes": sb, "state_matrix_bytes": sb, "outputs_finite": finite})
    return rows


def _decide(rows, **kw):
    return bench_report.decide(rows, candidate_paths=["fixed_recurrent_state"], **kw)


def test_decide_accepts_growth_with_constant_state():
    ok = {"path": "fixed_recurrent_state", "passed": True}
    d = _decide(_rows(), reference_checks=[ok])
    assert d["outcome"] == "accept_fixed_state_growth_mechanism"
    assert d["checks"] == {
        "history_bytes_grow": True,
        "state_bytes_constant": True,
        "outputs_finite": True,
        "reference_match": True,
    }


def test_decide_rejects_and_stays_inconclusive_for_the_right_reasons():
    assert _decide(_rows(finite=False))["outcome"] == "reject_non_finite_outputs"
    assert _decide(_rows(state=(100, 200)))["outcome"] == "reject_state_bytes_grow"
    assert _decide(_rows(hist=(2048, 2048)))["outcome"] == "inconclusive_history_not_growing"
    bad = {
        "path": "fixed_recurrent_state",
        "sequence_length": 4,
        "passed": False,
        "max_abs_error": 1.0,
        "tolerance": 1e-4,
    }
    assert _decide(_rows(), reference_checks=[bad])["outcome"] == "reject_reference_mismatch"
    failed = _decide(_rows(), failure={"stage": "measure", "message": "CUDA out of memory"})
    assert failed["outcome"] == "inconclusive_run_failed" and "out of memory" in failed["reason"]
    assert _decide(_rows()[:2])["outcome"] == "inconclusive_too_few_lengths"
    missing = _decide(_rows()[:3], lengths=[4, 8])
    assert missing["outcome"] == "inconclusive_missing_rows" and "fixed_recurrent_state@L=8" in missing["reason"]


def test_time_crossover_interpolates_in_log_log():
    # baseline time proportional to L, candidate constant 0.5 ms: equal at L = 500
    L, note = bench_report.time_crossover([100, 1000], [0.1, 1.0], [0.5, 0.5])
    assert L == pytest.approx(500.0) and "faster" in note
    L, note = bench_report.time_crossover([100, 1000], [1.0, 2.0], [0.5, 0.5])
    assert L is None and "faster at every measured L" in note
    L, note = bench_report.time_crossover([100, 1000], [0.1, 0.2], [0.5, 0.5])
    assert L is None and "no crossover up to L=1000" in note


def test_compare_bytes_crossover_is_state_over_per_token_history():
    comparisons, crossovers = bench_report.compare(
        _rows(hist=(2048, 4096), state=(1000, 1000)), ["fixed_recurrent_state"]
    )
    assert crossovers[0]["bytes_crossover_length"] == pytest.approx(1000 / 512)  # 4096 bytes / 8 tokens
    assert [c["history_to_state_bytes"] for c in comparisons] == [2.048, 4.096]


# ------------------------------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def doc():
    """A real (tiny) measured document, made once."""
    plan = bench_plan.Plan(
        sequence_lengths=(4, 8), query_heads=2, head_dim=4, warmup=1, repeats=2, rules=("accumulate", "gated_delta")
    )
    identity = {
        "semantic_id": "ARCH-RECURRENT-STATE-MECHANISM",
        "workload_id": "arch-linear-recurrence-v2",
        "run_label": "t",
        "profile_id": "cpu-float32",
        "created_utc": "2025-01-01T00:00:00Z",
        "linattn_version": "0.1.0",
    }
    return bench.run(plan, identity)


def test_measured_document_is_valid_and_sensible(doc):
    results.validate(doc, results.load_schema("bench_result"))
    assert doc["failure"] is None
    # this machine may be busy: then the run says so, with reasons, instead of claiming clean timings
    assert doc["evidence_level"] == ("disturbed" if doc["contention"]["disturbed"] else "measured")
    assert doc["contention"]["disturbed"] == bool(doc["contention"]["reasons"])
    assert doc["decision"]["outcome"] == "accept_fixed_state_growth_mechanism"
    rows = {(r["path"], r["sequence_length"]): r for r in doc["metrics"]["rows"]}
    assert rows[(bench_plan.BASELINE, 8)]["state_bytes"] == bench_plan.kv_history_bytes(1, 2, 8, 4, "float32")
    assert rows[("fixed_recurrent_state", 8)]["state_bytes"] == 2 * 4 * 5 * 4  # S and z: [1, 2, 4, 4 + 1] float32
    assert rows[("fixed_recurrent_state_gated_delta", 8)]["state_matrix_bytes"] == 2 * 4 * 4 * 4
    assert all(r["peak_memory_mb"] * bench_plan.MIB >= r["state_bytes"] for r in rows.values())
    assert [c["passed"] for c in doc["metrics"]["reference_checks"]] == [True, True]
    assert all(c["max_abs_error"] < 1e-5 for c in doc["metrics"]["reference_checks"])


def test_schema_missing_fields_are_named(doc, tmp_path):
    bad = copy.deepcopy(doc)
    del bad["decision"]
    del bad["identity"]["run_label"]
    del bad["metrics"]["rows"][1]["median_step_ms"]
    with pytest.raises(results.ResultValidationError) as info:
        results.validate(bad, results.load_schema("bench_result"))
    assert set(info.value.missing) == {"decision", "identity.run_label", "metrics.rows[1].median_step_ms"}
    assert "identity.run_label" in str(info.value)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"missing fields: .*decision"):
        results.read_result(path, "bench_result")


def test_schema_wrong_type_and_extra_field(doc):
    bad = copy.deepcopy(doc)
    bad["metrics"]["rows"][0]["median_step_ms"] = "fast"
    with pytest.raises(results.ResultValidationError, match=r"metrics\.rows\[0\]\.median_step_ms"):
        results.validate(bad, results.load_schema("bench_result"))
    bad = copy.deepcopy(doc)
    bad["notes"] = "x"
    with pytest.raises(results.ResultValidationError, match="notes"):
        results.validate(bad, results.load_schema("bench_result"))
    bad = copy.deepcopy(doc)
    bad["metrics"]["rows"][1]["state_matrix_bytes"] = None  # a candidate row must give S's bytes
    with pytest.raises(results.ResultValidationError, match="state_matrix_bytes"):
        results.validate(bad, results.load_schema("bench_result"))


def test_write_refuses_overwrite_and_read_round_trips(doc, tmp_path):
    path = tmp_path / "r.json"
    results.write_result(doc, path, "bench_result")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        results.write_result(doc, path, "bench_result")
    changed = copy.deepcopy(doc)
    changed["identity"]["profile_id"] = "other"
    results.write_result(changed, path, "bench_result", overwrite=True)
    assert results.read_result(path, "bench_result")["identity"]["profile_id"] == "other"


def test_invalid_document_is_not_written(doc, tmp_path):
    bad = copy.deepcopy(doc)
    del bad["failure"]
    with pytest.raises(results.ResultValidationError, match="failure"):
        results.write_result(bad, tmp_path / "r.json", "bench_result")
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_leaves_nothing_when_interrupted(tmp_path):
    target = tmp_path / "out.json"

    def half_then_crash(tmp: Path) -> None:
        tmp.write_text('{"half": ')
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        results.atomic_write(target, half_then_crash)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):  # NaN is not JSON: refused before anything lands
        results.atomic_write_json(target, {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []
    target.write_text("old")
    with pytest.raises(FileExistsError):
        results.atomic_write_json(target, {"x": 1})
    assert target.read_text() == "old" and len(list(tmp_path.iterdir())) == 1


@pytest.mark.parametrize("label", ["../evil", "a/b", "", ".hidden", "a b", "a..b", "x" * 101, "tab\t"])
def test_bad_labels_are_refused(label):
    with pytest.raises(ValueError, match="run_label"):
        results.check_label(label)
    with pytest.raises(ValueError):
        results.default_result_path("d", "arch-linear-recurrence-v2", label)


def test_good_label_and_default_path():
    assert results.check_label("cpu-reference_v1.2") == "cpu-reference_v1.2"
    p = results.default_result_path("benchmarks/results", "arch-linear-recurrence-v2", "cpu-reference")
    assert p == Path("benchmarks/results/arch-linear-recurrence-v2_cpu-reference.json")


# ------------------------------------------------------------------------------------------------- CLI
def test_cli_dry_run_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(bench.command, [*TINY, "--dry-run", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "explicit_kv_history: K+V bytes L=4: 256, L=8: 512" in res.output
    assert "dry run: environment ok" in res.output
    assert list(tmp_path.iterdir()) == []


def test_cli_cuda_without_gpu_fails_cleanly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for extra in (["--dry-run"], []):
        res = CliRunner().invoke(bench.command, [*TINY, "--device", "cuda", *extra])
        assert res.exit_code == 1
        assert "failure (preflight): device:" in res.output and "bfloat16 tokens" in res.output
    assert list(tmp_path.iterdir()) == []


def test_cli_run_show_plot_and_refusals(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(bench.command, [*TINY, "--run-label", "a", "--plot", "a.png"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "benchmarks/results/arch-linear-recurrence-v2_a.json"
    assert out.exists() and (tmp_path / "a.png").stat().st_size > 1000
    assert "accept_fixed_state_growth_mechanism" in res.output and "fixed_recurrent_state" in res.output
    # the same label again is refused before anything runs
    res = runner.invoke(bench.command, [*TINY, "--run-label", "a"])
    assert res.exit_code == 2 and "refusing to overwrite" in res.output
    res = runner.invoke(bench.command, [*TINY, "--run-label", "../a"])
    assert res.exit_code == 2 and "run_label" in res.output
    # default label: <device>-<UTC time>
    res = runner.invoke(bench.command, [*TINY, "--output", "b.json"])
    assert res.exit_code == 0, res.output
    label = json.loads((tmp_path / "b.json").read_text())["identity"]["run_label"]
    assert re.fullmatch(r"cpu-\d{8}T\d{6}Z", label)
    res = runner.invoke(bench.command, ["show", str(out), "b.json", "--plot", "both.png"])
    assert res.exit_code == 0, res.output
    assert "[1]" in res.output and "[2]" in res.output and (tmp_path / "both.png").exists()
    res = runner.invoke(bench.command, ["show", str(out), "--plot", "both.png"])
    assert res.exit_code == 2 and "refusing to overwrite" in res.output


def test_cli_show_names_missing_fields(tmp_path, doc):
    bad = copy.deepcopy(doc)
    del bad["hardware"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    res = CliRunner().invoke(bench.command, ["show", str(path)])
    assert res.exit_code == 2 and "missing fields: hardware" in res.output


def test_cli_records_a_failure_mid_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    real = bench_workload.reference_check

    def boom(*args, **kwargs):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(bench_workload, "reference_check", boom)
    res = CliRunner().invoke(bench.command, [*TINY, "--run-label", "f"])
    monkeypatch.setattr(bench_workload, "reference_check", real)
    assert res.exit_code == 1
    doc = results.read_result(tmp_path / "benchmarks/results/arch-linear-recurrence-v2_f.json", "bench_result")
    assert doc["evidence_level"] == "incomplete" and "simulated out of memory" in doc["failure"]["message"]
    assert doc["decision"]["outcome"] == "inconclusive_run_failed"
    assert len(doc["metrics"]["rows"]) == 2  # the rows measured before the failure, none invented


def test_time_cpu_takes_turns_keeps_first_output_and_flags_non_finite():
    calls: list[str] = []

    def path(name: str, bad_call: int | None = None):
        count = 0

        def step() -> torch.Tensor:
            nonlocal count
            count += 1
            calls.append(name)
            return torch.tensor([float("inf") if count == bad_call else float(count)])

        return step

    ticks = []
    out = bench_workload.time_cpu(
        [path("a"), path("b", bad_call=7)], warmup=2, repeats=15, tick=lambda: ticks.append(1), block=10
    )
    assert calls == ["a"] * 2 + ["b"] * 2 + ["a"] * 10 + ["b"] * 10 + ["a"] * 5 + ["b"] * 5
    assert len(ticks) == 34
    (stats_a, first_a, finite_a), (_, first_b, finite_b) = out
    assert first_a.item() == 1.0 and first_b.item() == 1.0
    assert finite_a and not finite_b
    assert set(stats_a) == {"mean_step_ms", "median_step_ms", "p90_step_ms", "min_step_ms"}
    assert stats_a["min_step_ms"] <= stats_a["median_step_ms"] <= stats_a["p90_step_ms"]


# ------------------------------------------------------------------------------------------------- contention
def _row(path, L, median, p90=None):
    return {"path": path, "sequence_length": L, "median_step_ms": median, "p90_step_ms": p90 or median * 1.2}


QUIET_ROWS = [_row(bench_plan.BASELINE, 512, 0.03), _row("fixed_recurrent_state", 512, 0.05),
              _row(bench_plan.BASELINE, 8192, 0.7), _row("fixed_recurrent_state", 8192, 0.055)]


def _assess(rows, before=0.0, during=0.0, cores=2, threads=1):
    return bench_report.assess_contention(rows, cores=cores, threads=threads, threads_source="test",
                                          others_before=before, others_during=during, loadavg_before=[0.1, 0.2, 0.3])


def test_contention_quiet_run_is_measured():
    c = _assess(QUIET_ROWS, before=0.1, during=0.3)  # 0.3 of 2 cores: under 20%
    assert not c["disturbed"] and c["reasons"] == []
    assert bench_report.evidence_level(None, c) == "measured"


def test_contention_is_flagged_from_other_processes_before_or_during_the_run():
    c = _assess(QUIET_ROWS, during=1.0)
    assert c["disturbed"] and "1.00 of 2 cores busy on average during the run" in c["reasons"][0]
    c = _assess(QUIET_ROWS, before=1.9, threads=2)
    assert "before the run" in c["reasons"][0] and "more than there are cores" in c["reasons"][0]
    assert bench_report.evidence_level(None, c) == "disturbed"
    assert bench_report.evidence_level({"stage": "measure", "message": "x"}, c) == "incomplete"
    # where /proc is missing nothing is claimed either way from the meter
    assert not _assess(QUIET_ROWS, before=None, during=None)["disturbed"]


def test_contention_is_flagged_from_the_timings_themselves():
    # the 12-24 ms steps of the busy 2-thread run: the state's step (same work at every L) moved 480-fold
    rows = [_row(bench_plan.BASELINE, 512, 0.03), _row("fixed_recurrent_state", 512, 0.05),
            _row(bench_plan.BASELINE, 8192, 11.9), _row("fixed_recurrent_state", 8192, 24.0)]
    c = _assess(rows)
    assert c["disturbed"] and any("fixed_recurrent_state: median step 0.05 to 24 ms" in r for r in c["reasons"])
    # a quiet machine with 2 threads: medians fine, p90 hundreds of times the median
    c = _assess([_row(bench_plan.BASELINE, 512, 0.031, p90=7.98)] + QUIET_ROWS[1:])
    assert c["disturbed"] and "p90 step 7.98 ms is 257x the median" in c["reasons"][0]


def test_schema_2_requires_contention_and_schema_1_files_stay_valid(doc):
    schema = results.load_schema("bench_result")
    assert doc["schema_version"] == 2 and doc["contention"]["method"]
    bad = copy.deepcopy(doc)
    del bad["contention"]
    with pytest.raises(results.ResultValidationError, match="missing fields: contention"):
        results.validate(bad, schema)
    old = copy.deepcopy(doc)  # a file written before contention was measured
    old["schema_version"] = 1
    del old["contention"]
    old["evidence_level"] = "measured"
    results.validate(old, schema)
    old["evidence_level"] = "disturbed"  # a level version 1 did not have
    with pytest.raises(results.ResultValidationError):
        results.validate(old, schema)
    assert "contention was not recorded" in bench_report.format_table([{**old, "evidence_level": "measured"}])


def test_default_threads_one_on_small_cpu_machines():
    assert bench.default_threads("cpu", 2)[0] == 1 and bench.default_threads("cpu", 4)[0] == 1
    assert bench.default_threads("cpu", 64)[0] is None and bench.default_threads("cuda", 2)[0] is None
    assert bench.default_threads("cpu", None)[0] is None


def test_cli_warns_and_records_a_disturbed_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench.machine, "others_busy_now", lambda seconds=0.3: 1.5)

    class Busy:
        def start(self):
            return self

        def stop(self):
            return 1.5

    monkeypatch.setattr(bench, "BusyMeter", Busy)
    threads = torch.get_num_threads()
    res = CliRunner().invoke(bench.command, [*TINY, "--output", "r.json", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert torch.get_num_threads() == threads  # the command restores the caller's setting
    assert "warning: the machine is busy (other processes kept 1.50 of" in res.stderr
    assert "WARNING: timings disturbed" in res.stdout and "warning: timings disturbed" in res.stderr
    assert "bench:" not in res.stderr and "step/s" not in res.stderr  # --no-progress: no bar
    saved = results.read_result(tmp_path / "r.json", "bench_result")
    assert saved["evidence_level"] == "disturbed"
    assert saved["contention"]["others_cpu_cores"] == 1.5 and saved["contention"]["others_cpu_cores_before"] == 1.5
    assert saved["contention"]["reasons"][0].startswith("other processes kept 1.50 of")
    assert f"wrote {tmp_path / 'r.json'}" in res.stdout  # the absolute path


def test_cli_quiet_run_is_measured_and_says_which_threads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(bench.machine, "others_busy_now", lambda seconds=0.3: 0.0)
    monkeypatch.setattr(bench.bench_report, "assess_contention", lambda rows, **kw: _quiet(kw))
    res = CliRunner().invoke(bench.command, [*TINY, "--output", "r.json", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "threads: 1 (--threads)" in res.stderr and "warning" not in res.output.lower()
    assert results.read_result(tmp_path / "r.json", "bench_result")["evidence_level"] == "measured"


def _quiet(kw):
    return {"disturbed": False, "reasons": [], "cores": kw["cores"], "threads": kw["threads"],
            "threads_source": kw["threads_source"], "others_cpu_cores_before": kw["others_before"],
            "others_cpu_cores": kw["others_during"], "loadavg_before": kw["loadavg_before"], "method": "test"}


def test_show_plot_names_runs_and_draws_shared_guides_once(doc, tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    drawn = {}
    real = Figure.savefig

    def keep(self, *args, **kwargs):
        drawn["fig"] = self
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    other = copy.deepcopy(doc)
    other["identity"]["run_label"] = "second"
    bench_report.plot_results([doc, other], tmp_path / "two.png")
    fig = drawn["fig"]
    title = fig._suptitle.get_text()
    assert "[1] arch-linear-recurrence-v2_t:" in title and "[2] arch-linear-recurrence-v2_second:" in title
    ax_b = fig.axes[0]
    labels = [t.get_text() for t in ax_b.get_legend().get_texts()]
    assert sum("KV bytes" in label for label in labels) == 1  # the same line in both runs: drawn once
    marks = [t.get_text() for t in ax_b.texts]
    assert marks == ["[1, 2] bytes equal at L=2"]  # both candidates of both runs at one L: one label


def test_docs_excerpt_is_the_committed_result():
    """docs/bench.md quotes `linattn bench show` of the committed reference file, line for line."""
    root = Path(__file__).resolve().parents[1]
    path = root / "benchmarks/results/arch-linear-recurrence-v2_cpu-reference.json"
    table = bench_report.format_table([results.read_result(path, bench_report.SCHEMA)])
    assert table.strip() in (root / "docs" / "bench.md").read_text(encoding="utf-8")
