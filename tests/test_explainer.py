"""``linattn explain`` without a browser: the page's build, its embedded numbers, the CLI and the standalone lab."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from linattn import reference
from linattn.tools import lab as torch_lab
from linattn.tools import memory
from linattn.tools.cli import main
from linattn.tools.explainer import build_page, lab_source, scenes
from linattn.tools.explainer import lab_standalone as lab_np
from linattn.tools.explainer.measured import load_measured, mqar_table, summarize

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _page_data(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="linattn-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(block.replace("<\\/", "</"))


@pytest.fixture(scope="module")
def page() -> str:
    return build_page("en")


def test_page_is_self_contained_and_small(page):
    assert len(page.encode("utf-8")) < 1_000_000
    # The only URL in the page is the SVG namespace string; nothing to fetch: no src=, no stylesheet link, no url().
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"<(script|img|link|iframe)[^>]*\s(src|href)=", page)
    assert "url(" not in page and "@import" not in page and "@font-face" not in page
    assert "default-src 'none'" in page  # the browser itself refuses any fetch


def test_embedded_data_is_what_python_computes(page):
    data = _page_data(page)
    assert data["tokens"] == json.loads(json.dumps(scenes.tokens_scene()))
    assert data["lang"] == "en"
    assert base64.b64decode(data["lab_b64"]).decode("utf-8") == lab_source()
    assert _page_data(build_page("zh"))["lang"] == "zh"
    with pytest.raises(ValueError, match="lang"):
        build_page("fr")


def test_worked_examples_come_from_the_reference():
    tok = scenes.tokens_scene()
    assert tok["S"][-1] == [[5.0], [7.0]] and tok["z"][-1] == [2.0, 2.0]
    assert (tok["num"], tok["den"]) == (17.0, 6.0) and tok["y_final"] == pytest.approx(17 / 6, abs=1e-15)
    mat = scenes.matrix_scene()
    assert mat["S"] == [[2.0, 1.0], [4.0, 3.0]] and mat["z"] == [1.0, 1.0] and mat["num"] == [8.0, 5.0]
    assert mat["den"] == 3.0 and mat["y"] == pytest.approx([8 / 3, 5 / 3], abs=1e-15)
    assert mat["weights"] == pytest.approx([2 / 3, 1 / 3], abs=1e-15)
    dense = scenes.dense_scene()
    assert dense["A"] == [[2.0, 0.0, 0.0], [2.0, 1.0, 0.0], [2.0, 1.0, 3.0]]
    np.testing.assert_allclose(dense["Y"], dense["loop_y"], rtol=1e-15)
    gates = scenes.gates_scene()
    assert [S[0][0] for S in gates["S"]] == [2.0, 5.0, 10.5]
    assert [z[0] for z in gates["z"]] == [1.0, 1.5, 1.75]
    assert np.allclose([y[0] for y in gates["y"]], [2, 10 / 3, 6], atol=1e-15)
    assert gates["scan"]["root"]["B"] == gates["scan"]["loop_S"] == 21.25
    delta = scenes.delta_scene()
    assert delta["curves"][0]["S"][:4] == [2.0, 3.5, 4.25, 4.625]
    assert abs(delta["curves"][3]["S"][-1] - 5) > 50  # beta |k|^2 = 2.5 diverges
    why = scenes.whyz_scene()
    assert all(r["normalized"] == 3.0 and r["unnormalized"] == 9.0 * r["m"] for r in why["rows"])
    eps = {r["den"]: r for r in scenes.eps_scene()["rows"]}
    assert eps[1e-6]["add"] == pytest.approx(1.5) and eps[1e-6]["clamp"] == pytest.approx(3.0)
    case = {(r["eps"], r["mode"]): r["y"] for r in scenes.eps_scene()["case"]["reads"]}
    assert case[(1e-6, "add")] == pytest.approx(1.0) and round(case[(1e-8, "add")], 4) == 1.9802
    assert case[(1e-6, "clamp")] == pytest.approx(2.0)
    scan = gates["scan"]
    assert [p["B"] for p in scan["prefixes"]] == scan["loop_prefix_S"] == [2.0, 5.0, 10.5, 21.25]
    assert scan["swapped"]["B"] != scan["level1"][0]["B"] and scan["z_root"]["B"] == scan["loop_z"] == 1.875
    one = delta["one_write"]
    assert (one["prediction"], one["error"], one["S"], one["orthogonal_read"]) == (2.0, 3.0, [[3.5], [4.0]], 4.0)
    assert delta["curves"][0]["errors"][:3] == [3.0, 1.5, 0.75]
    assert delta["norm2"]["errors"] == [1.0, -3.0, 9.0, -27.0]
    long = scenes.long_scene()
    assert long["y_rescaled"] == pytest.approx(long["y"], rel=1e-14)  # S, z and eps scaled alike: same read
    assert abs(long["next"]["y_rescaled"] - long["next"]["y"]) > 0.5  # a later write at the old scale differs
    ex = scenes.exercises()
    assert ex[0]["S"] == [[5.0, 3.0], [7.0, 5.0]] and ex[0]["answers"] == pytest.approx([17 / 6, 11 / 6], abs=1e-15)
    assert ex[1]["coeffs"] == [0.125, 0.25, 1.0] and ex[1]["answers"][0] == pytest.approx(74 / 11, abs=1e-15)
    assert ex[2]["answers"] == [4.0, 8.0] and (ex[2]["fixed_S"], ex[2]["fixed_prediction"]) == (2.5, 5.0)


def test_chunk_scene_every_layout_equals_the_loop():
    ch = scenes.chunks_scene()
    assert (ch["num"], ch["den"]) == (74.0, 11.0) and ch["loop_y"][-1] == pytest.approx(74 / 11, abs=1e-15)
    for size, chunks in ch["layouts"].items():
        ys = [y for c in chunks for y in c["y"]]
        assert np.allclose(ys, ch["loop_y"], rtol=1e-14, atol=0), size
        assert chunks[-1]["S_out"] == [26.0, 22.0] and chunks[-1]["z_out"] == [4.0, 3.0]


def test_device_segments_compose_to_the_one_pass():
    dev = scenes.devices_scene()
    np.testing.assert_allclose(dev["composed"], dev["one_pass"], rtol=1e-14, atol=1e-15)
    assert not np.allclose(dev["segments"][1]["Q"], dev["one_pass"])  # the second segment alone is not the answer


def test_memory_scene_uses_linattn_memory():
    m = scenes.memory_scene()
    assert m["state_bytes"] == 33_816_576 == memory.state_bytes(1, 32, 16, 128, 128, "float32")
    assert m["crossover"] == 129 and m["per_head_kv_bytes_per_token"] == 512
    assert m["kv_at"] == {"32": 16 * 1024, "129": 66_048, "8192": 4 * 1024 * 1024}
    assert m["per_head_state_bytes"] == 66_048


def test_measured_summary_matches_the_result_files():
    if not RESULTS.is_dir():
        pytest.skip("benchmarks/results is not here (installed package)")
    assert load_measured() == json.loads(json.dumps(summarize(RESULTS)))


def test_mqar_table_shows_only_groups_every_mixer_finished():
    """A group enters the explainer's MQAR table once every mixer has all its seeds; an unfinished one stays out,
    and a sweep with no finished group gives an empty table (the page then says so)."""
    def entry(mixer, d, pairs, mean, complete=True, plateau=False):
        return {"mixer": mixer, "d_model": d, "seq_len": 64, "num_pairs": pairs, "state_floats": 0 if mixer ==
                "attention" else d * d // 2, "test_mean": mean, "test_min": mean - 0.1, "test_max": mean + 0.05,
                "plateau": plateau, "complete": complete}

    doc = {"config": {"mixers": ["attention", "delta"]},
           "best": [entry("attention", 64, 4, 0.99), entry("delta", 64, 4, 0.45, plateau=True),
                    entry("attention", 64, 8, 0.98), entry("delta", 64, 8, 0.7, complete=False),
                    entry("attention", 128, 4, 0.97)]}
    groups, rows = mqar_table(doc)
    assert groups == [{"d_model": 64, "seq_len": 64, "num_pairs": 4}]
    assert rows[0] == {"mixer": "attention", "kv_cache": True, "state_floats": {"64": 0},
                       "accuracy": [[0.99, 0.89, 1.04]], "plateau": [False], "extended": [False]}
    assert rows[1]["kv_cache"] is False and rows[1]["state_floats"] == {"64": 2048}
    assert rows[1]["plateau"] == [True] and rows[1]["accuracy"][0][0] == 0.45
    doc["best"] = [e for e in doc["best"] if e["num_pairs"] == 8]
    assert mqar_table(doc) == ([], [])


def test_cli_writes_refuses_overwrite_and_writes_lab(tmp_path):
    runner = CliRunner()
    out, lab_file = tmp_path / "p.html", tmp_path / "lab.py"
    res = runner.invoke(main, ["explain", "-o", str(out), "--lang", "zh", "--lab", str(lab_file)])
    assert res.exit_code == 0, res.output
    assert '<html lang="zh-CN">' in out.read_text(encoding="utf-8") and lab_file.read_text() == lab_source()
    res = runner.invoke(main, ["explain", "-o", str(out)])
    assert res.exit_code != 0 and "exists" in res.output
    assert runner.invoke(main, ["explain", "-o", str(out), "--overwrite"]).exit_code == 0
    assert runner.invoke(main, ["explain", "--lang", "fr", "-o", str(out)]).exit_code == 2


# ----------------------------------------------------------------------------------------------- standalone lab


def test_lab_names_are_linattn_lab_names():
    names = [name for name, _ in lab_np.CHECKS]
    torch_names = {check.check_name for check in torch_lab.CHECKS}
    assert set(names) <= torch_names
    for required in ("recurrent vs dense kernel", "recurrent vs chunkwise", "gated scan coefficients",
                     "delta unit-key convergence"):
        assert required in names


@pytest.mark.parametrize("rule", reference.RULES)
@pytest.mark.parametrize("eps_mode", reference.EPS_MODES)
def test_lab_recurrence_equals_the_reference(rule, eps_mode):
    rng = np.random.default_rng([len(rule), len(eps_mode)])
    for _ in range(5):
        T, r, dv = rng.integers(1, 7), rng.integers(1, 4), rng.integers(1, 3)
        q, k = rng.uniform(0.1, 2, (T, r)), rng.uniform(0.1, 2, (T, r))
        v = rng.standard_normal((T, dv))
        alpha, beta = rng.uniform(0, 1, T), rng.uniform(0, 1.5, T)
        kw = {}
        if rule in reference.GATED_RULES:
            with np.errstate(divide="ignore"):
                kw["g"] = np.log(alpha)[None, :, None]
        if rule in reference.DELTA_RULES:
            kw["beta"] = beta[None, :, None]
        want_y, want_S, want_z = reference.linear_attention(q[None, :, None], k[None, :, None], v[None, :, None],
                                                            rule=rule, scale=1.0, eps=1e-3, eps_mode=eps_mode, **kw)
        y, S, z = lab_np.recurrent(q, k, v, rule, alpha=alpha, beta=beta, eps=1e-3, eps_mode=eps_mode)
        np.testing.assert_allclose(y, want_y[0, :, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(S, want_S[0, 0], rtol=1e-12, atol=1e-12)
        assert (z is None) == (want_z is None)


def test_lab_passes_and_a_broken_form_fails(monkeypatch, capsys):
    assert lab_np.main(["--seed", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(lab_np.CHECKS) + 2 and all(": PASS  max_err=" in line for line in lines[:-2])
    assert [line.split(":")[0] for line in lines[:4]] == ["recurrent vs dense kernel", "recurrent vs chunkwise",
                                                         "gated scan coefficients", "delta unit-key convergence"]
    contrast = lines[-1]
    assert contrast.startswith("contrast, not a check: ELU+1 linear attention vs causal softmax")
    assert "Expected" in contrast
    gap = float(re.search(r"differ by up to (\d+\.\d+)", contrast).group(1))
    assert gap > 0.05  # the two attentions really differ
    broken = lambda q, k, v, size, alpha=None: lab_np.dense(q, k, v, alpha) * 1.001  # noqa: E731
    monkeypatch.setattr(lab_np, "CHECKS", [(n, c) for n, c in lab_np.CHECKS])
    monkeypatch.setattr(lab_np, "chunkwise", broken)
    assert lab_np.main([]) == 1
    assert "recurrent vs chunkwise: FAIL" in capsys.readouterr().out


def test_lab_chunk_size_flag(capsys):
    assert lab_np.main(["--chunk-size", "3"]) == 0
    assert "chunk sizes 3)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        lab_np.main(["--chunk-size", "0"])
    assert "argument --chunk-size: must be at least 1, got 0" in capsys.readouterr().err
    for bad, says in ((["--seed", "-1"], "argument --seed: must be at least 0, got -1"),
                      (["--seed", "x"], "argument --seed: expected a whole number, got 'x'")):
        with pytest.raises(SystemExit):
            lab_np.main(bad)
        assert says in capsys.readouterr().err


def test_lab_runs_on_python_3_9():
    """lab.py promises Python >= 3.9: no zip(strict=...) (3.10), no match statements; it compiles under 3.9."""
    import ast
    import shutil
    import subprocess

    tree = ast.parse(lab_source())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "zip":
            assert not node.keywords, "zip(strict=...) needs Python 3.10"
        assert type(node).__name__ not in ("Match", "TryStar"), type(node).__name__
    for py39 in (shutil.which("python3.9"), *sorted(Path("/root/.pyenv/versions").glob("3.9.*/bin/python"))):
        probe = py39 and subprocess.run([str(py39), "-c", "import sys; print(sys.version_info[:2] == (3, 9))"],
                                        capture_output=True, text=True, timeout=60)
        if probe and probe.stdout.strip() == "True":  # a working 3.9: lab.py must compile under it
            res = subprocess.run([str(py39), "-c", "import sys; compile(sys.stdin.read(), 'lab.py', 'exec')"],
                                 input=lab_source(), capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            break
