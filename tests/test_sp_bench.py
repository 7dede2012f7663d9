"""``linattn sp-bench``: the tool end to end on tiny shapes (bytes flat in T and within headers of the formula,
the result valid), and its files: written only where a flag asks, an existing one refused with one line."""

from __future__ import annotations

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
