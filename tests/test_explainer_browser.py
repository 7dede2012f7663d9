"""The explainer page in a real headless Chromium (Debian's ``chromium``, driven by the ``playwright`` package).

No browser build is ever downloaded: the browser is ``$LINATTN_CHROMIUM``, ``/usr/bin/chromium`` or ``chromium``
on PATH. Without one these tests skip locally, but fail under CI (``CI`` set) unless ``LINATTN_SKIP_BROWSER=1``
says explicitly that this machine has no browser.
"""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from linattn import memory, reference
from linattn.explainer import build_page, lab_source

EXPECTED_SCENES = ["intro", "softmax", "rewrite", "matrix", "tokens", "whyz", "eps", "memory", "gates", "delta",
                   "chunks", "devices", "code", "saves", "long", "exercises", "playground"]


def _browser_path() -> str | None:
    for candidate in (os.environ.get("LINATTN_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def _no_browser(reason: str):
    if os.environ.get("CI") and os.environ.get("LINATTN_SKIP_BROWSER") != "1":
        pytest.fail(f"{reason}: CI needs it (apt-get install chromium; pip install playwright), "
                    "or set LINATTN_SKIP_BROWSER=1 to skip on purpose")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _no_browser("the playwright package is not installed")
    path = _browser_path()
    if path is None:
        _no_browser("no chromium executable found")
    with sync_playwright() as pw:
        # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start.
        b = pw.chromium.launch(executable_path=path, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def page_url(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("explainer") / "page.html"
    path.write_text(build_page("en"), encoding="utf-8")
    return path.as_uri()


@pytest.fixture
def page(browser, page_url):
    """A fresh tab that records console errors, page errors and every request it makes."""
    pg = browser.new_page(viewport={"width": 1100, "height": 760})
    pg.problems, pg.requests = [], []
    def on_console(msg):
        if msg.type in ("error", "warning"):
            pg.problems.append(f"console {msg.type}: {msg.text}")

    pg.on("console", on_console)
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.on("request", lambda r: pg.requests.append(r.url))
    yield pg
    for url in pg.requests:  # only the file itself (any query/hash) and inline data: URLs
        assert url.startswith(page_url) or url.startswith("data:"), url
    assert pg.problems == []
    pg.close()


def step(pg) -> int:
    return int(pg.evaluate("document.documentElement.dataset.step"))


def test_keys_slider_and_hash_move_the_step(page, page_url):
    page.goto(page_url)
    n = int(page.evaluate("document.documentElement.dataset.steps"))
    assert n == page.evaluate("window.linattnExplainer.steps") and n > 20 and step(page) == 0
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert step(page) == 2 and page.evaluate("location.hash") == "#step=2"
    page.keyboard.press("ArrowLeft")
    assert step(page) == 1
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")  # stays at the first step
    assert step(page) == 0
    page.click("#next")
    assert step(page) == 1
    # Dragging the timeline: press on its knob at the left end and release three quarters along.
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + 6, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] / 2, steps=8)
    page.mouse.up()
    dragged = step(page)
    assert abs(dragged - 0.75 * (n - 1)) <= 2
    assert page.evaluate("document.getElementById('timeline').value") == str(dragged)
    page.focus("#timeline")  # keyboard on the focused slider: the browser moves it, the page follows
    page.keyboard.press("ArrowRight")
    assert step(page) == dragged + 1
    page.keyboard.press("Tab")  # off the slider (to the next button): the page's own keys work again
    page.keyboard.press("End")
    assert step(page) == n - 1
    page.keyboard.press("Home")
    assert step(page) == 0
    page.evaluate("location.hash = '#step=12'")
    page.wait_for_function("document.documentElement.dataset.step === '12'")
    page.reload()
    assert step(page) == 12
    page.goto(page_url + "#step=5")
    assert step(page) == 5
    page.goto(page_url + "#step=9999")
    assert step(page) == n - 1


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_scene_renders_in_both_languages(page, page_url, lang):
    page.goto(f"{page_url}?lang={lang}")
    assert page.evaluate("document.documentElement.lang") == ("zh-CN" if lang == "zh" else "en")
    assert page.evaluate("window.linattnExplainer.scenes") == EXPECTED_SCENES
    seen = set()
    for i in range(int(page.evaluate("document.documentElement.dataset.steps"))):
        page.evaluate(f"window.linattnExplainer.go({i})")
        seen.add(page.evaluate("document.documentElement.dataset.scene"))
        narration = page.inner_text("#narration")
        visual = page.inner_text("#stage .visual") + page.inner_html("#stage .visual")
        assert len(narration) > 20 and len(visual) > 20, (lang, i)
        has_cjk = any("\u4e00" <= ch <= "\u9fff" for ch in narration)
        assert has_cjk == (lang == "zh"), (lang, i, narration)
    assert seen == set(EXPECTED_SCENES)


WORKED = [  # scene, its step within the scene, text that must be on screen
    ("tokens", 4, "y = 17/6"),
    ("chunks", 1, "74/11"),
    ("delta", 0, "3.5 → 4.25 → 4.625"),
    ("memory", 0, "33,816,576 bytes"),
    ("memory", 0, "T = 129"),
    ("gates", 0, "10.5"),
    ("matrix", 1, "[17/6, 10/3]"),
]


def _go_scene(pg, scene: str, sub: int) -> None:
    first = pg.evaluate(f"""(() => {{ const x = window.linattnExplainer; for (let i = 0; i < x.steps; i++) {{
        x.go(i); if (document.documentElement.dataset.scene === {scene!r}) return i; }} return -1; }})()""")
    assert first >= 0
    pg.evaluate(f"window.linattnExplainer.go({first + sub})")
    assert pg.evaluate("document.documentElement.dataset.scene") == scene


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_worked_numbers_appear_in_their_scenes(page, page_url, lang):
    page.goto(f"{page_url}?lang={lang}")
    for scene, sub, text in WORKED:
        _go_scene(page, scene, sub)
        assert text in page.inner_text("#stage"), (scene, text)
    _go_scene(page, "intro", 0)
    assert "17/6" not in page.inner_text("#stage")  # the numbers are in their scenes, not everywhere


def _random_spec(rng: np.random.Generator, rule: str, eps_mode: str) -> dict:
    T, r, dv = int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 3))
    delta = rule in reference.DELTA_RULES
    normalize = False if delta else bool(rng.random() < 0.75)
    low = 0.0 if rng.random() < 0.3 else 0.05  # features may be 0: the denominator then leans on eps
    spec = {"rule": rule, "q": rng.uniform(low, 2, (T, r)).tolist(), "k": rng.uniform(low, 2, (T, r)).tolist(),
            "v": rng.normal(0, 2, (T, dv)).tolist(), "eps": float(rng.choice([1e-6, 1e-3, 0.5])), "eps_mode": eps_mode,
            "normalize": normalize}
    if delta:
        spec["k"] = (np.array(spec["k"]) / np.linalg.norm(spec["k"], axis=1, keepdims=True).clip(1e-3)).tolist()
        spec["beta"] = rng.uniform(0, 1.9, T).tolist()
    if rule in reference.GATED_RULES:
        alpha = rng.uniform(0, 1, T)
        alpha[rng.random(T) < 0.2] = rng.choice([0.0, 1.0])  # the ends of the range
        spec["alpha"] = alpha.tolist()
    return spec


