"""The ``linattn`` command. Thin: each subcommand lives in ``linattn.tools.<name>`` and is imported only when run."""

from __future__ import annotations

import difflib
import importlib

try:
    import click
except ImportError:  # the core installs without the tools' dependencies
    raise SystemExit("The linattn command needs the tools extra: pip install 'linattn[tools]'") from None

# name -> (module, attribute of the click command, one-line help shown by `linattn --help`)
COMMANDS = {
    "bench": ("linattn.tools.bench.cli", "command", "Decode step: explicit KV history vs fixed recurrent state."),
    "explain": ("linattn.tools.explainer.cli", "command", "Interactive offline page: linear attention step by step."),
    "lab": ("linattn.tools.lab.cli", "command", "PASS/FAIL checks that prove the mechanism on random inputs."),
    "memory": ("linattn.tools.memory.cli", "command", "State vs KV-cache bytes, crossover lengths, hybrid models."),
    "stability": ("linattn.tools.stability.cli", "command", "Low-precision error against float64 over lengths."),
    "recall": ("linattn.tools.recall", "command", "Associative-recall diagnostic (no training)."),
    "sp-bench": ("linattn.tools.sp.bench", "command", "Sequence parallelism: N gloo ranks vs one process, bytes sent."),
    "mqar": ("linattn.tools.mqar.cli", "command",
             "MQAR trained per mixer with decode latency; --sweep: best over lrs."),
    "perf": ("linattn.tools.perf.cli", "command",
             "Kernels against peers, as fractions of the in-run matmul rate and copy bandwidth, 1 and 2 threads."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and name not in COMMANDS and not name.startswith("-"):
            close = difflib.get_close_matches(name, list(COMMANDS), n=1)
            if close:  # a typo: name the command that was probably meant
                ctx.fail(f"No such command {name!r}. Did you mean {close[0]!r}?")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx, formatter):
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup)
@click.version_option(package_name="linattn")
def main() -> None:
    """linattn: causal linear attention with a recurrent state."""


if __name__ == "__main__":
    main()
