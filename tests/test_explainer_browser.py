"""The explainer page in a real headless Chromium (Debian's ``chromium``, driven by the ``playwright`` package).

No browser build is ever downloaded: the browser is ``$LINATTN_CHROMIUM``, ``/usr/bin/chromium`` or ``chromium``
on PATH. Without one these tests skip locally, but fail under CI (``CI`` set) unless ``LINATTN_SKIP_BROWSER=1``
says explicitly that this machine has no browser.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from linattn import reference
from linattn.tools import memory
from linattn.tools.explainer import build_page, lab_source

EXPECTED_SCENES = ["intro", "softmax", "rewrite", "dense", "matrix", "tokens", "read", "whyz", "eps", "shapes",
                   "memory", "crossover", "gates", "scan", "delta", "repeat", "norm", "chunks", "orders", "devices",
                   "code", "saves", "capacity", "long", "quality", "exercises", "lab", "playground", "references"]
PHONE, DESKTOP = {"width": 390, "height": 844}, {"width": 1280, "height": 800}


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


def _open(browser, page_url, **kw):
    """A fresh tab that records console errors, page errors and every request it makes."""
    pg = browser.new_page(**{"viewport": DESKTOP, **kw})
    pg.problems, pg.requests = [], []
    def on_console(msg):
        if msg.type in ("error", "warning"):
            pg.problems.append(f"console {msg.type}: {msg.text}")

    pg.on("console", on_console)
    pg.on("pageerror", lambda e: pg.problems.append(f"page error: {e}"))
    pg.on("request", lambda r: pg.requests.append(r.url))
    return pg


def _close(pg, page_url):
    for url in pg.requests:  # only the file itself (any query/hash) and inline data: URLs
        assert url.startswith(page_url) or url.startswith("data:"), url
    assert pg.problems == []
    pg.close()


@pytest.fixture
def page(browser, page_url):
    pg = _open(browser, page_url)
    yield pg
    _close(pg, page_url)


def step(pg) -> int:
    return int(pg.evaluate("document.documentElement.dataset.step"))


def _go_scene(pg, scene: str, sub: int = 0) -> None:
    """Go to step `sub` (from 0) of a scene, through the page's own scene table."""
    start = pg.evaluate(f"window.linattnExplainer.sceneStarts[window.linattnExplainer.scenes.indexOf({scene!r})]")
    pg.evaluate(f"window.linattnExplainer.go({start + sub})")
    assert pg.evaluate("document.documentElement.dataset.scene") == scene


def test_keys_slider_and_hash_move_the_step(page, page_url):
    page.goto(page_url)
    n = int(page.evaluate("document.documentElement.dataset.steps"))
    assert n == page.evaluate("window.linattnExplainer.steps") and n > 50 and step(page) == 1
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    assert step(page) == 3 and page.evaluate("location.hash") == "#step=3"
    page.keyboard.press("ArrowLeft")
    assert step(page) == 2
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")  # stays at the first step
    assert step(page) == 1
    page.click("#next")
    assert step(page) == 2
    # Dragging the timeline: press on its knob at the left end and release three quarters along.
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + 6, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] / 2, steps=8)
    page.mouse.up()
    dragged = step(page)
    assert abs(dragged - (1 + 0.75 * (n - 1))) <= 2
    assert page.evaluate("document.getElementById('timeline').value") == str(dragged)
    page.focus("#timeline")  # keyboard on the focused slider: the browser moves it, the page follows
    page.keyboard.press("ArrowRight")
    assert step(page) == dragged + 1
    page.keyboard.press("Tab")  # off the slider (to the next button): the page's own keys work again
    page.keyboard.press("End")
    assert step(page) == n
    page.keyboard.press("Home")
    assert step(page) == 1
    page.evaluate("location.hash = '#step=12'")
    page.wait_for_function("document.documentElement.dataset.step === '12'")
    page.reload()
    assert step(page) == 12 and page.inner_text("#counter") == f"step 12 of {n}"
    page.goto(page_url + "#step=5")
    assert step(page) == 5
    page.goto(page_url + "#step=9999")
    assert step(page) == n
    # The timeline carries a mark at each scene's first step.
    marks = page.eval_on_selector_all("#scene-marks option", "os => os.map(o => Number(o.value))")
    assert marks == page.evaluate("window.linattnExplainer.sceneStarts") and len(marks) == len(EXPECTED_SCENES)


