"""``linattn mqar --sweep``: schema, resume after a kill, best-lr selection with the plateau rule, end to end."""

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from linattn.tools.cli import main
from linattn.tools.harness.results import ResultValidationError, load_schema, read_result, validate
from linattn.tools.mqar import sweep, sweep_runner
from linattn.tools.mqar.sweep import Job, SweepConfig
from linattn.tools.mqar.train import build_model, model_inputs

TINY = SweepConfig(mixers=("attention", "delta"), widths=(8,), settings=((16, 2, 9, 4),), lrs=(1e-2, 3e-2),
                   seeds=(0, 1), vocab_size=16, num_layers=1, num_heads=2, intermediate_size=0, val_examples=8,
                   test_examples=8, evals_per_run=3, patience=1)
TIMING = ("wall_s", "cpu_s", "session")


def _metrics(doc):
    return {Job.of(r): {k: v for k, v in r.items() if k not in TIMING} for r in doc["runs"]}


@pytest.fixture(scope="module")
def full_doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "full.json"
    doc = sweep_runner.run_sweep(TINY, output=out, progress=False)
    return doc, out


def test_uninterrupted_sweep_is_complete_and_valid(full_doc):
    doc, out = full_doc
    assert read_result(out, "mqar_sweep") == doc
    assert doc["progress"] == {"finished": 6, "total": 6, "complete": True}  # 2 mixers x 2 lrs + 2 seeds
    assert sweep.total_runs(TINY) == 6
    assert {(b["mixer"], b["seeds"] == [0, 1]) for b in doc["best"]} == {("attention", True), ("delta", True)}
    for run in doc["runs"]:
        assert run["stop_reason"] in sweep.STOP_REASONS and 0 < run["steps"] <= 9
        assert run["left_plateau"] == (run["val_accuracy"] >= 2 / run["num_pairs"])
        assert [c[0] for c in run["curve"]] == list(range(3, run["steps"] + 1, 3))
    # the seeds ran at the winning lr only
    for b in doc["best"]:
        assert {r["lr"] for r in doc["runs"] if r["mixer"] == b["mixer"] and r["seed"] == 1} == {b["lr"]}


def test_schema_rejects_bad_documents(full_doc):
    doc, _ = full_doc
    schema = load_schema("mqar_sweep")
    bad = json.loads(json.dumps(doc))
    del bad["runs"][0]["test_accuracy"]
    bad["runs"][1]["stop_reason"] = "budget"
    with pytest.raises(ResultValidationError) as err:
        validate(bad, schema)
    assert "runs[0].test_accuracy" in err.value.missing and any("budget" in p for p in err.value.problems)


def test_resume_skips_finished_runs_and_ends_equal(full_doc, tmp_path, monkeypatch):
    out = tmp_path / "sweep.json"
    part = sweep_runner.run_sweep(TINY, output=out, progress=False, stop_after=3)  # the "kill" after 3 runs
    assert read_result(out, "mqar_sweep")["progress"]["finished"] == 3 == len(part["runs"])
    trained = []
    real = sweep.train_run

    def counting(cfg, job):
        trained.append(job)
        return real(cfg, job)

    monkeypatch.setattr(sweep, "train_run", counting)
    doc = sweep_runner.run_sweep(TINY, output=out, progress=False)
    assert len(trained) == 3 and not {Job.of(r) for r in part["runs"]} & set(trained)
    assert _metrics(doc) == _metrics(full_doc[0])
    assert [s["runs_finished"] for s in doc["sessions"]] == [3, 3]
    assert sorted(r["session"] for r in doc["runs"]) == [0, 0, 0, 1, 1, 1]
    trained.clear()
    sweep_runner.run_sweep(TINY, output=out, progress=False)  # nothing left to do
    assert trained == []


def test_other_configuration_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "sweep.json"
    sweep_runner.run_sweep(TINY, output=out, progress=False, stop_after=1)
    other = replace(TINY, lrs=(1e-3, 1e-2))
    with pytest.raises(ValueError, match="differs in lrs"):
        sweep_runner.run_sweep(other, output=out, progress=False)
    first = read_result(out, "mqar_sweep")["runs"][0]
    assert (first["mixer"], first["lr"]) == ("attention", 1e-2)
    doc = sweep_runner.run_sweep(other, output=out, progress=False, overwrite=True, stop_after=1)
    # the finished run at lr 1e-2 is a run of the new grid with the same inputs: it carries over
    assert doc["config"]["lrs"] == [1e-3, 1e-2] and len(doc["runs"]) == 2 and doc["runs"][0] == first
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(ValueError, match="not a sweep result"):
        sweep_runner.run_sweep(TINY, output=junk, progress=False)


