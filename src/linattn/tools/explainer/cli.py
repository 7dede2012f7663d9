"""``linattn explain``: write the interactive explainer page (one self-contained HTML file), optionally lab.py."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import click

from linattn.tools.explainer import LANGS, build_page, lab_source
from linattn.tools.harness import cli as hcli
from linattn.tools.harness.results import atomic_write


def _text_writer(text: str):
    def write(path: Path, *, overwrite: bool) -> Path:
        return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=overwrite)

    return write


@click.command(name="explain", context_settings=hcli.CONTEXT)
@hcli.output_option(help="The HTML file to write (the one file this command exists to write).",
                    default=Path("linattn-explainer.html"))
@click.option("--lang", type=click.Choice(LANGS), default="en",
              help="Language the page opens in (switchable on the page and by ?lang=).")
@click.option("--lab", "lab_path", type=hcli.FILE, default=None,
              help="Also write the standalone NumPy lab here (the page offers the same file as a download).")
@hcli.overwrite_option()
@click.option("--open", "open_browser", is_flag=True, help="Open the page in the default browser.")
def command(output: Path, lang: str, lab_path: Path | None, overwrite: bool, open_browser: bool) -> None:
    """Write an interactive page that steps through linear attention with real numbers, offline.

    Every scripted number is computed now in float64 by linattn.reference and linattn.tools.memory; the page needs no
    network. Navigate with the arrow keys, the timeline, or #step=N in the address.
    """
    hcli.check_outputs(overwrite, {"--output": output, "--lab": lab_path})
    page = build_page(lang)
    hcli.write("--output", _text_writer(page), output, overwrite=overwrite)
    click.echo(f"  ({len(page.encode('utf-8')):,} bytes)")
    if lab_path is not None:
        hcli.write("--lab", _text_writer(lab_source()), lab_path, overwrite=overwrite)
        click.echo(f"  (run: python3 {lab_path.name})")
    if open_browser:
        webbrowser.open(Path(output).resolve().as_uri())
