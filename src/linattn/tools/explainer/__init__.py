"""``linattn explain``: one self-contained HTML page that steps a learner through linear attention.

`build_page` fills ``static/template.html`` with the page's CSS, its JavaScript (the engine, the scenes and
the slide player) and a JSON block holding every scripted scene's numbers (`scenes.build_data`, float64
from `linattn.reference` and `linattn.tools.memory`) plus the standalone NumPy lab (``lab.py``) as a
download. Nothing is fetched at view time: no CDN, no web font, no network request.
"""

from __future__ import annotations

import base64
import json
from importlib import resources

LANGS = ("en", "zh")
JS_FILES = ("engine.js", "explainer.js", "scenes.js", "player.js")  # one script, in this order


def _static(name: str) -> str:
    return resources.files("linattn.tools.explainer").joinpath("static", name).read_text(encoding="utf-8")


def lab_source() -> str:
    """The downloadable ``lab.py``: NumPy only, the same checks by name as ``linattn lab``."""
    return resources.files("linattn.tools.explainer").joinpath("lab_standalone.py").read_text(encoding="utf-8")


def build_page(lang: str = "en") -> str:
    """The whole page as one HTML string; ``lang`` ("en" or "zh") is the language it opens in (``?lang=`` wins)."""
    if lang not in LANGS:
        raise ValueError(f"lang: unknown language {lang!r}; expected one of {', '.join(LANGS)}")
    from linattn.tools.explainer.scenes import build_data

    data = build_data()
    data["lang"] = lang
    data["lab_b64"] = base64.b64encode(lab_source().encode("utf-8")).decode("ascii")
    # "</" inside a <script> element would end it early; JSON allows "<\/".
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    js = "\n".join(_static(name) for name in JS_FILES)
    js = "(function () {\n" + js + "\n})();"  # one scope: nothing but window.linattnExplainer leaks
    page = _static("template.html")
    for marker, text in (("/*CSS*/", _static("explainer.css")), ("/*DATA*/", payload), ("/*JS*/", js)):
        if page.count(marker) != 1:
            raise RuntimeError(f"template.html must hold {marker} exactly once")
        page = page.replace(marker, text)
    return page.replace('<html lang="en">', '<html lang="zh-CN">') if lang == "zh" else page
