"""linattn mqar: the generator says what it does, a tiny run learns, resume equals an uninterrupted run; the
controls do what they say; the latency pass runs apart; seeds are summarized."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner

from linattn.tools.harness.results import ResultValidationError, load_schema, read_result, validate
from linattn.tools.mqar import cli as mqar
from linattn.tools.mqar import report
from linattn.tools.mqar.controls import (
    NEAR_DUPLICATE_LEVELS,
    PRECISIONS,
    control_pairs,
    controls,
    mean_pairwise_cosine,
    near_duplicate_table,
    with_near_duplicate_keys,
    with_precision,
)
from linattn.tools.mqar.data import FILLER, IGNORE, generate, split_vocab
from linattn.tools.mqar.train import TrainConfig, build_model, evaluate, state_floats, train

TINY = dict(vocab_size=16, seq_len=16, train_pairs=(2,), hidden_size=32, num_heads=2, head_dim=16, batch_size=32,
            lr=1e-2, seed=0)


def _check_batch(b, *, vocab_size, seq_len, num_pairs, lead=0, gap=0, overwrites=0):
    num_keys, _ = split_vocab(vocab_size)
    writes = num_pairs + overwrites
    for row in range(b.inputs.shape[0]):
        x, t, d = b.inputs[row], b.targets[row], b.distance[row]
        assert (x[:lead] == FILLER).all() and (x[lead + 2 * writes:lead + 2 * writes + gap] == FILLER).all()
        keys = x[lead:lead + 2 * writes:2]
        vals = x[lead + 1:lead + 2 * writes:2]
        assert ((keys >= 1) & (keys <= num_keys)).all() and (vals > num_keys).all() and (vals < vocab_size).all()
        assert len(set(keys[:num_pairs].tolist())) == num_pairs  # distinct keys: nothing overwritten...
        assert keys[num_pairs:].tolist() == keys[:overwrites].tolist()  # ...unless asked
        latest = {}
        for i, k in enumerate(keys.tolist()):
            latest[k] = (lead + 2 * i, vals[i])
        q = np.flatnonzero(t != IGNORE)
        assert len(q) == num_pairs and (q >= lead + 2 * writes + gap).all()
        assert sorted(x[q].tolist()) == sorted(set(keys.tolist()))  # every key queried once
        for p in q:
            pos, val = latest[x[p]]
            assert t[p] == val and x[p + 1] == val  # the target is the latest value, also the next input
            assert d[p] == p - pos > 0
        assert (d[t == IGNORE] == 0).all()


@pytest.mark.parametrize("kw", [dict(num_pairs=5), dict(num_pairs=3, lead=7, gap=9), dict(num_pairs=4, overwrites=2),
                                dict(num_pairs=1, gap=30)])
def test_generator_layout_and_distances(kw):
    b = generate(20, vocab_size=40, seq_len=64, seed=3, **kw)
    _check_batch(b, vocab_size=40, seq_len=64, **kw)
    again = generate(20, vocab_size=40, seq_len=64, seed=3, **kw)
    assert np.array_equal(b.inputs, again.inputs) and np.array_equal(b.targets, again.targets)
    other = generate(20, vocab_size=40, seq_len=64, seed=4, **kw)
    assert not np.array_equal(b.inputs, other.inputs)


def test_generator_moved_evidence_shifts_distance_by_exactly_the_move():
    near = generate(8, vocab_size=40, seq_len=64, num_pairs=4, lead=20, gap=0, seed=1)
    far = generate(8, vocab_size=40, seq_len=64, num_pairs=4, lead=0, gap=20, seed=1)
    mask = near.targets != IGNORE
    assert np.array_equal(mask, far.targets != IGNORE)
    assert np.array_equal(far.distance[mask] - near.distance[mask], np.full(mask.sum(), 20))


@pytest.mark.parametrize("kw,name", [(dict(num_pairs=10), "seq_len"), (dict(num_pairs=0), "num_pairs"),
                                     (dict(num_pairs=2, overwrites=3), "overwrites"),
                                     (dict(num_pairs=30, seq_len=200), "num_pairs")])
def test_generator_errors_name_the_argument(kw, name):
    kw = {"seq_len": 32, **kw}
    with pytest.raises(ValueError, match=name):
        generate(2, vocab_size=40, seed=0, **kw)


def test_equal_state_size_across_linear_mixers():
    cfg = TrainConfig()
    sizes = {m: state_floats(build_model(m, cfg)) for m in mqar.MIXER_SPECS}
    assert sizes["attention"] == 0
    assert sizes["delta"] == sizes["gated"] == sizes["accumulate-elu1"] == 2 * 2 * 32 * 32
    assert sizes["accumulate-taylor2"] == 2 * 2 * 31 * 32  # Taylor features of q/k width 5: 31 rows
    assert sizes["hybrid"] == sizes["delta"] // 2


@pytest.mark.parametrize("mixer", ["attention", "gated_delta"])
def test_quick_run_learns(mixer):
    torch.set_num_threads(1)
    cfg = TrainConfig(steps=160, **TINY)  # at 120 gated delta was still at the two-values level (~0.45) in a run
    model, info = train(mixer, cfg, progress=False)
    log = np.array(info["log"])
    first, last = log[:10, 1].mean(), log[-10:, 1].mean()
    assert last < 0.6 * first, (first, last)
    acc = evaluate(model, cfg, pairs=(2,), examples=128)[0]["accuracy"]
    # Chance: 1/8 (eight value tokens); 1/2 for a model that only learned the answer is one of the two stored values.
    assert acc > 0.45, acc


def test_resume_equals_uninterrupted(tmp_path):
    torch.set_num_threads(1)
    cfg = TrainConfig(steps=12, **{**TINY, "seq_len": 12})
    full, info_full = train("delta", cfg, progress=False)
    ckpt = tmp_path / "delta.safetensors"
    _, info_part = train("delta", cfg, checkpoint=ckpt, stop_at=5, checkpoint_every=3, progress=False)
    assert info_part["stop_reason"] == "stopped" and info_part["steps_done"] == 5
    resumed, info = train("delta", cfg, checkpoint=ckpt, resume=True, progress=False)
    assert info["steps_done"] == 12
    for (name, a), b in zip(full.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert info["log"] == info_full["log"]
    with pytest.raises(ValueError, match="resume"):  # a checkpoint of another configuration is refused
        train("delta", TrainConfig(steps=12, **{**TINY, "seq_len": 14}), checkpoint=ckpt, resume=True,
              progress=False)


def test_cli_writes_valid_json_and_plot(tmp_path):
    out, png = tmp_path / "m.json", tmp_path / "m.png"
    args = ["--mixers", "attention,delta", "--vocab-size", "16", "--seq-len", "16", "--train-pairs", "2",
            "--eval-pairs", "1,2", "--steps", "3", "--hidden-size", "16", "--eval-examples", "8", "--histories",
            "64,256", "--no-progress", "--output", str(out), "--plot", str(png)]
    res = CliRunner().invoke(mqar.command, args)
    assert res.exit_code == 0, res.output
    doc = read_result(out, "mqar")
    assert [m["mixer"] for m in doc["models"]] == ["attention", "delta"]
    assert {(r["mixer"], r["history"]) for r in doc["latency"]} == {(m, h) for m in ("attention", "delta")
                                                                    for h in (64, 256)}
    kv = {r["history"]: r["kv_cache_bytes"] for r in doc["latency"] if r["mixer"] == "attention"}
    assert kv[256] == 4 * kv[64] > 0
    assert all(r["kv_cache_bytes"] == 0 for r in doc["latency"] if r["mixer"] == "delta")
    assert png.stat().st_size > 0
    assert json.loads(out.read_text())["config"]["steps"] == 3
    again = CliRunner().invoke(mqar.command, args)  # never overwrites silently
    assert again.exit_code != 0 and "exists" in again.output


def test_cli_resume_continues_from_checkpoints(tmp_path):
    base = ["--mixers", "delta", "--vocab-size", "16", "--seq-len", "16", "--train-pairs", "2", "--eval-pairs", "2",
            "--hidden-size", "16", "--eval-examples", "16", "--histories", "64", "--no-controls", "--no-progress",
            "--checkpoint-dir", str(tmp_path / "ck"), "--steps", "6"]
    runner = CliRunner()
    assert runner.invoke(mqar.command, [*base, "--resume"]).exit_code == 0  # no checkpoint yet: starts fresh
    bad = runner.invoke(mqar.command, [*base[:-1], "7", "--resume"])  # other settings: refused, not mixed
    assert bad.exit_code != 0 and "another configuration" in bad.output
    out = tmp_path / "r.json"
    res = runner.invoke(mqar.command, [*base, "--resume", "--output", str(out)])
    assert res.exit_code == 0, res.output
    rec = read_result(out, "mqar")["models"][0]
    assert rec["steps_done"] == 6 and len(rec["loss_curve"]) == 6  # the log comes back from the checkpoint
    no_dir = [a for a in base if a not in ("--checkpoint-dir", str(tmp_path / "ck"))]
    res = runner.invoke(mqar.command, [*no_dir, "--resume"])
    assert res.exit_code != 0 and "--checkpoint-dir" in res.output


# --- controls: near-duplicate keys, precision; the latency pass apart; seeds summarized -------------------------

def _tiny_model(mixer="gated_delta", steps=3):
    torch.set_num_threads(1)
    cfg = TrainConfig(steps=steps, **TINY)
    model, _ = train(mixer, cfg, progress=False)
    return model, cfg


@pytest.mark.parametrize("rho", [0.5, 0.9, 0.99])
def test_near_duplicate_table_is_what_it_claims(rho):
    torch.manual_seed(0)
    weight = torch.randn(20, 12, dtype=torch.float64)
    rows = slice(1, 9)
    table, c = near_duplicate_table(weight, rows, rho)
    e, new = weight[rows], table[rows]
    assert torch.equal(table[:1], weight[:1]) and torch.equal(table[9:], weight[9:])  # other rows untouched
    assert torch.allclose(new.norm(dim=1), e.norm(dim=1), atol=1e-12)  # norms kept
    assert torch.allclose(F.normalize(new, dim=1) @ c, torch.full((8,), rho**0.5, dtype=torch.float64), atol=1e-12)

    def perp(x):
        p = x - (x @ c)[:, None] * c
        return F.normalize(p, dim=1)

    u = perp(e)
    assert torch.allclose(perp(new), u, atol=1e-10)  # the part that tells keys apart keeps its direction
    cos = F.normalize(new, dim=1) @ F.normalize(new, dim=1).T
    assert torch.allclose(cos, rho + (1 - rho) * (u @ u.T), atol=1e-10)
    off = ~torch.eye(8, dtype=torch.bool)
    assert abs(mean_pairwise_cosine(new) - cos[off].mean().item()) < 1e-12
    assert mean_pairwise_cosine(new) > mean_pairwise_cosine(e) + 0.3  # random rows: near 0 before
    with pytest.raises(ValueError, match="rho"):
        near_duplicate_table(weight, rows, 1.0)


def test_near_duplicate_model_changes_only_what_keys_read():
    model, cfg = _tiny_model()
    dup = with_near_duplicate_keys(model, cfg, 0.9)
    num_keys, _ = split_vocab(cfg.vocab_size)
    assert torch.equal(dup.embed.weight, model.embed.weight)  # logits scored against the trained table
    assert not torch.equal(dup.embed.table[1:1 + num_keys], model.embed.weight[1:1 + num_keys])
    assert torch.equal(dup.embed.table[1 + num_keys:], model.embed.weight[1 + num_keys:])
    with torch.no_grad():
        no_keys = torch.tensor([[0, 1 + num_keys, 2 + num_keys, 0, cfg.vocab_size - 1]])
        assert torch.equal(dup(no_keys)[0], model(no_keys)[0])  # no key token: the same model
        with_key = torch.tensor([[0, 1, 1 + num_keys]])
        assert not torch.equal(dup(with_key)[0], model(with_key)[0])


def test_precision_copies_run_the_state_in_the_dtype_they_claim():
    model, cfg = _tiny_model("hybrid")
    ids = torch.from_numpy(generate(2, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, num_pairs=2, seed=5).inputs)
    states = {}
    for p in PRECISIONS:
        m = with_precision(model, p)
        want = torch.float32 if p == "float32" else torch.bfloat16
        assert {q.dtype for q in m.parameters()} == {want}
        linear = [b.mixer for b in m.layers if hasattr(b.mixer, "rule")]
        assert len(linear) == 1
        if p != "float32":
            assert linear[0].form == "recurrent"
        with torch.no_grad():
            logits, cache = m(ids)
        assert logits.dtype == want
        states[p] = cache[0].state.S
    assert states["float32"].dtype == torch.float32
    assert states["bfloat16_state_float32"].dtype == torch.float32
    assert states["bfloat16"].dtype == torch.bfloat16
    assert next(model.parameters()).dtype == torch.float32  # the trained model is not touched
    # The bfloat16 state is not the float32 one rounded at the end: it differs, but only by bfloat16 error.
    s32, s16 = states["bfloat16_state_float32"], states["bfloat16"].float()
    assert not torch.equal(s16, s32.to(torch.bfloat16).float())
    assert (s16 - s32).abs().max() <= 0.05 * s32.abs().max()
    with pytest.raises(ValueError, match="precision"):
        with_precision(model, "float16")


def test_controls_report_every_control():
    model, cfg = _tiny_model()
    n = control_pairs(cfg)
    ctl = controls(model, cfg, n=n, examples=16)
    assert [r["gap"] for r in ctl["moved"]] == [0, cfg.seq_len // 2, cfg.seq_len]
    assert ctl["overwrites"]["overwritten"] == n // 2
    dup = ctl["near_duplicate"]
    assert [r["rho"] for r in dup] == [None, *NEAR_DUPLICATE_LEVELS]
    assert dup[0]["accuracy"] == evaluate(model, cfg, pairs=(n,), examples=16)[0]["accuracy"]  # as trained
    cosines = [r["mean_cosine"] for r in dup[1:]]
    assert cosines == sorted(cosines) and all(abs(c - r) < 0.1 for c, r in
                                              zip(cosines, NEAR_DUPLICATE_LEVELS, strict=True))
    assert [(r["total_len"], r["gap"]) for r in ctl["precision"]] == [(cfg.seq_len, 0), (2 * cfg.seq_len,
                                                                                        cfg.seq_len)]
    assert all(set(PRECISIONS) <= set(r) for r in ctl["precision"])


def test_resume_counts_training_time_of_every_session(tmp_path):
    torch.set_num_threads(1)
    cfg = TrainConfig(steps=6, **{**TINY, "seq_len": 12})
    ckpt = tmp_path / "d.safetensors"
    _, part = train("delta", cfg, checkpoint=ckpt, stop_at=3, progress=False)
    _, done = train("delta", cfg, checkpoint=ckpt, resume=True, progress=False)
    assert part["resumed_at_step"] == 0 and done["resumed_at_step"] == 3
    assert done["train_s"] >= part["train_s"] > 0
    _, again = train("delta", cfg, checkpoint=ckpt, resume=True, progress=False)  # nothing left to train
    assert again["resumed_at_step"] == again["steps_done"] == 6 and again["train_s"] >= done["train_s"]


SMALL = ["--vocab-size", "16", "--seq-len", "16", "--train-pairs", "2", "--eval-pairs", "1,2", "--steps", "3",
         "--hidden-size", "16", "--eval-examples", "8", "--no-progress"]


def test_latency_pass_apart_from_training(tmp_path):
    ck, out = tmp_path / "ck", tmp_path / "t.json"
    runner = CliRunner()
    res = runner.invoke(mqar.command, [*SMALL, "--mixers", "attention,delta", "--no-latency", "--no-controls",
                                       "--checkpoint-dir", str(ck), "--output", str(out)])
    assert res.exit_code == 0, res.output
    trained = read_result(out, "mqar")
    assert trained["latency"] == [] and trained["config"]["histories"] == []
    lat = tmp_path / "lat.json"
    res = runner.invoke(mqar.command, ["--latency-from", str(out), "--checkpoint-dir", str(ck), "--histories",
                                       "64,128", "--no-progress", "--output", str(lat)])
    assert res.exit_code == 0, res.output
    doc = read_result(lat, "mqar")
    assert {(r["mixer"], r["history"]) for r in doc["latency"]} == {(m, h) for m in ("attention", "delta")
                                                                    for h in (64, 128)}
    assert doc["models"] == trained["models"] and doc["latency_pass"]["source"] == str(out)
    assert all(set(r["ms_per_token"]) == {"64", "128"} for r in doc["table"])
    # A checkpoint that is not the one the result was trained to is refused.
    res = runner.invoke(mqar.command, [*SMALL[:-1], "--steps", "2", "--mixers", "delta", "--no-latency",
                                       "--no-controls", "--checkpoint-dir", str(tmp_path / "other"), "--no-progress"])
    assert res.exit_code == 0, res.output
    (ck / "delta.safetensors").unlink()
    (tmp_path / "other" / "delta.safetensors").rename(ck / "delta.safetensors")
    res = runner.invoke(mqar.command, ["--latency-from", str(out), "--checkpoint-dir", str(ck), "--no-progress"])
    assert res.exit_code != 0 and "another configuration" in res.output
    res = runner.invoke(mqar.command, ["--latency-from", str(out), "--no-progress"])
    assert res.exit_code != 0 and "--checkpoint-dir" in res.output


def test_summarize_seeds(tmp_path):
    runner = CliRunner()
    paths = []
    for seed in (0, 1):
        p = tmp_path / f"s{seed}.json"
        res = runner.invoke(mqar.command, [*SMALL, "--mixers", "delta", "--no-latency", "--seed", str(seed),
                                           "--output", str(p)])
        assert res.exit_code == 0, res.output
        paths.append(p)
    out, png = tmp_path / "sum.json", tmp_path / "sum.png"
    res = runner.invoke(mqar.command, ["--summarize", str(paths[0]), "--summarize", str(paths[1]), "--output",
                                       str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    doc = read_result(out, "mqar_seeds")
    assert doc["seeds"] == [0, 1] and png.stat().st_size > 0
    runs = [read_result(p, "mqar")["models"][0] for p in paths]
    want = [next(r["accuracy"] for r in m["eval"] if r["num_pairs"] == 2 and r["distance"] == "all") for m in runs]
    got = doc["mixers"][0]["metrics"]["acc_all@2"]
    assert got["values"] == want and got["mean"] == pytest.approx(sum(want) / 2)
    assert got["min"] == min(want) and got["max"] == max(want)
    ovr = doc["mixers"][0]["metrics"]["overwrites"]["values"]
    assert ovr == [m["controls"]["overwrites"]["accuracy"] for m in runs]
    assert doc["mixers"][0]["seeds"] == [0, 1] and doc["skipped"] == []
    third = tmp_path / "s2.json"  # a mixer found in one run only is named, not summarized from one value
    res = runner.invoke(mqar.command, [*SMALL, "--mixers", "attention", "--no-latency", "--no-controls", "--seed",
                                       "2", "--output", str(third)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(mqar.command, [*(a for p in (*paths, third) for a in ("--summarize", str(p)))])
    assert res.exit_code == 0 and "not summarized: attention" in res.output, res.output
    other = tmp_path / "lr.json"  # another setting is refused, not averaged in
    res = runner.invoke(mqar.command, [*SMALL, "--mixers", "delta", "--no-latency", "--lr", "0.01",
                                       "--output", str(other)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(mqar.command, ["--summarize", str(paths[0]), "--summarize", str(other)])
    assert res.exit_code != 0 and "lr" in res.output


def test_committed_version_1_results_stay_readable():
    root = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    for name in ("mqar_cpu.json", "mqar_cpu_seed1.json", "mqar_cpu_2500steps.json"):
        doc = read_result(root / name, "mqar")
        assert doc["schema"] == "linattn.mqar/1"
        assert report.format_table(doc)  # the printed table copes with version 1 controls
    v2 = json.loads((root / "mqar_cpu.json").read_text())
    v2["schema"] = "linattn.mqar/2"  # a version 2 file must have the new controls
    with pytest.raises(ResultValidationError, match="near_duplicate"):
        validate(v2, load_schema("mqar"))


@pytest.mark.parametrize("lr", ["inf", "1e30", "nan", "0", "-1e-3", "10.5"])
def test_cli_rejects_an_absurd_learning_rate(lr):
    """A non-finite, non-positive or absurd --lr is a usage error naming --lr (inf and 1e30 once trained to NaN
    weights and were reported as a gate error)."""
    res = CliRunner().invoke(mqar.command, [*SMALL, "--mixers", "gated_delta", "--no-latency", "--lr", lr])
    assert res.exit_code == 2 and "Invalid value for '--lr'" in res.output and "learning rate in (0, 10]" in res.output
    assert "g must be" not in res.output


@pytest.mark.parametrize("mixer", ["delta", "gated_delta"])
def test_divergence_is_reported_as_divergence(mixer, tmp_path, monkeypatch):
    """A run whose loss or weights go non-finite stops with "training diverged", naming mixer, step and lr: for a
    gated mixer the NaN weights once surfaced as the gate check's error. No result is written."""
    with pytest.raises(Exception, match=rf"training diverged: mixer '{mixer}' .* with lr 1e\+30; try a smaller --lr"):
        train(mixer, TrainConfig(**{**TINY, "lr": 1e30}, steps=6), progress=False)
    monkeypatch.setattr(mqar, "MAX_LR", 1e31)  # let the CLI take the rate, to see how it reports the run
    out = tmp_path / "d.json"
    res = CliRunner().invoke(mqar.command, [*SMALL, "--mixers", mixer, "--no-latency", "--lr", "1e30", "-o", str(out)])
    assert res.exit_code == 1 and f"Error: training diverged: mixer '{mixer}'" in res.output, res.output
    assert "g must be" not in res.output and not out.exists()