# Each step: the page fits the phone's width, the counter says what the address says, entering animates, every
# legend is drawn in its line's colour, the narration is in the page's language, and zh shows no English UI words
# (code in <pre> and the titles of cited papers aside).
STEP_CHECKS = """() => {
  const W = document.documentElement.clientWidth, wide = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('.scroll, pre, .formula')) continue;  // these scroll inside their own box
    const r = el.getBoundingClientRect();
    if (r.width && r.right > W + 1) wide.push(el.tagName + ' ' + (el.id || '') + ' ' + Math.round(r.right));
  }
  const legends = [];
  for (const svg of document.querySelectorAll('#stage svg')) for (const t of svg.querySelectorAll('[data-legend]')) {
    const line = svg.querySelector('[data-series="' + t.dataset.legend + '"]');
    legends.push([getComputedStyle(t).fill, line ? getComputedStyle(line).stroke : null]);
  }
  return { scroll: document.documentElement.scrollWidth, width: W, wide: wide.slice(0, 3), legends,
           animations: document.getAnimations().length, hash: location.hash,
           counter: document.getElementById('counter').textContent,
           step: document.documentElement.dataset.step, scene: document.documentElement.dataset.scene,
           narration: document.getElementById('narration').innerText,
           visual: document.querySelector('#stage .visual').innerText,
           body: [...document.querySelectorAll('pre, dl.refs dd')].reduce((t, p) => t.replace(p.innerText, ''),
                                                              document.body.innerText) };
}"""
ZH_FORBIDDEN = ["token ", "write", "read q", "S (from 0)", "softmax + KV cache", "linear attention state", "ε mode",
                "elu+1 kernel", "rule ", "chunk size", "numerator", "denominator", "Show worked", "Check", "writes",
                "prediction", "weight of token", "state after", "device ", "one pass", "source:", "new e", "old e",
                "weight(", "num =", "den =", "for every token", "term by term", "hypothetical", "symptom", "mixer",
                " bytes", "add: d", "clamp: max", "gated a=", "state_dtype", "head_dim", "kv_heads", "S_prev", "Q̃_c"]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_step_on_a_phone(browser, page_url, lang):
    pg = _open(browser, page_url, viewport=PHONE)
    pg.goto(f"{page_url}?lang={lang}")
    assert pg.evaluate("document.documentElement.lang") == ("zh-CN" if lang == "zh" else "en")
    assert pg.evaluate("window.linattnExplainer.scenes") == EXPECTED_SCENES
    n, seen, charts = pg.evaluate("window.linattnExplainer.steps"), set(), 0
    for i in range(1, n + 1):
        pg.evaluate(f"window.linattnExplainer.go({i})")
        r = pg.evaluate(STEP_CHECKS)
        where = (lang, i, r["scene"])
        seen.add(r["scene"])
        assert r["scroll"] <= r["width"] and not r["wide"], (where, r["scroll"], r["wide"])
        assert r["step"] == str(i) and r["hash"] == f"#step={i}", where
        assert r["counter"] == (f"第 {i} 步 / 共 {n} 步" if lang == "zh" else f"step {i} of {n}"), where
        assert r["animations"] > 0, where
        for fill, stroke in r["legends"]:
            assert stroke is not None and fill == stroke, (where, fill, stroke)
        charts += len(r["legends"]) > 1
        assert len(r["narration"]) > 20 and len(r["visual"]) > 5, where
        junk = re.search(r"\[object|\b(undefined|NaN|null|Infinity)\b", r["visual"])  # a value that failed to render
        assert junk is None, (where, junk)
        has_cjk = any("\u4e00" <= ch <= "\u9fff" for ch in r["narration"])
        assert has_cjk == (lang == "zh"), where
        if lang == "zh":
            for word in ZH_FORBIDDEN:
                assert word not in r["body"], (where, word)
    assert seen == set(EXPECTED_SCENES) and charts >= 8
    _close(pg, page_url)


def test_no_sideways_scroll_on_desktop_sizes(browser, page_url):
    for size in (DESKTOP, {"width": 1920, "height": 1080}):
        pg = _open(browser, page_url, viewport=size)
        pg.goto(page_url)
        for i in range(1, pg.evaluate("window.linattnExplainer.steps") + 1):
            pg.evaluate(f"window.linattnExplainer.go({i})")
            fits = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
            assert pg.evaluate(fits), (size, i)
        _close(pg, page_url)


def test_reduced_motion_moves_nothing(browser, page_url):
    pg = _open(browser, page_url, viewport=PHONE, reduced_motion="reduce")
    pg.goto(page_url)
    for i in range(1, pg.evaluate("window.linattnExplainer.steps") + 1):
        pg.evaluate(f"window.linattnExplainer.go({i})")
        assert pg.evaluate("document.getAnimations().length") == 0, i
    _close(pg, page_url)


WORKED = [  # scene, its step within the scene, text that must be on screen (both languages)
    ("dense", 0, "17"), ("dense", 1, "2.8333"),
    ("matrix", 1, "y = [8/3, 5/3]"), ("matrix", 1, "[8, 5]"), ("matrix", 1, "2/3, 1/3"),
    ("tokens", 3, "S = [5, 7]"), ("tokens", 3, "z = [2, 2]"),
    ("read", 2, "y = 17/6 ≈ 2.8333"), ("read", 1, "2 × 5 + 1 × 7 = 17"), ("read", 1, "2 × 2 + 1 × 2 = 6"),
    ("eps", 0, "ε = 1e-6: 1; ε = 1e-8: 1.9802"),
    ("memory", 0, "33,816,576"), ("memory", 0, "32.25 MiB"), ("memory", 0, "T = 129"),
    ("crossover", 0, "KV 16 KiB"), ("crossover", 0, "64.5 KiB"), ("crossover", 1, "KV 4 MiB"),
    ("gates", 0, "S: 2 → 5 → 10.5; z: 1 → 1.5 → 1.75"),
    ("scan", 1, "(0.0625, 21.25)"), ("scan", 2, "(0.25, 4)"), ("scan", 2, "(0.0625, 1.875)"),
    ("delta", 0, "e = 5 − 2 = 3"), ("delta", 1, "2 + 0.5 × 3 = 3.5"), ("delta", 1, "4"),
    ("repeat", 0, "2 → 3.5 → 4.25 → 4.625"), ("repeat", 0, "e: 3, 1.5, 0.75"),
    ("norm", 0, "e = 1 → -3 → 9 → -27"),
    ("chunks", 2, "y₅ = 74/11 ≈ 6.7273"), ("chunks", 1, "[2, 1]"),
    ("long", 1, "y = 2.833333"),
    ("quality", 1, "hybrid"),
    ("lab", 0, "recurrent vs dense kernel: PASS"), ("lab", 0, "delta unit-key convergence: PASS"),
    ("lab", 0, "python3 lab.py --seed 7"),
]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_worked_numbers_appear_in_their_scenes(page, page_url, lang):
    page.goto(f"{page_url}?lang={lang}")
    for scene, sub, text in WORKED:
        _go_scene(page, scene, sub)
        # Some numbers appear only when the moving contribution that makes them lands.
        page.wait_for_function("t => document.querySelector('#stage .visual').innerText.includes(t)", arg=text,
                               timeout=5000)
    _go_scene(page, "memory", 0)
    assert ("33,816,576 字节" if lang == "zh" else "33,816,576 bytes") in page.inner_text("#mem-state")
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
    if rng.random() < 0.3:
        spec["initial_S"] = rng.normal(0, 1, (r, dv)).tolist()
        if normalize:
            spec["initial_z"] = rng.uniform(0.1, 2, r).tolist()
    return spec


