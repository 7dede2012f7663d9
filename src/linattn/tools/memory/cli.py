"""``linattn memory``: state vs KV-cache bytes, crossover lengths and hybrid models, as a table, JSON and a plot.

The arithmetic lives in `linattn.tools.memory`; this module only reads options, prints and writes files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click

from linattn import __version__
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness.plotting import pyplot, save_figure
from linattn.tools.harness.results import atomic_write_json
from linattn.tools.memory import (
    DTYPE_BYTES,
    LayerPlan,
    curve,
    format_bytes,
    list_presets,
    load_config,
    load_preset,
    memory_report,
    plan_from_shapes,
)

DEFAULT_SEQ_LENS = (1024, 4096, 16384, 65536, 262144, 1048576)
RESULT_CAVEATS = [
    "bytes are exact integers; human units are binary (KiB = 1024 B)",
    "all_full: every layer keeps the KV cache of the model's full-attention layers; all_linear: every layer keeps"
    " the linear state (+ short-conv buffers when counted); hybrid: the layer plan as given",
    "short-conv buffers count kernel-1 columns per channel (the history a causal conv needs)",
    "MLA layers cache one latent of kv_lora_rank + qk_rope_head_dim per token unless --mla-cache expanded",
    "storage only: a storage crossover is not a speed crossover",
]
POSITIVE = click.IntRange(min=1)
DTYPE = click.Choice(sorted(DTYPE_BYTES), case_sensitive=False)


def _bytes(n: int) -> str:
    return f"{n:,} B ({format_bytes(n)})"


def _describe(report: dict[str, Any]) -> list[str]:
    m, s, pl, x = report["model"], report["settings"], report["per_layer"], report["crossovers"]
    lin, att = m["linear"], m["attention"]
    src = m["source"]
    lines = [f"linattn memory: {m['name']}"]
    if isinstance(src, dict) and src.get("model"):
        lines.append(f"  source: {src['model']} {src.get('file', '')}".rstrip())
    lines.append(
        f"  layers: {m['layers']} = {m['linear_layers']} linear + {m['full_attention_layers']} full attention,"
        f" pattern {m['pattern']}; batch {s['batch']}"
    )
    norm = "+ normalizer" if lin["normalizer"] else "no normalizer"
    lines.append(
        f"  linear layer: {lin['heads']} heads x {lin['key_dim']} x {lin['value_dim']} state ({norm}),"
        f" {s['state_dtype']}: {_bytes(pl['linear_state_bytes'])}"
    )
    if lin["conv_kernel"]:
        counted = _bytes(pl["conv_state_bytes"]) if s["include_conv_state"] else "not counted (--no-conv-state)"
        lines.append(
            f"  short conv:   {lin['conv_channels']} channels x (kernel {lin['conv_kernel']} - 1),"
            f" {s['conv_dtype']}: {counted}"
        )
    if att["kind"] == "gqa":
        shape = f"{att['kv_heads']} KV heads x {att['head_dim']} (K and V)"
    elif att["mla_cache"] == "latent":
        shape = f"MLA latent {att['latent_dim']} + rope {att['rope_dim']}"
    else:
        shape = f"MLA expanded {att['kv_heads']} heads x (K {att['head_dim'] + att['rope_dim']} + V {att['value_dim']})"
    lines.append(f"  full layer:   {shape}, {s['kv_dtype']}: {_bytes(pl['kv_bytes_per_token'])} per token")
    lines.append("  crossover (smallest T whose KV cache >= the fixed state):")
    if report["per_head"]:
        ph = report["per_head"]
        lines.append(
            f"    per head:  T = {x['per_head']:,}"
            f"  ({ph['state_bytes']:,} B state vs {ph['kv_bytes_per_token']:,} B/token)"
        )
    lines.append(
        f"    per layer: T = {x['per_layer']:,}"
        f"  ({pl['linear_fixed_bytes']:,} B fixed vs {pl['kv_bytes_per_token']:,} B/token)"
    )
    if x["hybrid_vs_all_full"] is not None:
        lines.append(f"    hybrid vs full attention in every layer: T = {x['hybrid_vs_all_full']:,}")
    if x["hybrid_kv_vs_fixed"] is not None:
        lines.append(f"    hybrid's own KV cache vs its fixed state: T = {x['hybrid_kv_vs_fixed']:,}")
    return lines


def _table(report: dict[str, Any]) -> list[str]:
    head = ("T", "all full attention (KV)", "all linear (state)", "hybrid", "hybrid/full")
    rows = [
        (
            f"{r['seq_len']:,}",
            _bytes(r["all_full_kv_bytes"]),
            _bytes(r["all_linear_state_bytes"]),
            _bytes(r["hybrid_bytes"]),
            f"{r['hybrid_bytes'] / r['all_full_kv_bytes']:.3f}" if r["all_full_kv_bytes"] else "-",
        )
        for r in report["rows"]
    ]
    widths = [max(len(c) for c in col) for col in zip(head, *rows, strict=True)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return [fmt(head), fmt(tuple("-" * w for w in widths)), *(fmt(r) for r in rows)]


def _plot(path: Path, report: dict[str, Any], *, overwrite: bool) -> None:
    import numpy as np

    plt = pyplot()
    x = report["crossovers"]
    marks = [v for v in (x["per_layer"], x["hybrid_kv_vs_fixed"]) if v]
    t_max = max(max(r["seq_len"] for r in report["rows"]), 8 * max(marks))
    grid = sorted({int(t) for t in np.geomspace(1, t_max, 400).round()})
    c = curve(report, grid)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.loglog(grid, c["all_full_kv_bytes"], label="KV cache, full attention in every layer", color="C3")
    ax.loglog(grid, c["all_linear_state_bytes"], label="state, linear attention in every layer", color="C0")
    m = report["model"]
    hybrid = f"hybrid {m['linear_layers']} linear + {m['full_attention_layers']} full"
    ax.loglog(grid, c["hybrid_bytes"], label=hybrid, color="C2", lw=2.2)
    t = x["per_layer"]
    y = report["rows"][0]["all_linear_state_bytes"]
    ax.axvline(t, color="0.4", ls=":", lw=1)
    ax.plot([t], [y], "ko", ms=6)
    box = {"fc": "white", "ec": "none", "alpha": 0.85}
    ax.annotate(f"crossover T = {t:,}", (t, y), xytext=(-10, 16), textcoords="offset points", ha="right", bbox=box)
    if x["hybrid_kv_vs_fixed"]:
        t2 = x["hybrid_kv_vs_fixed"]
        y2 = curve(report, [t2])["hybrid_bytes"][0]
        ax.plot([t2], [y2], "s", color="C2", ms=6)
        ax.annotate(
            f"hybrid's KV cache = its state, T = {t2:,}",
            (t2, y2),
            xytext=(10, -26),
            textcoords="offset points",
            bbox=box,
        )
    s = report["settings"]
    ax.set_xlabel("tokens in history T")
    ax.set_ylabel(f"bytes (batch {s['batch']})")
    ax.set_title(f"{m['name']}: state {s['state_dtype']}, KV {s['kv_dtype']}", fontsize=11)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path, overwrite=overwrite, dpi=120, format="png")


def presets_side_by_side(seq_lens=(4096, 131072, 1048576), **settings: Any) -> list[str]:
    """What ``linattn memory`` prints without a model: every shipped preset in one table, hybrid against full
    attention in every layer at a few lengths, then how to ask for one model in full."""
    reports = [memory_report(load_preset(name), seq_lens, **settings) for name in list_presets()]
    head = ["", *(r["model"]["name"] for r in reports)]
    body = [
        ["layers (L linear, F full)", *(f"{r['model']['layers']} {r['model']['pattern']}" for r in reports)],
        ["fixed state per linear layer", *(_bytes(r["per_layer"]["linear_fixed_bytes"]) for r in reports)],
        ["KV cache per full layer, per token", *(_bytes(r["per_layer"]["kv_bytes_per_token"]) for r in reports)],
        ["crossover per layer (tokens)", *(f"T = {r['crossovers']['per_layer']:,}" for r in reports)],
    ]
    for k, T in enumerate(seq_lens):
        body.append([f"hybrid / all full at T = {T:,}", *(
            f"{format_bytes(r['rows'][k]['hybrid_bytes'])} / {format_bytes(r['rows'][k]['all_full_kv_bytes'])}"
            for r in reports)])
    widths = [max(len(row[j]) for row in [head, *body]) for j in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths, strict=True)))  # noqa: E501, E731
    s = reports[0]["settings"]
    return [
        f"linattn memory: the shipped presets side by side (batch {s['batch']}, state {s['state_dtype']}, KV in "
        "each model's dtype)",
        "",
        fmt(head),
        fmt(["-" * w for w in widths]),
        *(fmt(row) for row in body),
        "",
        "For one model in full: linattn memory --preset NAME | --config config.json | --layers N --heads H "
        "--feature-dim R [--seq-len T ...] (linattn memory --help).",
    ]


def _plan(preset: str | None, config: Path | None, ignore_unknown: bool, shapes: dict[str, Any]) -> LayerPlan | None:
    given_shapes = [f"--{k.replace('_', '-')}" for k, v in shapes.items() if v is not None]
    sources = [name for name, v in (("--preset", preset), ("--config", config)) if v is not None]
    if len(sources) > 1 or (sources and given_shapes):
        raise click.UsageError(f"use one of --preset, --config or shape flags, got {sources + given_shapes}")
    try:
        if preset is not None:
            return load_preset(preset)
        if config is not None:
            return load_config(config, strict=not ignore_unknown)
    except (TypeError, ValueError) as e:
        raise click.BadParameter(str(e), param_hint="--preset" if preset else "--config") from e
    if not given_shapes:
        return None  # nothing asked: the caller shows the presets side by side
    missing = [f"--{k.replace('_', '-')}" for k in ("layers", "heads", "feature_dim") if shapes[k] is None]
    if missing:
        raise click.UsageError(f"give --preset NAME, --config FILE, or shape flags (missing {missing})")
    interval = shapes["full_attention_interval"]
    try:
        return plan_from_shapes(**{**shapes, "full_attention_interval": 4 if interval is None else interval})
    except (TypeError, ValueError) as e:  # e.g. more layers than MAX_LAYERS
        raise click.UsageError(str(e)) from None


@click.command(name="memory", context_settings=cli_files.CONTEXT)
@click.option("--preset", type=click.Choice(list_presets()), help="A shipped real model config.")
@click.option("--config", "config", type=cli_files.FILE, help="HF-style config.json.")
@click.option("--ignore-unknown-keys", is_flag=True, help="Skip config keys the planner does not know.")
@click.option("--layers", type=POSITIVE, help="Number of layers (shape flags).")
@click.option("--heads", type=POSITIVE, help="Linear-attention state heads.")
@click.option("--feature-dim", type=POSITIVE, help="Feature width r of the state.")
@click.option("--value-dim", type=POSITIVE, help="Value width dv (default: feature dim).")
@click.option("--kv-heads", type=POSITIVE, help="KV heads of a full-attention layer (default: heads).")
@click.option("--head-dim", type=POSITIVE, help="Head width of the KV cache (default: feature dim).")
@click.option(
    "--full-attention-interval",
    type=click.IntRange(min=0),
    help="Every N-th layer is full attention (default 4: 3 linear per full; 0: none).",
)
@click.option("--normalizer/--no-normalizer", default=None, help="Count z (default: shapes yes, configs no).")
@click.option("--batch", type=POSITIVE, default=1, show_default=True, help="Requests held at once.")
@click.option("--state-dtype", type=DTYPE, default="float32", show_default=True)
@click.option("--kv-dtype", type=DTYPE, default=None, help="KV cache dtype (default: the model's, else bfloat16).")
@click.option("--conv-dtype", type=DTYPE, default=None, help="Short-conv buffer dtype (default: KV dtype).")
@click.option("--conv-state/--no-conv-state", default=True, show_default=True, help="Count short-conv buffers.")
@click.option("--mla-cache", type=click.Choice(["latent", "expanded"]), default="latent", show_default=True)
@click.option("--seq-len", "seq_lens", type=click.IntRange(min=0), multiple=True, help="Rows of the table.")
@cli_files.output_option(help="Write the report as JSON.")
@cli_files.plot_option(help="Write bytes vs T as PNG.")
@cli_files.overwrite_option()
def command(
    preset, config, ignore_unknown_keys, normalizer, batch, state_dtype, kv_dtype, conv_dtype, conv_state,
    mla_cache, seq_lens, output, plot, overwrite, **shapes,
) -> None:  # fmt: skip
    """State vs KV-cache bytes, crossover lengths and hybrid layer plans.

    Without --preset, --config or shape flags: the shipped presets side by side. Writes files only when asked
    (--output JSON, --plot PNG).
    """
    cli_files.check_outputs(overwrite, {"--output": output, "--plot": plot})
    plan = _plan(preset, config, ignore_unknown_keys, shapes)
    if plan is None:
        if output is not None or plot is not None:
            raise click.UsageError("--output and --plot need one model: give --preset, --config or shape flags")
        try:
            lines = presets_side_by_side(**({"seq_lens": tuple(seq_lens)} if seq_lens else {}), batch=batch,
                                         state_dtype=state_dtype, kv_dtype=kv_dtype, conv_dtype=conv_dtype,
                                         include_conv=conv_state, mla_expanded=mla_cache == "expanded")
        except (TypeError, ValueError) as e:
            raise click.UsageError(str(e)) from None
        click.echo("\n".join(lines))
        return
    if normalizer is not None:
        plan = dataclasses.replace(plan, linear=dataclasses.replace(plan.linear, normalizer=normalizer))
    try:
        report = memory_report(
            plan,
            seq_lens or DEFAULT_SEQ_LENS,
            batch=batch,
            state_dtype=state_dtype,
            kv_dtype=kv_dtype,
            conv_dtype=conv_dtype,
            include_conv=conv_state,
            mla_expanded=mla_cache == "expanded",
        )
    except (TypeError, ValueError) as e:  # e.g. a length beyond MAX_SEQ_LEN
        raise click.UsageError(str(e)) from None
    click.echo("\n".join([*_describe(report), "", *_table(report)]))
    if output is not None:
        doc = {"tool": "linattn memory", "linattn_version": __version__, **report, "notes": RESULT_CAVEATS}
        cli_files.write("--output", atomic_write_json, output, doc, overwrite=overwrite)
    if plot is not None:
        cli_files.write("--plot", lambda p, overwrite: _plot(p, report, overwrite=overwrite), plot,
                        overwrite=overwrite)
