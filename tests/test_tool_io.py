"""The tools' files: outputs refused before any work, one message for a lost race, nothing left behind by SIGTERM,
inputs that are not small regular JSON files of finite numbers refused with a message (issue 8, item 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from linattn.tools import recall, stability
from linattn.tools.bench import cli as bench
from linattn.tools.cli import main as cli_main
from linattn.tools.explainer import cli as explain
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness import jsonfile, results
from linattn.tools.memory import cli as memory_tool
from linattn.tools.perf import cpu as perf
from linattn.tools.perf import work
from linattn.tools.sp import bench as sp_bench
from linattn.tools.stability import plots as stability_plot

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _bad_paths(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (path, words the refusal must contain)."""
    (tmp / "afile").write_text("x")
    os.symlink(tmp / "nowhere" / "x.json", tmp / "dangling.json")
    (tmp / "adir.json").mkdir()
    return {
        "parent is a file": (str(tmp / "afile" / "out.json"), "is a file, not a folder"),
        "grandparent is a file": (str(tmp / "afile" / "sub" / "out.json"), "is a file, not a folder"),
        "name too long": (str(tmp / ("n" * 300 + ".json")), "longer than this file system allows"),
        "NUL byte": (str(tmp / "a\0b.json"), "NUL byte"),
        "dangling symlink": (str(tmp / "dangling.json"), "dangling symbolic link"),
        "folder in the way": (str(tmp / "adir.json"), "exists"),
    }