def _reference_run(spec: dict) -> dict:
    q, k, v = (np.array(spec[x])[None, :, None] for x in ("q", "k", "v"))
    kw = {"rule": spec["rule"], "normalize": spec["normalize"], "scale": 1.0, "feature_map": None,
          "eps": spec["eps"], "eps_mode": spec["eps_mode"]}
    if "initial_S" in spec:
        kw["initial_S"] = np.array(spec["initial_S"])[None, None]
    if "initial_z" in spec:
        kw["initial_z"] = np.array(spec["initial_z"])[None, None]
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
    assert len(specs) >= 200 and sum("initial_S" in s for s in specs) > 30
    page.goto(page_url)
    got = page.evaluate("specs => specs.map(s => window.linattnExplainer.run(s))", specs)  # one call, all specs
    for spec, res in zip(specs, got, strict=True):
        want = _reference_run(spec)
        assert (res["z"] is None) == (want["z"] is None)
        for key in ("S", "z", "y"):
            for a, b in zip(res[key] or [], want[key] or [], strict=True):
                a, b = np.asarray(a, dtype=np.float64), np.asarray(b)
                assert a.shape == b.shape
                err = float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(b)))))
                assert err <= 1e-12, (spec, key, a, b)


BAD_SPECS = [  # JavaScript that edits a good spec `s`, and the field the error must name first
    ("delete s.q", "q"),                       # was: Cannot read properties of undefined
    ("s.eps = Infinity", "eps"),               # was: accepted
    ("s.eps = NaN", "eps"),
    ("s.eps = -1", "eps"),
    ("s.normalize = 'false'", "normalize"),    # was: taken as true
    ("s.rule = 'softmax'", "rule"),
    ("s.rule = 'delta'; s.normalize = true; s.beta = [0.5]", "normalize"),
    ("s.rule = 'gated'; s.alpha = [1.5]", "alpha"),
    ("s.rule = 'gated'", "alpha"),
    ("s.alpha = [0.5]", "alpha"),              # accumulate has no gate
    ("s.rule = 'delta'; s.beta = ['1']", "beta"),
    ("s.eps_mode = 'max'", "eps_mode"),
    ("s.k = [[1, 2]]", "q"),                   # q has 1 feature, k 2
    ("s.v = [[1], [2]]", "v"),
    ("s.q = [[NaN]]", "q"),
    ("s.initial_S = [[1, 2]]", "initial_S"),
    ("s.initial_S = [[1]]", "initial_z"),
    ("s.normalize = false; s.initial_z = [1]", "initial_z"),
    ("s.colour = 1", "colour"),
    ("s = null", "spec"),
]


def test_engine_refuses_bad_specs(page, page_url):
    page.goto(page_url)
    for edit, field in BAD_SPECS:
        msg = page.evaluate(f"""() => {{ let s = {{ rule: "accumulate", q: [[1.0]], k: [[1.0]], v: [[1.0]] }}; {edit};
            try {{ window.linattnExplainer.run(s); return "no error"; }} catch (e) {{ return e.message; }} }}""")
        assert msg.startswith(field + ": "), (edit, msg)
    assert page.evaluate("window.linattnExplainer.run({ q: [1], k: [[1]], v: [[2]], eps: 0 }).y[0][0]") == 2.0


def test_exercise_boxes_check_answers(page, page_url):
    from linattn.tools.explainer.scenes import exercises

    want = exercises()
    for lang in ("en", "zh"):
        page.goto(f"{page_url}?lang={lang}")
        cases = [  # (exercise, right answers as a learner types them, a wrong answer set)
            (0, ["17/6", "1.8333"], ["3", "2"]),
            (1, ["74/11"], ["6"]),
            (2, ["4", "8"], ["2.5", "5"]),  # the overshoot: 2.5 and 5 come from leaving the key's norm out
        ]
        for ex, right, wrong in cases:
            _go_scene(page, "exercises", ex)
            assert not page.is_visible("#ex-solution p")
            for i, text in enumerate(wrong):
                page.fill(f"#ex-answer-{i}", text)
            page.click("#ex-check")
            assert "wrong" in page.get_attribute("#ex-verdict", "class"), (lang, ex)
            for i, text in enumerate(right):
                page.fill(f"#ex-answer-{i}", text)
            page.press("#ex-answer-0", "Enter")
            assert "right" in page.get_attribute("#ex-verdict", "class"), (lang, ex)
            page.click("#ex-solution summary")
            solution = page.inner_text("#ex-solution")
            assert page.is_visible("#ex-solution p")
            assert {0: "[17/6, 11/6]", 1: "74/11", 2: "S′ = 2.5"}[ex] in solution
        page.fill("#ex-answer-0", "four")
        page.click("#ex-check")
        assert "right" not in page.get_attribute("#ex-verdict", "class")
    assert want[0]["answers"] == pytest.approx([17 / 6, 11 / 6]) and want[2]["answers"] == [4.0, 8.0]


