"""The downloadable lab.py runs with nothing but NumPy: a fresh venv (no system site-packages) gets only numpy.

Marked ``network`` (it installs numpy from the package index, ~20 s): deselect offline with ``-m "not network"``.
"""

from __future__ import annotations

import re
import subprocess
import venv

import pytest

from linattn.tools.explainer import lab_source

LINE = re.compile(r"^(?P<name>.+): (?P<verdict>PASS|FAIL)  max_err=(?P<err>\S+) tol=(?P<tol>\S+)$")
REQUIRED = ("recurrent vs dense kernel", "recurrent vs chunkwise", "gated scan coefficients",
            "delta unit-key convergence")


@pytest.mark.network
def test_lab_runs_in_a_fresh_numpy_only_venv(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    py = env_dir / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy"], check=True,
                   timeout=300)
    # Only numpy (and pip's own tools) are importable: no torch, no linattn.
    probe = "import importlib.util as u; print([m for m in ('torch', 'linattn', 'click') if u.find_spec(m)])"
    assert subprocess.run([py, "-c", probe], capture_output=True, text=True, check=True, cwd=tmp_path).stdout == "[]\n"
    lab = tmp_path / "lab.py"
    lab.write_text(lab_source(), encoding="utf-8")
    for args in ([], ["--seed", "7"]):
        res = subprocess.run([py, lab.name, *args], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        lines = [LINE.match(line) for line in res.stdout.splitlines()[:-2]]  # then the summary and the contrast
        assert all(m and m["verdict"] == "PASS" for m in lines), res.stdout
        assert set(REQUIRED) <= {m["name"] for m in lines}
    # A broken chunk form turns its line into FAIL and the exit status into 1.
    lab.write_text(lab_source().replace("num = into[:, None] * (Q @ S) + A @ V", "num = into[:, None] * (Q @ S)"))
    res = subprocess.run([py, lab.name], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 1 and "recurrent vs chunkwise: FAIL" in res.stdout, res.stdout