# ------------------------------------------------------------------------------------------ check_writable
def test_check_writable_refuses_each_bad_path_and_creates_nothing(tmp_path):
    for _name, (path, words) in _bad_paths(tmp_path).items():
        with pytest.raises((ValueError, FileExistsError), match=words):
            results.check_writable(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir.json", "afile", "dangling.json"]
    # with --overwrite a folder or a FIFO in the way is still refused: only a regular file is replaced
    os.mkfifo(tmp_path / "fifo.json")
    for name in ("adir.json", "fifo.json"):
        with pytest.raises(ValueError, match="not a regular file"):
            results.check_writable(tmp_path / name, overwrite=True)
    # fine: a new file in a folder that does not exist yet, an existing file with overwrite
    assert results.check_writable(tmp_path / "new" / "deeper" / "r.json") == tmp_path / "new" / "deeper" / "r.json"
    assert results.check_writable(tmp_path / "afile", overwrite=True) == tmp_path / "afile"


def test_check_writable_refuses_a_read_only_folder(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root may write anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(ValueError, match="no permission"):
            results.check_writable(ro / "r.json")
    finally:
        ro.chmod(0o755)


def _never(*args, **kwargs):
    raise AssertionError("measured although the output could not be written")


# each tool, the measuring function that must not run, and its arguments (tiny where it would run)
TOOLS = {
    "bench": (bench, "run", ["--sequence-lengths", "4,8", "--query-heads", "1", "--head-dim", "2"], "--output"),
    "bench-plot": (bench, "run", ["--sequence-lengths", "4,8", "--query-heads", "1", "--head-dim", "2"], "--plot"),
    "memory": (memory_tool, "memory_report", ["--preset", "qwen3-next-80b-a3b"], "--output"),
    "stability": (stability, "stability_sweep", ["--no-progress"], "--plot"),
    "recall": (recall, "run_recall", ["--no-progress"], "--output"),
    "perf": (perf, "run", ["--quick"], "--markdown"),
    "sp-bench": (sp_bench, "run", ["--quick"], "--output"),
    "sp-bench-plot": (sp_bench, "run", ["--quick"], "--plot"),
    "explain": (explain, "build_page", [], "--output"),
}


@pytest.mark.parametrize("tool", list(TOOLS))
def test_every_tool_refuses_an_unwritable_output_before_measuring(tool, tmp_path, monkeypatch):
    module, measure, args, flag = TOOLS[tool]
    monkeypatch.setattr(module, measure, _never)
    name = tool.removesuffix("-plot")
    for case, (path, words) in _bad_paths(tmp_path).items():
        res = CliRunner().invoke(cli_main, [name, *args, flag, path])
        assert res.exit_code == 2, (case, res.output)
        assert words in res.output and flag in res.output, (case, res.output)
        assert "Traceback" not in res.output


# ------------------------------------------------------------------------------------------ races
def test_two_writers_racing_for_one_path_one_wins_the_other_gets_the_exists_message(tmp_path):
    target = tmp_path / "r.json"
    both_written = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def writer(name: str) -> None:
        def write(tmp: Path) -> None:
            tmp.write_text(json.dumps({"by": name}))
            both_written.wait(timeout=10)  # both have a full temporary file before either links it

        try:
            results.atomic_write(target, write)
            outcome[name] = "won"
        except FileExistsError as exc:
            outcome[name] = str(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(v == "won" for v in outcome.values()) == [False, True]
    loser = next(v for v in outcome.values() if v != "won")
    winner = next(k for k, v in outcome.items() if v == "won")
    assert loser == str(results.exists_error(target))  # the same words as the refusal before a run
    assert json.loads(target.read_text()) == {"by": winner}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_a_file_that_appears_during_the_run_gets_the_same_clean_message(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    before = CliRunner().invoke(cli_main, ["memory", "--preset", "qwen3-next-80b-a3b", "--output", str(out)])
    assert before.exit_code == 0
    early = CliRunner().invoke(cli_main, ["memory", "--preset", "qwen3-next-80b-a3b", "--output", str(out)])
    out.unlink()
    real = memory_tool.memory_report

    def rival_writes_first(*args, **kwargs):  # another run takes the name while this one computes
        out.write_text("{}")
        return real(*args, **kwargs)

    monkeypatch.setattr(memory_tool, "memory_report", rival_writes_first)
    late = CliRunner().invoke(cli_main, ["memory", "--preset", "qwen3-next-80b-a3b", "--output", str(out)])
    assert early.exit_code == late.exit_code == 2
    assert "Traceback" not in late.output and late.exception is None or isinstance(late.exception, SystemExit)
    message = f"--output {out} exists; refusing to overwrite it (pass --overwrite to replace it)"
    assert message in early.output and message in late.output
    assert out.read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


# ------------------------------------------------------------------------------------------ SIGTERM
def test_sigterm_while_writing_leaves_no_temporary_file(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from linattn.tools.harness import results
        def slow(tmp):
            tmp.write_text("half a fi")
            print("writing", flush=True)
            time.sleep(30)
        results.atomic_write({str(tmp_path / "r.json")!r}, slow)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": SRC},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert len(list(tmp_path.iterdir())) == 1  # the temporary file exists now
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []


def test_sigterm_mid_run_leaves_nothing(tmp_path):
    """A real tool run killed while it measures: no result, no temporary file."""
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    cmd = [sys.executable, "-m", "linattn.tools.cli", "recall", "--trials", "64", "--output", str(out),
           "--plot", str(png)]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    seen = b""
    while b"%|" not in seen:  # the progress bar is drawn: imports are done and it is measuring
        byte = proc.stderr.read(1)
        assert byte, seen.decode(errors="replace")
        seen += byte
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ inputs
def _bad_inputs(tmp: Path) -> dict[str, tuple[str, str]]:
    os.mkfifo(tmp / "fifo.json")
    (tmp / "folder.json").mkdir()
    big = tmp / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(jsonfile.MAX_BYTES + 1)  # sparse: large on paper, no disk used
    (tmp / "deep.json").write_text("[" * 100 + "]" * 100)
    (tmp / "deeper.json").write_text("[" * 100_000 + "]" * 100_000)
    cases = {
        "FIFO": (str(tmp / "fifo.json"), "is a FIFO"),
        "device": ("/dev/null", "is a device"),
        "folder": (str(tmp / "folder.json"), "is a folder"),
        "over the size cap": (str(big), "over the limit"),
        "nested 100 deep": (str(tmp / "deep.json"), "nests lists or objects too deeply"),
        "nested 100000 deep": (str(tmp / "deeper.json"), "nests lists or objects too deeply"),
    }
    for name, text, words in (("nan", '{"a": NaN}', "NaN"), ("inf", '{"a": [1, Infinity]}', "Infinity"),
                              ("-inf", '{"a": -Infinity}', "-Infinity"), ("1e999", '{"a": 1e999}', "1e999"),
                              ("utf16", None, "not UTF-8")):
        f = tmp / f"{name}.json"
        if text is None:
            f.write_bytes('{"a": 1}'.encode("utf-16"))
        else:
            f.write_text(text)
        cases[name] = (str(f), words)
    return cases


def test_read_json_refuses_what_is_not_a_small_regular_file_of_finite_json(tmp_path):
    for name, (path, words) in _bad_inputs(tmp_path).items():
        start = time.perf_counter()
        with pytest.raises(ValueError, match=words.replace("+", r"\+")) as info:
            jsonfile.read_json(path, what="file")
        assert time.perf_counter() - start < 5, name  # a FIFO without a writer must not block
        assert path.split("/")[-1] in str(info.value) or name == "device", name
    with pytest.raises(FileNotFoundError, match="does not exist"):
        jsonfile.read_json(tmp_path / "absent.json")
    (tmp_path / "ok.json").write_text('{"a": [1, 2.5, {"b": null}]}')
    assert jsonfile.read_json(tmp_path / "ok.json") == {"a": [1, 2.5, {"b": None}]}


@pytest.mark.parametrize("argv", [["bench", "show"], ["memory", "--config"]])
def test_bench_show_and_memory_config_refuse_bad_inputs_with_a_message(argv, tmp_path):
    for name, (path, words) in _bad_inputs(tmp_path).items():
        res = CliRunner().invoke(cli_main, [*argv, path])
        assert res.exit_code == 2, (name, res.output)
        said = words in res.output or (name == "folder" and "is a directory" in res.output)  # click's own check
        assert said and "Traceback" not in res.output, (name, res.output)


# ------------------------------------------------------------------------------------------ memory planner
def test_memory_planner_is_constant_time_or_names_the_absurd_size():
    from linattn.tools import memory as mem

    start = time.perf_counter()
    with pytest.raises(ValueError, match="layers must be at most 100,000"):
        mem.plan_from_shapes(layers=10**12, heads=1, feature_dim=1)
    with pytest.raises(ValueError, match="layers must be at most"):
        mem.state_bytes(1, 10**100, 1, 1, 1, 4)
    plan = mem.plan_from_shapes(layers=mem.MAX_LAYERS, heads=2, feature_dim=4, full_attention_interval=4)
    report = mem.memory_report(plan, [0, mem.MAX_SEQ_LEN])
    assert report["rows"][1]["all_full_kv_bytes"] == mem.MAX_LAYERS * 2 * 2 * 4 * 2 * mem.MAX_SEQ_LEN
    with pytest.raises(ValueError, match="seq_len must be at most"):
        mem.memory_report(plan, [mem.MAX_SEQ_LEN + 1])
    with pytest.raises(ValueError, match="seq_len must be at most .* an integer of"):
        mem.kv_cache_bytes(1, 1, 1, 1, 10**4000, 2)  # not even printed in full
    with pytest.raises(ValueError, match="heads must be at most"):
        mem.plan_from_shapes(layers=2, heads=2**40, feature_dim=1)
    with pytest.raises(ValueError, match="'num_hidden_layers' must be at most"):
        mem.plan_from_config({"num_hidden_layers": 10**9, "full_attention_interval": 4, "linear_num_key_heads": 1,
                              "linear_num_value_heads": 1, "linear_key_head_dim": 1, "linear_value_head_dim": 1,
                              "num_key_value_heads": 1, "head_dim": 1})
    assert time.perf_counter() - start < 5.0  # all of it; the largest plan above has 100,000 layers


def test_memory_cli_names_absurd_sizes_and_without_arguments_shows_the_presets():
    res = CliRunner().invoke(cli_main, ["memory", "--layers", str(10**15), "--heads", "1", "--feature-dim", "1"])
    assert res.exit_code == 2 and "layers must be at most 100,000" in res.output
    res = CliRunner().invoke(cli_main, ["memory", "--preset", "qwen3-next-80b-a3b", "--seq-len", str(10**30)])
    assert res.exit_code == 2 and "seq_len must be at most" in res.output
    res = CliRunner().invoke(cli_main, ["memory"])
    assert res.exit_code == 0, res.output
    assert "kimi-linear-48b-a3b" in res.output and "qwen3-next-80b-a3b" in res.output
    assert "24.07 GiB / 96.00 GiB" in res.output  # Qwen3-Next at 1M tokens, as in the README
    res = CliRunner().invoke(cli_main, ["memory", "--output", "x.json"])
    assert res.exit_code == 2 and "need one model" in res.output


# ------------------------------------------------------------------------------------------ cli_files
def test_two_flags_naming_one_file_are_refused(tmp_path):
    import click

    with pytest.raises(click.UsageError, match="--output and --plot name the same file"):
        cli_files.check_outputs(False, {"--output": tmp_path / "a", "--plot": str(tmp_path / "a")})


def test_write_prints_the_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli_main, ["memory", "--preset", "qwen3-next-80b-a3b", "--output", "m.json"])
    assert res.exit_code == 0 and f"wrote {tmp_path / 'm.json'}" in res.output


# ------------------------------------------------------------------------------------------ what the tools say
def test_perf_warns_about_missing_peers_before_measuring(monkeypatch):
    from linattn.tools.perf import peers as pp

    fake = pp.Peer("fla.nothing_here", "linattn_no_such_module", "f", "accumulate", "chunk",
                   lambda fn, inp: fn(inp), "flash-linear-attention")
    monkeypatch.setattr(pp, "PEERS", (fake,))
    calls = []

    def measured(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("stop after the start")

    monkeypatch.setattr(perf, "run", measured)
    res = CliRunner().invoke(cli_main, ["perf", "--only", "fwd/accumulate"])  # (--quick says it in its summary)
    assert calls == [1]  # the warning came first, then the run began
    assert "warning: no peer is installed (fla.nothing_here)" in res.stderr
    assert 'pip install -c constraints.txt ".[peers]"' in res.stderr
    # nothing to warn about when the run compares against no peer
    assert perf.peer_warning(work.select(perf.build_cases(work.QUICK, peers=()), ("decode",))) is None


def test_recall_explains_its_columns():
    recs = recall.run_recall(d=8, dv=8, alphas=(0.9,), n_values=(4,), distance_pairs=2, total_length=12,
                             distances=(0, 4), correlation_pairs=4, similarities=(0.8,), trials=1, progress=False)
    text = {s: recall.explain(recs, s) for s in ("capacity", "distance", "correlation")}
    assert "'rand N=n' n pairs with random unit keys" in text["capacity"]
    assert "'dist=k' k filler writes" in text["distance"] and "between the 2 pairs" in text["distance"]
    assert "'dup s' near duplicates with expected cosine s" in text["correlation"]
    assert all("'a=' is the gate alpha" in t for t in text.values())


def test_recall_plot_is_two_by_two_with_one_legend_outside(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    recs = recall.run_recall(d=8, dv=8, alphas=(0.9,), n_values=(4, 8), distance_pairs=2, total_length=12,
                             distances=(0, 4), correlation_pairs=4, similarities=(0.8,), trials=1, progress=False)
    doc = {"config": {"d": 8}, "records": recs}
    shown, close = {}, plt.close
    monkeypatch.setattr(plt, "close", lambda fig: shown.setdefault("fig", fig))
    recall.plot(doc, tmp_path / "r.png")
    fig = shown["fig"]
    assert len(fig.axes) == 4 and fig.get_size_inches().tolist() == [11.0, 8.5]
    assert [ax.get_legend() for ax in fig.axes] == [None] * 4 and len(fig.legends) == 1
    fig.canvas.draw()
    legend_box = fig.legends[0].get_window_extent()
    assert all(legend_box.x0 >= ax.get_window_extent().x1 for ax in fig.axes)  # right of every panel
    close(fig)


def test_stability_eps_panel_draws_only_curves_that_can_be_seen():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def case(mode, eps, changes):
        return {"eps_mode": mode, "eps": eps, "max_rel_change": max(changes),
                "by_den_decade": [{"decade": d, "max_rel_change": c} for d, c in zip((-3, -2, -1), changes,
                                                                                        strict=True)]}

    eps = {"den_min": 1e-3, "den_max": 1.0, "cases": [
        case("add", 1e-12, [1e-9, 1e-10, 1e-11]), case("add", 1e-2, [0.9, 0.5, 0.1]),
        case("clamp", 1e-12, [0.0, 0.0, 0.0]), case("clamp", 1e-2, [0.9, 0.0, 0.0])]}
    fig, ax = plt.subplots()
    stability_plot._plot_epsilon(ax, eps)
    curves = [ln for ln in ax.lines if len(ln.get_xdata()) > 0 and ln.get_linestyle() == "-"]
    assert len(curves) == 2  # the two add cases; clamp curves would hide under them or vanish on a log axis
    vlines = [ln for ln in ax.lines if ln.get_linestyle() == ":" and len(ln.get_xdata()) == 2]
    assert [ln.get_xdata()[0] for ln in vlines] == [1e-2]  # clamp 1e-2 changed tokens below den = 1e-2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "clamp, eps 1e-12: no token changed" in labels
    plt.close(fig)