def test_gate_and_norm_controls_recompute(page, page_url):
    page.goto(page_url)
    _go_scene(page, "gates", 0)
    page.fill("#gate-alpha", "0.8")
    page.dispatch_event("#gate-alpha", "input")
    o, S, z = reference.linear_attention(np.ones((1, 3, 1, 1)), np.ones((1, 3, 1, 1)),
                                         np.array([2.0, 4.0, 8.0]).reshape(1, 3, 1, 1), rule="gated", scale=1.0,
                                         g=np.log(np.full((1, 3, 1), 0.8)), eps=0.0)
    assert page.inner_text("#gate-alpha-value") == "0.8"
    assert f"S: 2 → 5.6 → {round(float(S[0, 0, 0, 0]), 4):g}" in page.inner_text("#gate-seq")
    _go_scene(page, "norm", 1)
    page.fill("#norm-k", "2")
    page.dispatch_event("#norm-k", "input")
    page.fill("#norm-beta", "1")
    page.dispatch_event("#norm-beta", "input")
    assert "1 − β‖k‖² = -3" in page.inner_text("#norm-factor")
    _go_scene(page, "chunks", 1)
    page.fill("#chunk-size", "3")
    page.dispatch_event("#chunk-size", "input")
    assert page.inner_text("#chunk-size-value") == "3"


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
    page.fill("#mem-B", "0")  # not a size: the field says so and the result keeps the last valid input
    assert "bad" in page.get_attribute("#mem-B", "class") and page.inner_text("#mem-state") == f"{want:,} bytes"
    page.fill("#mem-B", "")
    assert "bad" in page.get_attribute("#mem-B", "class")
    # Past 2**53 the page stays exact (BigInt), like linattn.tools.memory's integers.
    for key, val in (("B", "100000"), ("L", "100"), ("H", "128"), ("r", "4097"), ("dv", "4099")):
        page.fill(f"#mem-{key}", val)
    big = memory.state_bytes(100000, 100, 128, 4097, 4099, "bfloat16")
    assert big > 2**53 and page.inner_text("#mem-state") == f"{big:,} bytes"
    assert not page.get_attribute("#mem-B", "class")
    page.keyboard.press("Escape")  # leaves the field: the arrows step again
    before = step(page)
    page.keyboard.press("ArrowRight")
    assert step(page) == before + 1


def test_playground_updates_live(page, page_url):
    page.goto(page_url)
    _go_scene(page, "playground", 0)
    assert "y = [2.8333]" in page.inner_text("#pg-out")
    page.fill("#pg-v20", "9")  # third token's value 3 -> 9: y3 = (2*2 + 4 + 3*9) / 6 = 35/6
    assert "y = [5.8333]" in page.inner_text("#pg-out")
    page.select_option("#pg-rule", "gated_delta")
    page.fill("#pg-b0", "1")
    assert page.is_visible("#pg-a0") and "z =" not in page.inner_text("#pg-out")
    assert page.locator("#pg-eps").count() == 0 and page.locator("#pg-norm").count() == 0  # no z, no ε to set


def test_lab_download_link_is_the_lab(page, page_url):
    page.goto(page_url)
    prefix = "data:text/x-python;charset=utf-8;base64,"
    for scene, link in (("intro", "#lab-download"), ("lab", "#lab-download-2")):
        _go_scene(page, scene)
        href = page.get_attribute(link, "href")
        assert href.startswith(prefix) and page.get_attribute(link, "download") == "lab.py"
        assert base64.b64decode(href[len(prefix):]).decode("utf-8") == lab_source()


def test_turning_the_softmax_query_changes_every_weight(page, page_url):
    from linattn.tools.explainer.scenes import softmax_scene

    page.goto(page_url)
    _go_scene(page, "softmax", 1)
    want = softmax_scene()["queries"][1]  # the slider starts at 90 degrees: q = [0, 1.5]
    assert f"y = Σ wᵢvᵢ = {round(want['y'], 4)}" in page.inner_text("#stage")
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
    assert page.inner_text("#counter").startswith("第 8 步")
    page.keyboard.press("ArrowRight")  # the keyboard still drives the page after a click on a button
    assert step(page) == 9
    page.click("#lang-en")
    assert not any("\u4e00" <= ch <= "\u9fff" for ch in page.inner_text("#narration"))


def test_eps_scene_recomputes_for_another_eps(page, page_url):
    from linattn.tools.explainer.scenes import eps_scene

    page.goto(page_url)
    _go_scene(page, "eps", 1)
    assert "1.5" in page.inner_text("#eps-table")  # den = eps = 1e-6 with "add": 3e-6 / 2e-6
    page.select_option("#eps-choice", "1e-9")
    want = eps_scene(1e-9)["rows"]  # the reference's numbers for the eps the learner picked
    cells = "rows => rows.slice(1).map(r => [...r.cells].map(c => c.innerText))"
    got = page.eval_on_selector_all("#eps-table tr", cells)
    assert len(got) == len(want)
    for row, ref in zip(got, want, strict=True):
        assert [float(row[1]), float(row[2])] == pytest.approx([ref["add"], ref["clamp"]], rel=1e-6, abs=1e-9)
    assert float(got[3][1]) == pytest.approx(2.997003)  # den = 1e-6 is no longer halved


