"""linattn mqar: the generator says what it does, a tiny run learns, resume equals an uninterrupted run."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from linattn.tools import mqar
from linattn.tools.mqar_data import FILLER, IGNORE, generate, split_vocab
from linattn.tools.mqar_train import TrainConfig, build_model, evaluate, state_floats, train
from linattn.tools.results import read_result

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
    cfg = TrainConfig(steps=120, **TINY)
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
