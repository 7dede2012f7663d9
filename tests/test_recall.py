"""linattn.tools.recall: keys, the read path through the library, and the expected shape of the results."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from linattn.tools import recall as rc
from linattn.tools.recall import Mechanism

D = 32


def _acc(kind: str, alpha: float | None = None, **kw) -> float:
    return rc.recall_accuracy(Mechanism(kind, alpha), d=D, dv=D, trials=16, **kw)


def test_key_kinds():
    gen = torch.Generator().manual_seed(0)
    orth = rc.make_keys("orthogonal", 8, 8, batch=2, gen=gen)
    assert torch.allclose(orth @ orth.transpose(-1, -2), torch.eye(8, dtype=torch.float64).expand(2, 8, 8), atol=1e-12)
    dup = rc.make_keys("near_duplicate", 64, 64, batch=4, gen=gen, similarity=0.8)
    gram = dup @ dup.transpose(-1, -2)
    off = gram[:, ~torch.eye(64, dtype=torch.bool)]
    assert torch.allclose(gram.diagonal(dim1=-2, dim2=-1), torch.ones(4, 64, dtype=torch.float64))
    assert abs(off.mean().item() - 0.8) < 0.05
    rand = rc.make_keys("random", 64, 64, batch=4, gen=gen)
    assert abs((rand @ rand.transpose(-1, -2))[:, ~torch.eye(64, dtype=torch.bool)].mean().item()) < 0.02
    with pytest.raises(ValueError, match="cannot be orthogonal"):
        rc.make_keys("orthogonal", 9, 8, batch=1, gen=gen)
    with pytest.raises(ValueError, match="key kind"):
        rc.make_keys("sparse", 4, 8, batch=1, gen=gen)
    with pytest.raises(ValueError, match="similarity"):
        rc.make_keys("near_duplicate", 4, 8, batch=1, gen=gen, similarity=1.0)


def test_dpfp_is_nonnegative_twice_as_wide_and_zero_at_zero():
    x = torch.randn(5, 7, dtype=torch.float64)
    f = rc.dpfp(x)
    assert f.shape == (5, 14) and (f >= 0).all()
    assert torch.equal(rc.dpfp(torch.zeros(3)), torch.zeros(6))
    # relu([x, -x]) * roll(...): entry 1 is relu(x1) * relu(x0)
    assert f[0, 1].item() == pytest.approx(max(x[0, 1].item(), 0) * max(x[0, 0].item(), 0))


def test_retrieve_accumulate_matches_the_normalized_read_by_hand():
    gen = torch.Generator().manual_seed(1)
    keys, values = rc.make_keys("random", 6, 4, batch=2, gen=gen), torch.randn(2, 6, 3, generator=gen,
                                                                                   dtype=torch.float64)
    out = rc.retrieve(Mechanism("accumulate"), keys, values, keys)
    phi_k, phi_q = rc.dpfp(keys), rc.dpfp(keys) * 8**-0.5  # library default scale r^-1/2, r = 2d = 8
    S, z = phi_k.transpose(-1, -2) @ values, phi_k.sum(1)
    want = (phi_q @ S) / ((phi_q @ z[..., None]) + 1e-6)
    assert (out - want).abs().max().item() < 1e-12


def test_retrieve_delta_is_exact_on_orthogonal_keys_and_gate_only_shrinks():
    gen = torch.Generator().manual_seed(2)
    keys = rc.make_keys("orthogonal", 5, 5, batch=1, gen=gen)
    values = torch.randn(1, 5, 3, generator=gen, dtype=torch.float64)
    scale = 5**-0.5
    assert (rc.retrieve(Mechanism("delta"), keys, values, keys) - scale * values).abs().max() < 1e-12
    # gated delta: pair j has been decayed by alpha once per later write, alpha^(4 - j)
    got = rc.retrieve(Mechanism("gated_delta", 0.5), keys, values, keys)
    decay = 0.5 ** torch.arange(4, -1, -1, dtype=torch.float64)
    assert (got - scale * decay[None, :, None] * values).abs().max() < 1e-12
    # softmax over the cache: sqrt(d) * cos = sqrt(5) for the match, 0 for the others
    w = math.exp(5**0.5) / (math.exp(5**0.5) + 4)
    sm = rc.retrieve(Mechanism("softmax"), keys, values, keys)
    assert (sm[0, 0] - (w * values[0, 0] + (1 - w) / 4 * values[0, 1:].sum(0))).abs().max() < 1e-12


def test_exact_fraction():
    values = torch.eye(4, dtype=torch.float64)[None]
    assert rc.exact_fraction(3 * values + 0.1, values) == 1.0
    assert rc.exact_fraction(values.roll(1, dims=1), values) == 0.0
    assert rc.exact_fraction(values[:, [0, 1, 3, 2]], values) == 0.5


def test_softmax_is_the_exact_baseline():
    for n in (D // 4, D, 8 * D):
        assert _acc("softmax", n_pairs=n) >= 0.99


def test_accumulate_drops_once_n_passes_the_feature_width():
    # DPFP width r = 2d = 64: near-perfect well below it, falling past it
    small, at_r, twice, four = (_acc("accumulate", n_pairs=n) for n in (D // 4, 2 * D, 4 * D, 8 * D))
    assert small >= 0.9
    assert small > at_r > twice > four
    assert twice <= 0.7 and four <= 0.45


def test_delta_holds_up_to_d_on_orthogonal_keys():
    for n in (D // 4, D // 2, D):
        assert _acc("delta", n_pairs=n, key_kind="orthogonal") >= 0.99
    assert _acc("delta", n_pairs=4 * D) <= 0.5  # random keys far past d: overwritten


def test_small_alpha_forgets_distant_pairs():
    n, total = D // 4, 4 * D

    def at(alpha, dist):
        return _acc("gated", alpha, n_pairs=n, fillers_before=total - n - dist, fillers_after=dist)

    assert at(0.9, 0) >= 0.7
    assert at(0.9, 3 * D) <= 0.25  # 0.9^96 ~ 4e-5: the pairs are gone
    assert at(0.99, 3 * D) >= at(0.9, 3 * D) + 0.3  # a slower gate still holds them
    # softmax does not care how far back the pairs are
    assert _acc("softmax", n_pairs=n, fillers_before=0, fillers_after=total - n) >= 0.99


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_pairs"):
        rc.recall_accuracy(Mechanism("delta"), n_pairs=0, d=4, dv=4)
    with pytest.raises(ValueError, match="fillers_after"):
        rc.recall_accuracy(Mechanism("delta"), n_pairs=2, d=4, dv=4, fillers_after=-1)
    with pytest.raises(ValueError, match="alphas"):
        rc.mechanisms([0.0])
    with pytest.raises(ValueError, match="distances"):
        rc.sweep_points(d=8, n_values=[2], distance_pairs=4, total_length=8, distances=[5], correlation_pairs=2,
                        similarities=[0.5])


def test_cli_writes_table_json_and_png(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    args = ["--d", "8", "--dv", "8", "--trials", "2", "--alphas", "0.9", "--similarities", "0.5", "--no-progress",
            "--output", str(out), "--plot", str(png)]
    res = CliRunner().invoke(rc.command, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    mechs = {r["mechanism"] for r in doc["records"]}
    assert mechs == {"softmax", "accumulate", "gated a=0.9", "delta", "gated_delta a=0.9"}
    assert {r["sweep"] for r in doc["records"]} == {"capacity", "distance", "correlation"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "capacity" in res.output and "gated_delta a=0.9" in res.output
    again = CliRunner().invoke(rc.command, args)
    assert again.exit_code == 2 and "--overwrite" in again.output


@pytest.mark.parametrize("args, needle", [(["--alphas", "1.5"], "--alphas"), (["--alphas", "x"], "--alphas"),
                                          (["--similarities", "1"], "--similarities"), (["--d", "0"], "--d")])
def test_cli_bad_input(args, needle):
    res = CliRunner().invoke(rc.command, [*args, "--no-progress"])
    assert res.exit_code == 2 and needle in res.output