def test_mqar_table_shows_the_sweep_or_says_nothing_is_finished(browser, tmp_path, monkeypatch):
    """The quality scene's MQAR table: one row per mixer with "mean%" over "lowest-highest" per finished group and
    the hybrid's state with its KV cache; with no group finished for every mixer, a line that says so instead."""
    from linattn.tools.explainer import measured

    real = measured.load_measured()
    for data, expect in ((real, None), ({**real, "mqar_groups": [], "mqar": []}, "No setting has finished")):
        monkeypatch.setattr(measured, "load_measured", lambda d=data: d)
        path = tmp_path / f"page{0 if expect is None else 1}.html"
        path.write_text(build_page("en"), encoding="utf-8")
        pg = _open(browser, path.as_uri())
        pg.goto(path.as_uri())
        _go_scene(pg, "quality", 1)
        text = pg.inner_text("#stage .visual")
        if expect is None:
            rows = pg.locator("#mqar-table tr")
            assert rows.count() == 1 + len(real["mqar"])
            assert "KV cache" in text and "+ KV cache" in rows.nth(1 + [r["mixer"] for r in real["mqar"]]
                                                                .index("hybrid")).inner_text()
            first = real["mqar"][0]["accuracy"][0]
            assert f"{round(100 * first[0])}%" in text and f"{round(100 * first[1])}–{round(100 * first[2])}" in text
        else:
            assert expect in text and pg.locator("#mqar-table").count() == 0
        _close(pg, path.as_uri())


def _settle(pg) -> None:
    """Let every running animation finish (the arrivals they trigger then run)."""
    pg.wait_for_function("() => document.getAnimations().every(a => a.playState !== 'running')", timeout=8000)


def test_gate_slider_drags_and_the_picture_follows(page, page_url):
    page.goto(page_url)
    _go_scene(page, "gates", 0)
    _settle(page)
    page.evaluate("document.getElementById('gate-alpha').dataset.probe = 'same'")
    box = page.locator("#gate-alpha").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] / 2, y)  # the knob sits at alpha = 0.5
    page.mouse.down()
    seen = []
    for frac in (0.6, 0.75, 0.9, 1.0):
        page.mouse.move(box["x"] + box["width"] * frac + 4, y, steps=3)
        seen.append(page.inner_text("#gate-alpha-value"))
        # While dragging nothing restarts: no bar is animating its entrance again.
        bars = "document.getAnimations().filter(a => a.effect.target.classList.contains('bar')).length"
        assert page.evaluate(bars) == 0
    page.mouse.up()
    assert len(set(seen)) >= 3, seen  # the picture followed the knob through the drag
    assert page.evaluate("document.getElementById('gate-alpha').dataset.probe") == "same"  # the same element
    a = float(page.input_value("#gate-alpha"))
    assert a == 1.0
    o, S, z = reference.linear_attention(np.ones((1, 3, 1, 1)), np.ones((1, 3, 1, 1)),
                                         np.array([2.0, 4.0, 8.0]).reshape(1, 3, 1, 1), rule="gated", scale=1.0,
                                         g=np.log(np.full((1, 3, 1), a)), eps=0.0)
    assert page.inner_text("#gate-seq").startswith(f"S: 2 → 6 → {float(S[0, 0, 0, 0]):g}")


def test_bars_in_a_box_start_at_one_x(page, page_url):
    page.goto(page_url)
    for scene, sub in (("gates", 0), ("softmax", 0), ("eps", 0), ("quality", 0), ("whyz", 0)):
        _go_scene(page, scene, sub)
        lefts = page.evaluate("""() => [...document.querySelectorAll('#stage .bars')].map(g =>
            [...new Set([...g.querySelectorAll('.bartrack')].map(t => Math.round(t.getBoundingClientRect().left)))])""")
        assert lefts and all(len(x) == 1 for x in lefts), (scene, lefts)


CELL_TEXT = "document.getElementById('tokens-cell-S1').textContent"
FLOWS = "document.getAnimations().filter(a => a.effect.target.classList.contains('flow') && a.playState === 'running')"


