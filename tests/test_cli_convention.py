"""One command-line convention across the tools: the shared options spelt the same everywhere, every default shown
in ``--help``, and ``linattn --help`` listing every tool."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from linattn.tools.cli import COMMANDS, LazyGroup, main

# The shared options: where a tool has one, it is spelt exactly so.
SPELLING = {"output": ["-o", "--output"], "plot": ["--plot"], "plot_path": ["--plot"], "overwrite": ["--overwrite"],
            "quick": ["--quick"], "threads": ["--threads"], "no_progress": ["--no-progress"]}


def _has_default(param: click.Option, ctx: click.Context) -> bool:
    default = param.get_default(ctx, call=False)
    return default not in (None, ()) and type(default).__name__ != "Sentinel"  # click 8.3 marks "no default" so


def _commands() -> list[tuple[str, click.Command]]:
    group, ctx = LazyGroup(), click.Context(main)
    out = []
    for name in sorted(COMMANDS):
        cmd = group.get_command(ctx, name)
        out.append((name, cmd))
        if isinstance(cmd, click.Group):
            out += [(f"{name} {sub}", cmd.commands[sub]) for sub in cmd.commands]
    return out


@pytest.mark.parametrize(("name", "cmd"), _commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_shared_options_are_spelt_alike_and_every_default_is_shown(name, cmd):
    ctx = click.Context(cmd, info_name=name, **cmd.context_settings)
    for param in cmd.params:
        if not isinstance(param, click.Option):
            continue
        if param.name in SPELLING:
            assert param.opts == SPELLING[param.name], (name, param.opts)
        if param.is_flag or param.name == "help":
            continue
        record = param.get_help_record(ctx)
        if _has_default(param, ctx) or isinstance(param.show_default, str):
            assert "default:" in record[1], (name, param.name, record)


@pytest.mark.parametrize(("name", "cmd"), _commands(), ids=lambda x: x if isinstance(x, str) else "")
def test_help_shows_the_defaults(name, cmd):
    res = CliRunner().invoke(main, [*name.split(), "--help"], terminal_width=200)
    assert res.exit_code == 0, res.output
    ctx = click.Context(cmd, info_name=name, **cmd.context_settings)
    shown = [p for p in cmd.params if isinstance(p, click.Option) and not p.is_flag and _has_default(p, ctx)]
    assert res.output.count("[default:") >= len(shown), res.output


def test_every_tool_is_listed():
    res = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    for name, (module, attr, text) in COMMANDS.items():
        assert name in res.output and text in res.output
        assert module.startswith("linattn.tools.") and attr == "command"


def test_quick_replaces_only_the_defaults_a_user_left(monkeypatch):
    from linattn.tools import recall

    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr(recall, "run_recall", fake)
    CliRunner().invoke(main, ["recall", "--quick", "--trials", "3", "--no-progress"])
    assert (seen["d"], seen["dv"], seen["trials"]) == (16, 16, 3)  # --trials given: it wins
    seen.clear()
    CliRunner().invoke(main, ["recall", "--no-progress"])
    assert (seen["d"], seen["trials"]) == (64, 16)  # without --quick nothing changes


def test_a_mistyped_tool_name_suggests_the_tool():
    res = CliRunner().invoke(main, ["bnech"])
    assert res.exit_code == 2 and "No such command 'bnech'. Did you mean 'bench'?" in res.output
    res = CliRunner().invoke(main, ["stabilty", "--help"])
    assert res.exit_code == 2 and "Did you mean 'stability'?" in res.output
    res = CliRunner().invoke(main, ["zzzz"])
    assert res.exit_code == 2 and "No such command 'zzzz'" in res.output and "Did you mean" not in res.output


def test_one_thread_default_rule_for_every_tool(monkeypatch):
    from linattn.tools import recall
    from linattn.tools.harness import cli as hcli

    assert hcli.default_threads("cpu", 2)[0] == 1 and hcli.default_threads("cpu", 4)[0] == 1
    assert hcli.default_threads("cpu", 16)[0] is None and hcli.default_threads("cuda", 2)[0] is None
    for name, cmd in _commands():  # every single-count --threads says the rule in its help
        param = next((p for p in cmd.params if p.name == "threads"), None)
        if param is not None and name != "perf":
            assert param.default is None and hcli.THREADS_RULE in param.help, name
    seen = {}

    def fake(**kwargs):
        seen["threads"] = torch.get_num_threads()
        raise SystemExit(0)

    import torch

    monkeypatch.setattr(recall, "run_recall", fake)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(hcli.os, "cpu_count", lambda: 2)
        CliRunner().invoke(main, ["recall", "--no-progress"])
        assert seen["threads"] == 1  # a small machine: one thread
        monkeypatch.setattr(hcli.os, "cpu_count", lambda: 64)
        CliRunner().invoke(main, ["recall", "--no-progress"])
        assert seen["threads"] == 2  # a large one: torch's own choice
        CliRunner().invoke(main, ["recall", "--no-progress", "--threads", "3"])
        assert seen["threads"] == 3
        assert torch.get_num_threads() == 2  # restored after each command
    finally:
        torch.set_num_threads(before)


def test_messages_format_no_raw_lists():
    """Messages (core and tools) join names with ", " instead of printing a Python list (``['a', 'b']``) or tuple."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "src" / "linattn"
    raw = re.compile(r"\{(?:list|sorted|tuple)\((?!.*\.shape)[^{}]*\)\}|\{\[[^{}]*\]\}")
    files = list(root.rglob("*.py"))  # the core and the tools
    hits = [f"{p.name}:{i}" for p in files if p.exists()
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if raw.search(line)]
    assert hits == []