def test_changed_configuration_carries_over_only_unchanged_runs(full_doc):
    doc, _ = full_doc
    conv = replace(TINY, attention_conv_size=3)  # changes the attention model only
    assert {r["mixer"] for r in sweep_runner.carried_over(conv, doc)} == {"delta"}
    assert len(sweep_runner.carried_over(conv, doc)) == 3
    assert sweep_runner.carried_over(replace(TINY, patience=2), doc) == []  # every run stops by it
    assert sweep_runner.carried_over(replace(TINY, seeds=(0,)), doc) == [r for r in doc["runs"] if r["seed"] == 0]
    longer = replace(TINY, settings=((16, 2, 9, 4), (24, 2, 9, 4)), mixed_in=(16, 2, 4))  # mixes into T24 only
    assert len(sweep_runner.carried_over(longer, doc)) == 6
    assert sweep_runner.carried_over(replace(TINY, mixed_in=(8, 1, 4)), doc) == []
    stale = {**doc, "config": {**doc["config"], "min_gain": 0.5}}
    assert sweep_runner.carried_over(TINY, stale) == []


def test_mixed_in_batches_take_the_even_steps(monkeypatch):
    cfg = replace(TINY, settings=((16, 2, 6, 4),), mixed_in=(8, 1, 3), evals_per_run=2)
    seen = []
    real = sweep.train_batch

    def record(tc, step):
        seen.append((step, tc.seq_len, tc.train_pairs, tc.batch_size))
        return real(tc, step)

    monkeypatch.setattr(sweep, "train_batch", record)
    run = sweep.train_run(cfg, Job("delta", 8, 16, 2, 1e-2, 0))
    assert seen == [(s, 8, (1,), 3) if s % 2 == 0 else (s, 16, (2,), 4) for s in range(run["steps"])]
    seen.clear()
    sweep.train_run(replace(cfg, mixed_in=(16, 1, 3)), Job("delta", 8, 16, 2, 1e-2, 0))  # not longer: no mixture
    assert {x[1:] for x in seen} == {(16, (2,), 4)}
    with pytest.raises(ValueError, match="mixed_in"):
        replace(TINY, mixed_in=(8, 1))
    with pytest.raises(ValueError, match="seq_len"):
        replace(TINY, mixed_in=(4, 2, 3))


def test_attention_conv_reaches_every_attention_layer_and_old_configs_read_back():
    tc = sweep.train_config(replace(TINY, attention_conv_size=3, num_layers=2), Job("attention", 8, 16, 2, 1e-2, 0))
    for mixer, convs in (("attention", [3, 3]), ("hybrid", [4, 3]), ("delta", [4, 4])):
        model = build_model(mixer, tc)
        assert [b.mixer.conv_size for b in model.layers] == convs, mixer
        assert ("attention_conv_size" in model_inputs(mixer, tc)) == (mixer != "delta")
    old = {k: v for k, v in TINY.as_json().items() if k not in ("attention_conv_size", "mixed_in")}
    assert SweepConfig.from_json({**old, "attention_positions": True}).attention_positions
    assert SweepConfig.from_json(TINY.as_json()) == TINY


def _run(mixer, lr, seed, val, test, loss=1.0, pairs=4):
    return {"mixer": mixer, "d_model": 8, "seq_len": 16, "num_pairs": pairs, "lr": lr, "seed": seed,
            "val_accuracy": val, "val_loss": loss, "test_accuracy": test, "stop_reason": "steps",
            "left_plateau": sweep.left_plateau(val, pairs), "state_floats": 32}


def test_plateau_rule():
    assert sweep.left_plateau(0.5, 4) and not sweep.left_plateau(0.49, 4)
    assert sweep.left_plateau(0.0625, 32) and not sweep.left_plateau(0.06, 32)


def _stops(accs, patience=2, pairs=4):
    stop = sweep.EarlyStop(patience, pairs)
    return [stop.update(a) for a in accs]