def test_a_cell_changes_only_when_its_contribution_lands(page, page_url):
    page.goto(page_url)
    _go_scene(page, "tokens", 1)
    _settle(page)
    _go_scene(page, "tokens", 2)  # token 2: phi(k) = [0, 1], v = 4 writes 4 into S's second row
    assert page.evaluate(f"{FLOWS}.length") >= 2
    to_s1 = "document.getAnimations().filter(a => a.effect.target.dataset.to === 'S1' && a.playState === 'running')"
    samples = page.evaluate(f"""async () => {{
        const out = [];
        for (let i = 0; i < 60; i++) {{
          out.push([{CELL_TEXT}, {to_s1}.length]);
          await new Promise(r => setTimeout(r, 50));
        }}
        return out;
    }}""")
    # While the contribution for S's second row is on its way the cell shows the old 0; it shows 4 once it landed.
    assert samples[0] == ["0", 1], samples
    # Never the new value while the contribution moves; the old value with nothing moving only in the frames between
    # the animation's end and its landing handler (two reads of one sample can straddle them), at most 150 ms.
    assert not any(text != "0" and moving for text, moving in samples), samples
    landed = [i for i, (text, _) in enumerate(samples) if text != "0"]
    assert landed and all(samples[i][0] == "4" for i in range(landed[0], len(samples))), samples
    assert sum(1 for text, moving in samples[:landed[0]] if not moving) <= 3, samples
    assert samples[-1] == ["4", 0], samples
    _settle(page)
    assert page.evaluate(CELL_TEXT) == "4" and "S = [2, 4], z = [1, 1]" in page.inner_text("#stage .visual")
    # The outer product is swept out cell by cell, then slides into S: S keeps its zeros until it lands.
    _go_scene(page, "matrix", 0)
    cells = "sel => [...document.querySelectorAll(sel + ' .cell:not(.head)')].map(c => c.textContent).join(' ')"
    assert page.evaluate(f"({cells})('#matrix-S')") == "0 0 0 0"
    assert page.evaluate(f"({cells})('#matrix-outer-1')") == "· · · ·"
    page.wait_for_function(f"() => ({cells})('#matrix-outer-1') === '2 1 0 0'", timeout=5000)
    assert page.evaluate(f"({cells})('#matrix-S')") == "0 0 0 0"  # the product is complete but not yet in S
    page.wait_for_function(f"() => ({cells})('#matrix-S') === '2 1 0 0'", timeout=5000)
    page.wait_for_function(f"() => ({cells})('#matrix-S') === '2 1 4 3'", timeout=8000)
    # The delta rule: the error travels back, and only its landing moves the cell from 2 to 3.5.
    _go_scene(page, "delta", 1)
    cell = "document.querySelector('#stage .grid-S .cell[data-i=\"0\"]').textContent"
    assert page.evaluate(cell) == "2" and page.evaluate("document.querySelectorAll('.traveller').length") == 1
    page.wait_for_function(f"() => {cell} === '3.5'", timeout=5000)
    assert page.evaluate("document.querySelectorAll('.traveller').length") == 0
    # The read: phi(q)'s entries scale S's rows; the numerator shows 17 once both products are in.
    _go_scene(page, "read", 1)
    assert page.inner_text("#read-num").endswith("= …")
    page.wait_for_function("() => document.getElementById('read-num').textContent.endsWith('= 17')", timeout=5000)
    rows = page.evaluate("document.querySelectorAll('#stage .grid-S .cell:not(.head)').length")
    cols = page.evaluate("getComputedStyle(document.querySelector('#stage .grid-S')).gridTemplateColumns"
                         ".split(' ').length")
    assert rows == 2 and cols == 2  # S is a column (a head column beside one value column), not a row


def test_reduced_motion_lands_at_once(browser, page_url):
    pg = _open(browser, page_url, reduced_motion="reduce")
    pg.goto(page_url)
    _go_scene(pg, "tokens", 3)
    assert pg.evaluate(CELL_TEXT) == "7" and pg.evaluate("document.getAnimations().length") == 0
    _go_scene(pg, "delta", 1)
    assert pg.evaluate("document.querySelector('#stage .grid-S .cell[data-i=\"0\"]').textContent") == "3.5"
    _close(pg, page_url)


EXERCISE_CASES = [  # exercise, typed answers, diagnosis
    (0, ["17/6", "11/6"], "right"), (0, ["2.8333", "1.8333"], "right"), (0, ["１７／６", "１１/６"], "right"),
    (0, ["34/12", "1.83333"], "right"), (0, ["8/3", "5/3"], "mistake-0"), (0, ["2.6667", "1.6667"], "mistake-0"),
    (0, ["17", "11"], "mistake-1"), (0, ["2.8", "1.8"], "short"), (0, ["2.9", "1.9"], "wrong"),
    (1, ["74/11"], "right"), (1, ["6.7273"], "right"), (1, ["6.7"], "short"), (1, ["6.72"], "short"),
    (1, ["6"], "mistake-0"), (1, ["14/3"], "mistake-1"), (1, ["９.２５"], "mistake-2"),
    (2, ["4", "8"], "right"), (2, ["４", "８。"], "right"), (2, ["2.5", "5"], "mistake-0"),
    (2, ["2.5", "6"], "mistake-1"),
    (2, ["4", "4"], "mistake-2"), (2, ["", "8"], "blank"),
]


def test_exercises_diagnose_mistakes_and_keep_answers(page, page_url):
    page.goto(page_url)
    for ex, typed, want in EXERCISE_CASES:
        _go_scene(page, "exercises", ex)
        for i, text in enumerate(typed):
            page.fill(f"#ex-answer-{i}", text)
        page.click("#ex-check")
        assert page.get_attribute("#ex-verdict", "data-diagnosis") == want, (ex, typed)
    said = {ex: None for ex in range(3)}
    _go_scene(page, "exercises", 0)
    page.fill("#ex-answer-0", "8/3")
    page.fill("#ex-answer-1", "5/3")
    page.click("#ex-check")
    said[0] = page.inner_text("#ex-verdict")
    assert "Token 3" in said[0] and "forgotten" in said[0]
    _go_scene(page, "exercises", 2)
    page.fill("#ex-answer-0", "2.5")
    page.fill("#ex-answer-1", "5")
    page.click("#ex-check")
    assert "unit-key result applied to k = 2" in page.inner_text("#ex-verdict")
    # Leaving and coming back, or switching language, keeps what was typed and the verdict.
    _go_scene(page, "intro", 0)
    _go_scene(page, "exercises", 0)
    assert page.input_value("#ex-answer-0") == "8/3" and page.input_value("#ex-answer-1") == "5/3"
    assert page.get_attribute("#ex-verdict", "data-diagnosis") == "mistake-0"
    page.click("#lang-zh")
    assert page.input_value("#ex-answer-0") == "8/3" and "词元 3" in page.inner_text("#ex-verdict")
    page.click("#lang-en")


