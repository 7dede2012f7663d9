"""Screenshots of the explainer: every step in both languages at desktop and phone size, and the README images.

Uses the same browser as tests/test_explainer_browser.py: Debian's chromium through the playwright package (never a
downloaded build). Run from the repository root:

    python scripts/explainer_screenshots.py                   # every step into build/explainer-shots/
    python scripts/explainer_screenshots.py --out DIR          # elsewhere
    python scripts/explainer_screenshots.py --readme           # also rewrite docs/img/explainer-*.png

Files are named ``{lang}-{width}x{height}-step{NN}-{scene}.png`` (1280x800, 390x844 and 640x400). Motion is switched
off (reduced motion), so each picture shows a step's final state.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from linattn.tools.explainer import build_page  # noqa: E402

SIZES = {"desktop": (1280, 800), "phone": (390, 844), "landscape": (640, 400)}
# The README's pictures: (file name, language, size, scene, step within the scene).
README = [
    ("explainer-hero.png", "en", "desktop", "tokens", 3),
    ("explainer-phone.png", "en", "phone", "gates", 0),
    ("explainer-tokens-en.png", "en", "desktop", "read", 2),
    ("explainer-chunks-en.png", "en", "desktop", "chunks", 1),
    ("explainer-gates-en.png", "en", "desktop", "scan", 1),
    ("explainer-delta-zh.png", "zh", "desktop", "norm", 0),
    ("explainer-orders-en.png", "en", "desktop", "orders", 2),
    ("explainer-capacity-phone.png", "en", "phone", "capacity", 0),
]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="build/explainer-shots", help="folder for the per-step screenshots")
    ap.add_argument("--readme", action="store_true", help="also write the README images into docs/img")
    ap.add_argument("--only-readme", action="store_true", help="write only the README images")
    args = ap.parse_args(argv)
    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        path = Path(tmp) / "page.html"
        path.write_text(build_page("en"), encoding="utf-8")
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        pages = {}
        for size, (w, h) in SIZES.items():
            pages[size] = browser.new_page(viewport={"width": w, "height": h}, reduced_motion="reduce")
        if not args.only_readme:
            out.mkdir(parents=True, exist_ok=True)
            for lang in ("en", "zh"):
                for size, (w, h) in SIZES.items():
                    pg = pages[size]
                    pg.goto(f"{path.as_uri()}?lang={lang}#step=1")
                    for n in range(1, pg.evaluate("window.linattnExplainer.steps") + 1):
                        pg.evaluate(f"window.linattnExplainer.go({n})")
                        scene = pg.evaluate("document.documentElement.dataset.scene")
                        pg.screenshot(path=str(out / f"{lang}-{w}x{h}-step{n:02d}-{scene}.png"))
            print(f"wrote every step to {out}/")
        if args.readme or args.only_readme:
            for name, lang, size, scene, sub in README:
                pg = pages[size]
                pg.goto(f"{path.as_uri()}?lang={lang}#step=1")
                x = "window.linattnExplainer"
                start = pg.evaluate(f"{x}.sceneStarts[{x}.scenes.indexOf({scene!r})]")
                pg.evaluate(f"window.linattnExplainer.go({start + sub})")
                pg.screenshot(path=f"docs/img/{name}")
                print(f"wrote docs/img/{name}")
        browser.close()


if __name__ == "__main__":
    main()