def _reference_run(spec: dict) -> dict:
    q, k, v = (np.array(spec[x])[None, :, None] for x in ("q", "k", "v"))
    kw = {"rule": spec["rule"], "normalize": spec["normalize"], "scale": 1.0, "feature_map": None,
          "eps": spec["eps"], "eps_mode": spec["eps_mode"]}
    out = {"S": [], "z": [] if spec["normalize"] else None, "y": []}
    for t in range(1, q.shape[1] + 1):  # the reference on every prefix gives the state after each token
        extra = {}
        if "alpha" in spec:
            with np.errstate(divide="ignore"):
                extra["g"] = np.log(np.array(spec["alpha"][:t]))[None, :, None]
        if "beta" in spec:
            extra["beta"] = np.array(spec["beta"][:t])[None, :, None]
        o, S, z = reference.linear_attention(q[:, :t], k[:, :t], v[:, :t], **kw, **extra)
        out["S"].append(S[0, 0])
        if z is not None:
            out["z"].append(z[0, 0])
        out["y"].append(o[0, t - 1, 0])
    return out


def test_engine_equals_the_reference_on_random_specs(page, page_url):
    rng = np.random.default_rng(2024)
    specs = [_random_spec(rng, rule, mode) for _ in range(30) for rule in reference.RULES for mode in ("add", "clamp")]
    assert len(specs) >= 200
    page.goto(page_url)
    got = page.evaluate("specs => specs.map(s => window.linattnExplainer.run(s))", specs)  # one call, all specs
    worst = 0.0
    for spec, res in zip(specs, got, strict=True):
        want = _reference_run(spec)
        assert (res["z"] is None) == (want["z"] is None)
        for key in ("S", "z", "y"):
            for a, b in zip(res[key] or [], want[key] or [], strict=True):
                a, b = np.asarray(a, dtype=np.float64), np.asarray(b)
                assert a.shape == b.shape
                err = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
                worst = max(worst, err)
                assert err <= 1e-12, (spec, key, a, b)
    assert worst < 1e-12


def test_engine_refuses_bad_specs(page, page_url):
    page.goto(page_url)
    for bad, word in [({"rule": "softmax"}, "rule"), ({"rule": "delta", "normalize": True, "beta": [0.5]}, "normalize"),
                      ({"rule": "gated", "alpha": [1.5]}, "alpha")]:
        spec = {"q": [[1.0]], "k": [[1.0]], "v": [[1.0]], **bad}
        catch = "s => { try { window.linattnExplainer.run(s); return ''; } catch (e) { return e.message; } }"
        msg = page.evaluate(catch, spec)
        assert word in msg