# The checks at every size: nothing wider than the viewport, picture text at least 14 px, the picture in view.
FIT = """() => {
  const W = document.documentElement.clientWidth, H = document.documentElement.clientHeight, wide = [], small = [];
  for (const el of document.querySelectorAll('body *')) {
    if (el.closest('.scroll, pre, .formula')) continue;
    const r = el.getBoundingClientRect();
    if (r.width && (r.right > W + 1 || r.left < -1)) wide.push(el.tagName + ' ' + el.id + ' ' + Math.round(r.right));
  }
  for (const t of document.querySelectorAll('#stage svg text')) {  // charts and diagrams alike
    const px = parseFloat(getComputedStyle(t).fontSize) * t.ownerSVGElement.getBoundingClientRect().width
      / t.ownerSVGElement.viewBox.baseVal.width;
    if (px < 13.5) small.push(t.textContent + ' ' + px.toFixed(1));
  }
  // A table that has to scroll sideways hides columns: allowed on a phone only (where tables are lists anyway).
  const hidden = [...document.querySelectorAll('#stage .scroll')].filter(el => el.scrollWidth > el.clientWidth + 1)
    .map(el => (el.firstChild && el.firstChild.id) || 'scroll');
  const v = document.querySelector('#stage .visual').getBoundingClientRect();
  const n = document.getElementById('narration').getBoundingClientRect();
  return { wide: wide.slice(0, 3), small: small.slice(0, 3), hidden, visualTop: v.top, visualLeft: v.left,
           narrTop: n.top, narrLeft: n.left, H };
}"""
SIZES = [{"width": 390, "height": 844}, {"width": 640, "height": 400}, DESKTOP, {"width": 1920, "height": 1080}]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s['width']}x{s['height']}")
def test_every_size_fits_and_shows_the_picture(browser, page_url, size):
    pg = _open(browser, page_url, viewport=size, reduced_motion="reduce")
    pg.goto(page_url)
    for scene in EXPECTED_SCENES:
        for sub in range(3):
            start = pg.evaluate(f"window.linattnExplainer.sceneStarts[{EXPECTED_SCENES.index(scene)}]")
            if sub and (scene == EXPECTED_SCENES[-1] or
                        pg.evaluate(f"window.linattnExplainer.sceneStarts[{EXPECTED_SCENES.index(scene) + 1}]")
                        <= start + sub):
                break
            pg.evaluate(f"window.linattnExplainer.go({start + sub})")
            r = pg.evaluate(FIT)
            assert not r["wide"] and not r["small"], (size, scene, sub, r)
            if size["width"] >= 1280:
                assert not r["hidden"], (size, scene, sub, r["hidden"])
            assert r["visualTop"] < r["H"] * 0.6, (size, scene, r)  # the picture starts in the upper part
            if size["width"] < 600:
                assert r["visualTop"] < r["narrTop"], (size, scene)  # phone: picture first, narration below
            else:
                assert r["visualLeft"] > r["narrLeft"], (size, scene)  # side by side
    _close(pg, page_url)


def test_layout_follows_rotation(browser, page_url):
    pg = _open(browser, page_url, viewport={"width": 390, "height": 844})
    pg.goto(page_url)
    _go_scene(pg, "norm", 0)
    r = pg.evaluate(FIT)
    assert r["visualTop"] < r["narrTop"] and not r["wide"]
    chart_w = "() => document.querySelector('#stage svg.chart').viewBox.baseVal.width"
    width = pg.evaluate(chart_w)
    pg.set_viewport_size({"width": 844, "height": 390})
    pg.wait_for_function(f"() => ({chart_w})() !== {width}", timeout=3000)
    r = pg.evaluate(FIT)
    assert r["visualLeft"] > r["narrLeft"] and not r["wide"] and not r["small"], r
    pg.set_viewport_size({"width": 390, "height": 844})
    pg.wait_for_function(f"() => ({chart_w})() === {width}", timeout=3000)
    assert pg.evaluate(FIT)["visualTop"] < pg.evaluate(FIT)["narrTop"]
    _close(pg, page_url)


def test_tables_become_lists_on_a_phone(browser, page_url):
    pg = _open(browser, page_url, viewport=PHONE)
    pg.goto(page_url)
    _go_scene(pg, "chunks", 1)
    table = pg.locator("#chunk-table")
    box = table.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    assert pg.evaluate("getComputedStyle(document.querySelector('#chunk-table td')).display") == "block"
    label = pg.evaluate("getComputedStyle(document.querySelector('#chunk-table td:nth-child(8)'), '::before').content")
    assert label == '"y"'
    _close(pg, page_url)


def test_lab_scene_shows_what_lab_py_prints(page, page_url):
    import contextlib
    import io

    from linattn.tools.explainer import lab_standalone

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert lab_standalone.main([]) == 0
    page.goto(page_url)
    _go_scene(page, "lab", 0)
    shown = page.inner_text("#lab-output")
    lines = out.getvalue().splitlines()
    assert len(lines) == len(lab_standalone.CHECKS) + 2
    for line in lines:
        assert line in shown


def test_notation_is_typeset(page, page_url):
    page.goto(page_url)
    _go_scene(page, "chunks", 1)
    assert "_" not in page.inner_text("#stage")
    assert page.evaluate("[...document.querySelectorAll('#stage sub')].map(s => s.textContent)").count("prev") >= 2
    # On the Chinese page Greek symbols still come from a Latin font first (never a CJK glyph for φ).
    page.click("#lang-zh")
    for sel in ("body", "#stage .formula", "#stage svg text"):
        family = page.evaluate(f"getComputedStyle(document.querySelector({sel!r})).fontFamily")
        assert family.split(",")[0].strip('"') in ("Segoe UI", "Cambria Math"), (sel, family)


