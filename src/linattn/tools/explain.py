"""``linattn explain``: write the interactive explainer page (one self-contained HTML file), optionally lab.py."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from linattn.explainer import LANGS, build_page, lab_source
from linattn.tools.harness.results import atomic_write


def _write_text(path: Path, text: str, overwrite: bool) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite)


@click.command(name="explain")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=Path("linattn-explainer.html"),
              show_default=True, help="The HTML file to write.")
@click.option("--lang", type=click.Choice(LANGS), default="en", show_default=True,
              help="Language the page opens in (switchable on the page and by ?lang=).")
@click.option("--lab", "lab_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the standalone NumPy lab here (the page offers the same file as a download).")
@click.option("--overwrite", is_flag=True, help="Replace existing files.")
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default browser.")
def command(output: Path, lang: str, lab_path: Path | None, overwrite: bool, open_browser: bool) -> None:
    """Write an interactive page that steps through linear attention with real numbers, offline.

    Every scripted number is computed now in float64 by linattn.reference and linattn.memory; the page needs no
    network. Navigate with the arrow keys, the timeline, or #step=N in the address.
    """
    try:
        page = build_page(lang)
        written = _write_text(output, page, overwrite)
        click.echo(f"wrote {written} ({len(page.encode('utf-8')):,} bytes)")
        if lab_path is not None:
            click.echo(f"wrote {_write_text(lab_path, lab_source(), overwrite)} (run: python3 {lab_path.name})")
    except FileExistsError as exc:
        raise click.ClickException(str(exc)) from None
    if open_browser:
        webbrowser.open(output.resolve().as_uri())
