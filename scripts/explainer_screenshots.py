"""Screenshots of the explainer for the README (docs/img/explainer-*.png), and the page's weight and open time.

Uses the same browser as tests/test_explainer_browser.py: Debian's chromium through the playwright package
(never a downloaded build). Run from the repository root:

    python scripts/explainer_screenshots.py            # writes docs/img/explainer-*.png, prints weight and timing
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from linattn.explainer import build_page  # noqa: E402

SHOTS = [("tokens", 4, "en"), ("chunks", 1, "en"), ("gates", 2, "en"), ("delta", 1, "zh")]
OUT = Path("docs/img")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        path = Path(tmp) / "page.html"
        page_text = build_page("en")
        path.write_text(page_text, encoding="utf-8")
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        pg = browser.new_page(viewport={"width": 1000, "height": 620})
        opened = []
        for _ in range(7):  # the page draws its first step while parsing, so this ends after the first step is drawn
            pg.goto(path.as_uri() + "?lang=en#step=0")
            opened.append(pg.evaluate("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"))
        print(f"page: {len(page_text.encode('utf-8')):,} bytes; DOMContentLoaded (first step drawn) median "
              f"{statistics.median(opened):.0f} ms of {len(opened)} loads")
        for scene, sub, lang in SHOTS:
            pg.goto(f"{path.as_uri()}?lang={lang}#step=0")
            first = pg.evaluate(f"""(() => {{ const x = window.linattnExplainer;
                for (let i = 0; i < x.steps; i++) {{ x.go(i); if (document.documentElement.dataset.scene === {scene!r})
                return i; }} }})()""")
            pg.evaluate(f"window.linattnExplainer.go({first + sub})")
            pg.wait_for_timeout(800)  # let the CSS transitions finish
            target = OUT / f"explainer-{scene}-{lang}.png"
            pg.screenshot(path=str(target))
            print(f"wrote {target}")
        browser.close()


if __name__ == "__main__":
    main()