def _set(pg, sel: str, value) -> None:
    pg.fill(sel, str(value))
    pg.dispatch_event(sel, "input")


def test_three_orders_picture_agrees_with_the_reference(page, page_url):
    from linattn.tools.explainer.scenes import CHUNK_KEYS, CHUNK_VALUES, KERNEL_QUERY

    T = len(CHUNK_KEYS)
    q = np.tile(KERNEL_QUERY, (T, 1))[None, :, None]
    k, v = np.array(CHUNK_KEYS)[None, :, None], np.array(CHUNK_VALUES).reshape(1, T, 1, 1)
    page.goto(page_url)
    _go_scene(page, "orders", 0)
    for t in (5, 3, 1):
        _set(page, "#orders-t", t)
        lit = page.eval_on_selector_all("#orders-A .cell.lit", "cs => cs.map(c => [c.dataset.t, c.dataset.i])")
        assert lit == [[str(t), str(i)] for i in range(1, t + 1)]  # row t, entries i <= t
        o, S, _ = reference.linear_attention(q[:, :t], k[:, :t], v[:, :t], scale=1.0, eps=0.0)
        assert page.inner_text("#orders-sum") == "Σ = " + "[" + ", ".join(f"{x:g}" for x in S[0, 0, :, 0]) + "]"
        y = f"{round(float(o[0, -1, 0, 0]), 4):g}"
        assert page.inner_text("#orders-y").endswith(" = " + y)
        assert page.inner_text("#orders-dense-y").endswith("= " + y)
    _go_scene(page, "orders", 1)
    _set(page, "#orders-t", 5)
    _set(page, "#orders-alpha", 0.5)
    o, S, _ = reference.linear_attention(q, k, v, rule="gated", scale=1.0, eps=0.0, g=np.log(np.full((1, T, 1), 0.5)))
    assert page.inner_text("#orders-y").endswith(f" = {round(float(o[0, -1, 0, 0]), 4):g}")
    shades = page.eval_on_selector_all("#orders-A .cell.lit",
                                       "cs => cs.map(c => Number(c.style.getPropertyValue('--shade')))")
    assert shades == sorted(shades) and shades[0] < shades[-1]  # older writes paler
    _go_scene(page, "orders", 2)
    _set(page, "#orders-chunk", 2)
    blocks = page.evaluate("document.querySelectorAll('#orders-A .cell.block').length")
    assert blocks == 3 + 3 + 1  # the lower triangles of the 2x2, 2x2 and 1x1 diagonal blocks
    assert page.evaluate("document.querySelectorAll('#orders-strip .chip.state').length") == 2


def test_capacity_lab_strips_and_curve(browser, page_url):
    pg = _open(browser, page_url, viewport=PHONE)
    pg.goto(page_url)
    _go_scene(pg, "capacity", 0)
    for n, d in ((1, 16), (64, 4), (16, 32)):
        _set(pg, "#cap-d", d)
        _set(pg, "#cap-n", n)
        for mech in ("accumulate", "gated", "delta", "softmax"):
            assert pg.evaluate(f"document.querySelectorAll('#cap-strip-{mech} .heatcell').length") == n
            hits = pg.evaluate(f"document.querySelectorAll('#cap-strip-{mech} .heatcell.hit').length")
            assert pg.inner_text(f"#cap-share-{mech}") == f"{hits} / {n}"
            if n == 1 or (mech == "softmax" and n <= d):
                assert hits == n, (mech, n, d)  # one pair, or a cache of well-separated keys, always comes back
            if (n, d) == (64, 4) and mech != "softmax":
                assert hits < 32, (mech, hits)  # 64 pairs in a 4 x 4 state: most are lost
        assert not pg.evaluate(FIT)["wide"], (n, d)
    _go_scene(pg, "capacity", 1)
    r = pg.evaluate(FIT)
    assert not r["wide"] and not r["small"]
    assert pg.evaluate("document.querySelectorAll('#cap-curve [data-legend]').length") == 4
    _close(pg, page_url)


def test_a_cell_no_token_writes_does_not_flash(page, page_url):
    """phi(k) = [1, 0] writes nothing into S's and z's second entries: those cells neither change nor flash as if a
    contribution had landed (a learner would read the flash as a write); the first entries flash when theirs lands."""
    page.goto(page_url)
    _go_scene(page, "tokens", 0)
    _settle(page)
    _go_scene(page, "tokens", 1)  # token 1: phi(k) = [1, 0], v = 2
    flashing = ("key => document.getAnimations().filter(a => a.effect.target === "
                "document.getElementById('tokens-cell-' + key).previousSibling).length")
    assert page.evaluate("document.getElementById('tokens-cell-S1').previousSibling.tagName") == "rect"
    samples = page.evaluate(f"""async () => {{
        const out = [];
        for (let i = 0; i < 40; i++) {{
          out.push([({flashing})('S1'), ({flashing})('z1'), ({flashing})('S0')]);
          await new Promise(r => setTimeout(r, 50));
        }}
        return out;
    }}""")
    assert all(s1 == 0 and z1 == 0 for s1, z1, _ in samples), samples
    assert any(s0 for _, _, s0 in samples), samples  # the written cell does flash when its contribution lands