def test_memory_fields_recompute_with_linattn_memory_formulas(page, page_url):
    page.goto(page_url)
    _go_scene(page, "memory", 0)
    fields = (("B", "2"), ("L", "3"), ("H", "5"), ("r", "64"), ("dv", "96"), ("head_dim", "80"), ("kv_heads", "2"))
    for key, val in fields:
        page.fill(f"#mem-{key}", val)
    page.select_option("#mem-state_dtype", "bfloat16")
    page.select_option("#mem-kv_dtype", "float32")
    want = memory.state_bytes(2, 3, 5, 64, 96, "bfloat16")
    assert page.inner_text("#mem-state") == f"{want:,} bytes"
    cross = memory.crossover_length(memory.state_bytes(1, 1, 1, 64, 96, "bfloat16"),
                                    memory.kv_cache_bytes(1, 1, 1, 80, 1, "float32"))
    assert page.inner_text("#mem-cross") == f"T = {cross:,}"
    # Past 2**53 the page stays exact (BigInt), like linattn.memory's integers.
    for key, val in (("B", "100000"), ("L", "100"), ("H", "128"), ("r", "4097"), ("dv", "4099")):
        page.fill(f"#mem-{key}", val)
    big = memory.state_bytes(100000, 100, 128, 4097, 4099, "bfloat16")
    assert big > 2**53 and page.inner_text("#mem-state") == f"{big:,} bytes"
    page.keyboard.press("Escape")  # leaves the field: the arrows step again
    before = step(page)
    page.keyboard.press("ArrowRight")
    assert step(page) == before + 1


def test_exercise_answer_hidden_until_asked(page, page_url):
    page.goto(page_url)
    _go_scene(page, "exercises", 0)
    assert not page.is_visible("#answer")
    page.click("#reveal")
    assert page.is_visible("#answer") and "3.166667" in page.inner_text("#answer")  # 19/6
    _go_scene(page, "exercises", 2)
    page.click("#reveal")
    assert "7.5 → 3.75 → 5.625" in page.inner_text("#answer")  # error 5 times -0.5 per write: overshoots, converges


def test_playground_updates_live(page, page_url):
    page.goto(page_url)
    _go_scene(page, "playground", 0)
    assert "y = [2.8333]" in page.inner_text("#pg-out")
    page.fill("#pg-v20", "9")  # third token's value 3 -> 9: y3 = (2*2 + 4 + 3*9) / 6 = 35/6
    assert "y = [5.8333]" in page.inner_text("#pg-out")
    page.select_option("#pg-rule", "gated_delta")
    page.fill("#pg-b0", "1")
    assert page.is_visible("#pg-a0") and "z =" not in page.inner_text("#pg-out")


def test_lab_download_link_is_the_lab(page, page_url):
    page.goto(page_url)
    href = page.get_attribute("#lab-download", "href")
    prefix = "data:text/x-python;charset=utf-8;base64,"
    assert href.startswith(prefix) and page.get_attribute("#lab-download", "download") == "lab.py"
    assert base64.b64decode(href[len(prefix):]).decode("utf-8") == lab_source()


def test_turning_the_softmax_query_changes_every_weight(page, page_url):
    from linattn.explainer.scenes import softmax_scene

    page.goto(page_url)
    _go_scene(page, "softmax", 1)
    want = softmax_scene()["queries"][1]  # the slider starts at 90 degrees: q = [0, 1.5]
    assert f"y = {round(want['y'], 4)}" in page.inner_text("#stage")
    widths = page.eval_on_selector_all("#stage .bar", "bars => bars.map(b => b.style.width)")
    page.fill("#softmax-angle", "0")
    page.dispatch_event("#softmax-angle", "input")
    moved = page.eval_on_selector_all("#stage .bar", "bars => bars.map(b => b.style.width)")
    assert len(moved) == 5 and all(a != b for a, b in zip(widths, moved, strict=True))


def test_language_buttons_switch_and_keep_the_step(page, page_url):
    page.goto(page_url + "#step=8")
    page.click("#lang-zh")
    assert step(page) == 8 and page.evaluate("new URL(location.href).searchParams.get('lang')") == "zh"
    assert any("\u4e00" <= ch <= "\u9fff" for ch in page.inner_text("#narration"))
    page.keyboard.press("ArrowRight")  # the keyboard still drives the page after a click on a button
    assert step(page) == 9
    page.click("#lang-en")
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in page.inner_text("#narration"))


def test_eps_scene_recomputes_for_another_eps(page, page_url):
    from linattn.explainer.scenes import eps_scene

    page.goto(page_url)
    _go_scene(page, "eps", 0)
    assert "1.5" in page.inner_text("#eps-table")  # den = eps = 1e-6 with "add": 3e-6 / 2e-6
    page.select_option("#eps-choice", "1e-9")
    want = eps_scene(1e-9)["rows"]  # the reference's numbers for the eps the learner picked
    cells = "rows => rows.slice(1).map(r => [...r.cells].map(c => c.innerText))"
    got = page.eval_on_selector_all("#eps-table tr", cells)
    assert len(got) == len(want)
    for row, ref in zip(got, want, strict=True):
        assert [float(row[1]), float(row[2])] == pytest.approx([ref["add"], ref["clamp"]], rel=1e-6, abs=1e-9)
    assert float(got[3][1]) == pytest.approx(2.997003)  # den = 1e-6 is no longer halved