def test_early_stopping_rule():
    assert _stops([0.2, 0.9, 0.995]) == [None, None, "solved"]
    # off the plateau (>= 0.5 at 4 pairs): two evaluations without a gain of 1 point stop the run
    assert _stops([0.6, 0.605, 0.609]) == [None, None, "no_improvement"]
    assert _stops([0.6, 0.605, 0.615, 0.62, 0.621]) == [None, None, None, None, "no_improvement"]
    # on the plateau the run trains on, however long nothing changes
    assert _stops([0.3] * 20) == [None] * 20
    # the best accuracy decides: a run that left the plateau and fell back still stops
    assert _stops([0.7, 0.3, 0.3]) == [None, None, "no_improvement"]


def test_best_selection_by_validation_with_plateau_flag():
    cfg = replace(TINY, settings=((16, 4, 9, 4),), lrs=(1e-3, 1e-2, 1e-1), seeds=(0, 1, 2))
    runs = [
        # attention: 1e-2 and 1e-1 tie on validation accuracy; the lower validation loss wins, not the test score
        _run("attention", 1e-3, 0, 0.30, 0.99), _run("attention", 1e-2, 0, 0.80, 0.70, loss=0.5),
        _run("attention", 1e-1, 0, 0.80, 0.90, loss=0.6),
        _run("attention", 1e-2, 1, 0.9, 0.60), _run("attention", 1e-2, 2, 0.9, 0.95),
        # delta: every lr below twice chance (0.5 at 4 pairs): the best entry says so
        _run("delta", 1e-3, 0, 0.26, 0.2), _run("delta", 1e-2, 0, 0.45, 0.4), _run("delta", 1e-1, 0, 0.3, 0.3),
    ]
    best = {b["mixer"]: b for b in sweep.select_best(cfg, runs)}
    a, d = best["attention"], best["delta"]
    assert (a["lr"], a["test_accuracy"], a["plateau"], a["complete"]) == (1e-2, 0.70, False, True)
    assert a["seeds"] == [0, 1, 2] and a["test_min"] == 0.60 and a["test_max"] == 0.95
    assert a["test_mean"] == pytest.approx((0.70 + 0.60 + 0.95) / 3, abs=1e-5)
    assert a["lr_accuracy"] == {"0.001": 0.30, "0.01": 0.80, "0.1": 0.80}
    assert (d["lr"], d["plateau"], d["complete"], d["seeds"]) == (1e-2, True, False, [0])
    assert sweep.seed_jobs(cfg, [d]) == [Job("delta", 8, 16, 4, 1e-2, 1), Job("delta", 8, 16, 4, 1e-2, 2)]
    # a group with a learning rate still missing has no best entry yet
    assert [b["mixer"] for b in sweep.select_best(cfg, runs[:2] + runs[5:])] == ["delta"]


def test_plateau_extension_selection():
    cfg = replace(TINY, mixers=("delta",), settings=((16, 4, 9, 4),), lrs=(1e-3, 1e-2), seeds=(0, 1, 2),
                  plateau_steps=30)
    base = [_run("delta", 1e-3, 0, 0.26, 0.2), _run("delta", 1e-2, 0, 0.45, 0.4)]  # both on the plateau
    (b,) = sweep.select_best(cfg, base)
    assert (b["extension"], b["complete"], b["plateau"]) == ("pending", False, True)
    ext = [Job("delta", 8, 16, 4, lr, 0, True) for lr in (1e-3, 1e-2)]
    assert sweep.seed_jobs(cfg, [b]) == ext  # the extension before any seed
    assert sweep.total_runs(cfg, base) == 2 + 2 + 2  # the lr runs, the extension, then 2 seeds
    longer = [{**_run("delta", 1e-3, 0, 0.9, 0.85), "extended": True},
              {**_run("delta", 1e-2, 0, 0.4, 0.4), "extended": True}]
    (b,) = sweep.select_best(cfg, base + longer)
    assert (b["extension"], b["extended"], b["lr"], b["plateau"], b["test_accuracy"]) == ("done", True, 1e-3,
                                                                                        False, 0.85)
    assert b["extended_lr_accuracy"] == {"0.001": 0.9, "0.01": 0.4} and b["lr_accuracy"] == {"0.001": 0.26,
                                                                                               "0.01": 0.45}
    assert sweep.seed_jobs(cfg, [b]) == [Job("delta", 8, 16, 4, 1e-3, s, True) for s in (1, 2)]
    assert sweep.total_runs(cfg, base + longer) == 6
    # still on the plateau after the extension: the entry says so, and the seeds run at the winner's stage
    still = [{**r, "val_accuracy": 0.3, "left_plateau": False} for r in longer]
    (b,) = sweep.select_best(cfg, base + still)
    assert (b["extension"], b["extended"], b["plateau"], b["lr"]) == ("done", False, True, 1e-2)
    # a group off the plateau never needs it; without plateau_steps nothing is extended
    (b,) = sweep.select_best(cfg, [_run("delta", 1e-3, 0, 0.6, 0.6), _run("delta", 1e-2, 0, 0.3, 0.3)])
    assert (b["extension"], b["extended"], b["extended_lr_accuracy"]) == ("none", False, {})
    (b,) = sweep.select_best(replace(cfg, plateau_steps=0), base)
    assert (b["extension"], b["plateau"]) == ("none", True)
    assert sweep.train_config(cfg, ext[0]).steps == 30
    assert sweep.train_config(cfg, Job(*ext[0].group, 1e-3, 0)).steps == 9
    with pytest.raises(ValueError, match="plateau_steps"):
        replace(cfg, plateau_steps=2)


