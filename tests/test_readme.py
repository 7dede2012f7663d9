"""The README as a newcomer meets it: short, every Python block (of the README and of docs/*.md) runs pasted alone
into a fresh interpreter, its links lead somewhere, its headline number is the committed result's, and the user
docs carry no workshop words.

A docs block may be marked by an HTML comment on the line before it: ``<!-- requires: transformers -->`` skips it
when that package is missing, ``<!-- no-run -->`` marks a fragment that is not run at all (keep these rare)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
BLOCKS = re.findall(r"```python\n(.*?)```", TEXT, flags=re.S)
MARKED_BLOCK = re.compile(r"(?:<!--\s*(requires:[^>]*?|no-run)\s*-->\s*\n)?```python\n(.*?)```", flags=re.S)


def docs_blocks() -> list:
    """One pytest param per Python block of docs/*.md, id ``page.md:line``, skipped as its marker says."""
    params = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in MARKED_BLOCK.finditer(text):
            marker, block = match.group(1) or "", match.group(2)
            line = text.count("\n", 0, match.start(2))
            marks = []
            if marker == "no-run":
                marks.append(pytest.mark.skip(reason="marked <!-- no-run -->: a fragment"))
            elif marker.startswith("requires:"):
                missing = [m for m in marker.split(":", 1)[1].replace(",", " ").split() if not importable(m)]
                if missing:
                    marks.append(pytest.mark.skip(reason=f"needs {', '.join(missing)}"))
            params.append(pytest.param(block, id=f"{page.name}:{line}", marks=marks))
    return params


def importable(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def run_alone(block: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    res = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # an example writes nothing


def test_readme_is_short():
    assert len(TEXT.splitlines()) <= 160


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_every_python_block_runs_alone_in_a_fresh_interpreter(block, tmp_path):
    run_alone(block, tmp_path)


@pytest.mark.parametrize("block", docs_blocks())
def test_every_docs_python_block_runs_alone_in_a_fresh_interpreter(block, tmp_path):
    run_alone(block, tmp_path)


def test_docs_blocks_are_found_and_markers_are_rare():
    blocks = docs_blocks()
    assert len(blocks) >= 9
    assert sum(1 for b in blocks if b.marks and "no-run" in b.marks[0].kwargs.get("reason", "")) <= 2


def test_there_is_one_self_contained_example():
    assert len(BLOCKS) >= 1 and "import linattn" in BLOCKS[0] and "import torch" in BLOCKS[0]


def test_links_lead_to_files():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", TEXT)
    assert targets
    missing = [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
    assert missing == []


def test_quick_start_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -c constraints.txt ".[tools]" && linattn bench' in TEXT
    assert 'pip install -c constraints.txt ".[test,peers]" && python -m pytest' in TEXT
    assert 'pip install -q -c constraints.txt ".[test,peers,docs]"' in ci and "\npython3 -m pytest\n" in ci


def test_headline_is_the_committed_result():
    doc = json.loads((ROOT / "benchmarks/results/memory_qwen3-next-80b-a3b.json").read_text())
    row = next(r for r in doc["rows"] if r["seq_len"] == 1_048_576)
    assert f"{row['hybrid_bytes'] / 2**30:.2f} GiB" in TEXT and f"{row['all_full_kv_bytes'] / 2**30:.2f} GiB" in TEXT
    assert f"{row['all_linear_state_bytes'] / 2**20:.2f} MiB" in TEXT and "1,048,576 tokens" in TEXT


WORKSHOP = re.compile(r"\bissues? \d|\bissue #?\d|these machines|this machine|\bI (?:could|did|ran|think|found)\b|"
                      r"\brerun history\b|review fix", re.I)


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_user_docs_carry_no_workshop_words(page):
    hits = [line.strip()[:120] for line in page.read_text(encoding="utf-8").splitlines() if WORKSHOP.search(line)]
    assert hits == []


def test_every_docs_page_is_in_the_site_nav():
    nav = set(re.findall(r":\s*([\w./-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), flags=re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - nav == set(), "add these pages to mkdocs.yml's nav"
    assert nav - pages == set(), "the nav names pages that do not exist"
