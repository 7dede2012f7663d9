"""``linattn sp-bench``: the tool end to end on tiny shapes (bytes flat in T and within headers of the formula,
the result valid), and its files: written only where a flag asks, an existing one refused with one line; Ctrl-C
stops it with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from linattn.distributed import message_bytes
from linattn.tools.harness.results import read_result
from linattn.tools.sp import bench as sp_bench

TINY = ["--ranks", "2", "--lengths", "64,256", "--rules", "gated,delta", "--heads", "1", "--dim", "8", "--repeats", "1"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sp")
    out, png = folder / "sp.json", folder / "sp.png"
    res = CliRunner().invoke(sp_bench.command, [*TINY, "-o", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    return read_result(out, "sp_bench"), png, res.output


def test_sp_bench_smoke(measured):
    doc, png, output = measured
    assert png.stat().st_size > 0 and f"wrote {png}" in output
    for row in doc["rows"]:
        msg = message_bytes(row["rule"], 1, 1, 8, 8)
        assert row["message_bytes"] == msg and row["formula_fwd_bytes"] == msg
        assert all(msg <= b <= msg + 4096 for b in row["bytes_fwd"]), row["bytes_fwd"]
        assert row["sp_fwd_ms"] > 0 and row["sp_fwd_cpu_ms"] > 0
    assert all(c["ok"] for c in doc["checks"].values()), doc["checks"]
    assert doc["model"]["ranks"][-1] == 1024
    assert doc["environment"]["cpu"] and doc["rows"][0]["single_fwd_ms"] > 0


def _never(*args, **kwargs):
    raise AssertionError("measured although an output could not be written")


def test_twice_in_one_folder_without_flags_writes_nothing(measured, tmp_path, monkeypatch):
    """A run without -o or --plot prints its table and leaves the folder as it was, however often it runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sp_bench, "run", lambda cfg: measured[0])
    for _ in range(2):
        res = CliRunner().invoke(sp_bench.command, ["--quick"])
        assert res.exit_code == 0 and res.exception is None, res.output
        assert "| gated |" in res.output and "wrote" not in res.output
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_is_refused_with_one_line_before_measuring(measured, tmp_path, monkeypatch):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    out.write_text("{}")
    monkeypatch.setattr(sp_bench, "run", _never)
    for args, flag, path in ((["-o", str(out)], "--output", out), (["--plot", str(out)], "--plot", out)):
        res = CliRunner().invoke(sp_bench.command, ["--quick", *args])
        assert res.exit_code == 2 and "Traceback" not in res.output, res.output
        assert f"{flag} {path} exists; refusing to overwrite it (pass --overwrite to replace it)" in res.output
    assert out.read_text() == "{}"
    monkeypatch.setattr(sp_bench, "run", lambda cfg: measured[0])
    res = CliRunner().invoke(sp_bench.command, ["--quick", "-o", str(out), "--plot", str(png), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert read_result(out, "sp_bench") == measured[0] and png.stat().st_size > 0


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _session(sid: int) -> str:
    """One line per process of session ``sid``: pid, parent, state, kernel wait channel, command line."""
    lines = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != sid:  # the session id
                continue
            d = stat.parent
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
            lines.append(f"{d.name} ppid {fields[1]} state {fields[0]} wchan {(d / 'wchan').read_text()} {cmd}")
        except (OSError, IndexError, ValueError):
            continue
    return "\n".join(lines) or "(none)"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the ranks' ids from /proc")
@pytest.mark.parametrize("to", ["group", "parent"])
def test_ctrl_c_prints_one_line_stops_the_ranks_and_writes_nothing(to, tmp_path):
    """SIGINT to the process group (a terminal's Ctrl-C) or to the parent alone, while the ranks start up and
    run: one "Aborted!", no rank tracebacks, every rank gone at once, no output file (once 40-81 lines of
    tracebacks, and after a SIGINT to the parent the ranks ran on and died later with "Parent directory ... does
    not exist")."""
    out = tmp_path / "sp.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    args = ["sp-bench", "--ranks", "2", "--lengths", "65536", "--rules", "delta", "-o", str(out)]
    # A terminal's Ctrl-C meets a program whose SIGINT is at its default. A test run started as a background job
    # (`(pytest &)`, nohup) passes SIGINT on ignored, and Python then raises no KeyboardInterrupt: sp-bench would
    # rightly run on. So the child is started with the default, as from a terminal.
    terminal = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "runpy.run_module('linattn.tools.cli', run_name='__main__', alter_sys=True)")
    proc = subprocess.Popen([sys.executable, "-c", terminal, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        kids = _children(proc.pid)
        assert len(kids) >= 2, "the ranks did not start"
        time.sleep(2.0)  # the ranks are importing torch or already measuring
        (os.killpg if to == "group" else os.kill)(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # say which process kept it alive, and what sp-bench had printed
            seen = _session(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
            _, err = proc.communicate()
            pytest.fail(f"sp-bench still running 30 s after SIGINT; its processes:\n{seen}\nstderr:\n{err}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1
    assert [line for line in err.splitlines() if line.strip()] == ["Aborted!"], err
    deadline = time.monotonic() + 5  # multiprocessing's resource tracker leaves when it sees the parent gone
    while [k for k in kids if _running(k)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [k for k in kids if _running(k)]
    assert not out.exists()