def test_plateau_extension_end_to_end(tmp_path):
    # 3 steps leave nothing off the plateau; the extension's 40 steps at lr 3e-2 do for the delta rule
    cfg = replace(TINY, mixers=("delta",), settings=((16, 2, 3, 4),), lrs=(3e-2,), evals_per_run=1, patience=1,
                  plateau_steps=40, val_examples=32, test_examples=32)
    doc = sweep_runner.run_sweep(cfg, output=tmp_path / "x.json", progress=False)
    kinds = sorted((r["extended"], r["seed"], r["max_steps"]) for r in doc["runs"])
    (b,) = doc["best"]
    assert kinds == [(False, 0, 3), (True, 0, 40), (True, 1, 40)] and b["extension"] == "done" and b["extended"]
    assert doc["progress"] == {"finished": 3, "total": 3, "complete": True}
    assert read_result(tmp_path / "x.json", "mqar_sweep") == doc


@pytest.mark.parametrize("mixer", ["attention", "gated_delta"])
def test_diverged_run_stops_and_is_tested_on_its_weights(mixer):
    """A gated mixer's non-finite weights make NaN gates, which its layers refuse: that too is divergence (once it
    ended the sweep with the gate's error), and such weights recall nothing."""
    run = sweep.train_run(TINY, Job(mixer, 8, 16, 2, 1e30, 0))
    assert run["stop_reason"] == "diverged" and 1 <= run["steps"] < 9
    assert run["best_step"] == 0 or run["best_step"] <= run["steps"]
    assert 0 <= run["test_accuracy"] <= 1


def test_cli_quick_sweep_end_to_end_and_resume(tmp_path):
    out, png = tmp_path / "q.json", tmp_path / "q.png"
    args = ["mqar", "--sweep", "--quick", "--mixers", "attention", "--workers", "2", "--no-progress",
            "--output", str(out)]
    res = CliRunner().invoke(main, [*args, "--plot", str(png)])
    assert res.exit_code == 0, res.output
    doc = read_result(out, "mqar_sweep")
    assert doc["progress"] == {"finished": 6, "total": 6, "complete": True} and png.stat().st_size > 10_000
    assert doc["config"]["quick"] and "runs finished: 6 of 6 (complete)" in res.output
    again = CliRunner().invoke(main, args)  # the same command again: nothing to train, the file is kept
    assert again.exit_code == 0, again.output
    assert _metrics(read_result(out, "mqar_sweep")) == _metrics(doc)
    bad = CliRunner().invoke(main, [*args, "--steps", "5"])
    assert bad.exit_code == 2 and "--steps: not used by --sweep" in bad.output
    other = CliRunner().invoke(main, ["mqar", "--sweep", "--quick", "--mixers", "delta", "--output", str(out)])
    assert other.exit_code == 2 and "differs in mixers" in other.output
    unsaved = CliRunner().invoke(main, ["mqar", "--sweep"])
    assert unsaved.exit_code == 2 and "--sweep needs --output" in unsaved.output
    report = CliRunner().invoke(main, ["mqar", "--sweep-report", str(out)])
    assert report.exit_code == 0 and "attention" in report.output
