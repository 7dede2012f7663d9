"""``linattn recall``: associative recall without training -- what a fixed state can give back.

Write N key/value pairs into each mechanism, then query every stored key and count exact retrievals: a
retrieval is exact when the returned vector is nearer, by **cosine similarity**, to the right value than to every
other of the N stored values (scale-free, so a normalized average and a raw read are judged alike).

Mechanisms (one head, key width d, value width dv; keys and values unit-norm):

* ``softmax``: attention over the whole KV cache with logits ``sqrt(d) * cos(q, k)`` -- standard
  ``q.k / sqrt(d)`` for vectors of norm sqrt(d). The exact baseline.
* ``accumulate`` and ``gated`` (alpha per token, one per head): normalized linear attention with the DPFP feature
  map of Schlag et al. (2021, nu = 1): ``phi(x) = r * roll(r, 1)`` with ``r = relu([x, -x])``, width 2d,
  non-negative and sparse (the +1 maps like relu+1 or elu+1 give every pair of keys a large common overlap, and
  no retrieval at all).
* ``delta`` (beta = 1) and ``gated_delta`` (beta = 1, alpha per token) on the raw unit keys: width d.

Writes and reads go through `linattn.linear_attention` (chunk form): the queries are extra tokens at the end
that write nothing (zero key, beta = 0, alpha = 1), so each reads the state after every write. Filler tokens have
random keys and values (not among the candidates) and write like any other token.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import torch
import torch.nn.functional as F
from tqdm import tqdm

import linattn
from linattn.tools.harness import cli as cli_files
from linattn.tools.harness.plotting import pyplot, save_figure
from linattn.tools.harness.results import atomic_write_json, validate

KEY_KINDS = ("orthogonal", "random", "near_duplicate")
DEFAULT_ALPHAS = (0.9, 0.99, 0.999)


@dataclass(frozen=True)
class Mechanism:
    """A memory to test: ``kind`` is ``softmax`` or a rule name; ``alpha`` the gate of gated rules."""

    kind: str
    alpha: float | None = None

    @property
    def label(self) -> str:
        return self.kind if self.alpha is None else f"{self.kind} a={self.alpha:g}"

    def state_width(self, d: int) -> int | None:
        """Rows of S (keys it can hold apart): 2d for the DPFP rules, d for delta rules, None for the KV cache."""
        return None if self.kind == "softmax" else (2 * d if self.kind in ("accumulate", "gated") else d)


def mechanisms(alphas: Sequence[float] = DEFAULT_ALPHAS) -> list[Mechanism]:
    """softmax, accumulate, gated (each alpha), delta, gated delta (each alpha)."""
    for a in alphas:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
            raise ValueError(f"alphas must lie in (0, 1], got {a!r}")
    return ([Mechanism("softmax"), Mechanism("accumulate")] + [Mechanism("gated", a) for a in alphas]
            + [Mechanism("delta")] + [Mechanism("gated_delta", a) for a in alphas])


def dpfp(x: torch.Tensor) -> torch.Tensor:
    """Deterministic parameter-free projection (Schlag et al., 2021), nu = 1: ``[..., d] -> [..., 2d]``, >= 0."""
    r = F.relu(torch.cat([x, -x], dim=-1))
    return r * torch.roll(r, shifts=1, dims=-1)


# ------------------------------------------------------------------------------------------------ inputs
def make_keys(kind: str, n: int, d: int, *, batch: int, gen: torch.Generator, similarity: float = 0.9) -> torch.Tensor:
    """``[batch, n, d]`` unit keys.

    ``orthogonal``: n rows of a random orthogonal matrix (needs n <= d). ``random``: Gaussian directions
    (cosines ~ N(0, 1/d)). ``near_duplicate``: ``normalize(u + s g_i)`` around one shared direction u, with s
    chosen so that the expected cosine between two keys is ``similarity``.
    """
    if kind not in KEY_KINDS:
        raise ValueError(f"key kind: unknown {kind!r}; expected one of {', '.join(map(str, KEY_KINDS))}")
    if kind == "orthogonal":
        if n > d:
            raise ValueError(f"orthogonal keys: n = {n} pairs cannot be orthogonal in d = {d} dimensions")
        basis, _ = torch.linalg.qr(torch.randn(batch, d, d, generator=gen, dtype=torch.float64))
        return basis.transpose(-1, -2)[:, :n]
    g = torch.randn(batch, n, d, generator=gen, dtype=torch.float64)
    if kind == "near_duplicate":
        if not 0 < similarity < 1:
            raise ValueError(f"similarity must lie in (0, 1), got {similarity!r}")
        u = F.normalize(torch.randn(batch, 1, d, generator=gen, dtype=torch.float64), dim=-1)
        # |g_i| ~ 1 after dividing by sqrt(d); u . (u + s g) ~ 1 and |u + s g|^2 ~ 1 + s^2, so cos ~ 1 / (1 + s^2)
        g = u + math.sqrt(1 / similarity - 1) * g / math.sqrt(d)
    return F.normalize(g, dim=-1)


def _unit(batch: int, n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    return F.normalize(torch.randn(batch, n, d, generator=gen, dtype=torch.float64), dim=-1)


# ------------------------------------------------------------------------------------------------ one trial
def retrieve(
    mech: Mechanism,
    keys: torch.Tensor,
    values: torch.Tensor,
    queries: torch.Tensor,
) -> torch.Tensor:
    """Write ``keys[:, t] -> values[:, t]`` in order (``[B, T, d]``, ``[B, T, dv]``), then read each query
    (``[B, Q, d]``) from the final memory; returns ``[B, Q, dv]``."""
    B, T, d = keys.shape
    Q = queries.shape[1]
    if mech.kind == "softmax":
        logits = math.sqrt(d) * torch.matmul(queries, keys.transpose(-1, -2))
        return torch.matmul(torch.softmax(logits, dim=-1), values)
    feats = dpfp if mech.kind in ("accumulate", "gated") else (lambda x: x)
    # One sequence: T writing tokens, then Q reading tokens whose key is 0 (writes nothing, in features too).
    q = feats(torch.cat([torch.zeros_like(keys), queries], dim=1))
    k = torch.cat([feats(keys), torch.zeros_like(feats(queries))], dim=1)
    v = torch.cat([values, torch.zeros(B, Q, values.shape[-1], dtype=values.dtype)], dim=1)
    write = torch.cat([torch.ones(B, T), torch.zeros(B, Q)], dim=1).to(keys.dtype)[..., None]  # [B, T+Q, 1]
    kw: dict[str, Any] = {}
    if mech.alpha is not None:
        kw["g"] = write * math.log(mech.alpha)  # alpha = 1 on reading tokens: reading does not decay the memory
    if mech.kind in ("delta", "gated_delta"):
        kw["beta"] = write.clone()  # beta = 1: with a unit key one write stores v exactly (docs/mechanism.md §3)
    o, _ = linattn.linear_attention(q[:, :, None], k[:, :, None], v[:, :, None], rule=mech.kind, form="chunk",
                                    feature_map=None, **kw)
    return o[:, T:, 0]


def exact_fraction(out: torch.Tensor, values: torch.Tensor) -> float:
    """Share of queries whose output is nearest (cosine) to its own value among the N candidates.

    ``out`` and ``values`` are ``[B, N, dv]``; query i's right answer is ``values[:, i]``.
    """
    sims = torch.matmul(F.normalize(out, dim=-1), F.normalize(values, dim=-1).transpose(-1, -2))
    hit = sims.argmax(dim=-1) == torch.arange(values.shape[1])
    return float(hit.double().mean())


def recall_accuracy(
    mech: Mechanism,
    *,
    n_pairs: int,
    d: int,
    dv: int,
    key_kind: str = "random",
    fillers_before: int = 0,
    fillers_after: int = 0,
    trials: int = 16,
    similarity: float = 0.9,
    seed: int = 0,
) -> float:
    """Exact-retrieval accuracy of ``mech`` over ``trials`` independent sequences (batched).

    Sequence: ``fillers_before`` filler writes, the N pairs, ``fillers_after`` filler writes, then the queries
    (the N stored keys). The same seed gives every mechanism the same keys, values and fillers.
    """
    for name, x in (("n_pairs", n_pairs), ("d", d), ("dv", dv), ("trials", trials)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"{name} must be a positive int, got {x!r}")
    for name, x in (("fillers_before", fillers_before), ("fillers_after", fillers_after)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise ValueError(f"{name} must be an int >= 0, got {x!r}")
    gen = torch.Generator().manual_seed(seed)
    keys = make_keys(key_kind, n_pairs, d, batch=trials, gen=gen, similarity=similarity)
    values = _unit(trials, n_pairs, dv, gen)
    fk = _unit(trials, fillers_before + fillers_after, d, gen)
    fv = _unit(trials, fillers_before + fillers_after, dv, gen)
    seq_k = torch.cat([fk[:, :fillers_before], keys, fk[:, fillers_before:]], dim=1)
    seq_v = torch.cat([fv[:, :fillers_before], values, fv[:, fillers_before:]], dim=1)
    return exact_fraction(retrieve(mech, seq_k, seq_v, keys), values)


# ------------------------------------------------------------------------------------------------ sweeps
def sweep_points(
    *,
    d: int,
    n_values: Sequence[int],
    distance_pairs: int,
    total_length: int,
    distances: Sequence[int],
    correlation_pairs: int,
    similarities: Sequence[float],
) -> list[dict[str, Any]]:
    """The sweep plan: one dict of `recall_accuracy` arguments per point, tagged with its sweep.

    * ``capacity``: N pairs for each N in ``n_values``, random keys, and orthogonal keys where N <= d.
    * ``distance``: ``distance_pairs`` random-key pairs inside ``total_length`` writes, followed by ``distance``
      filler writes before the queries (the rest of the fillers come first, so the total load is fixed).
    * ``correlation``: ``correlation_pairs`` pairs with orthogonal, random and near-duplicate keys (one point per
      similarity).
    """
    if any(x > total_length - distance_pairs or x < 0 for x in distances):
        raise ValueError(f"distances must lie in [0, total_length - distance_pairs] = [0, "
                         f"{total_length - distance_pairs}], got {', '.join(map(str, distances))}")
    pts: list[dict[str, Any]] = []
    for kind in ("random", "orthogonal"):
        pts += [{"sweep": "capacity", "key_kind": kind, "n_pairs": n} for n in n_values
                if kind == "random" or n <= d]
    pts += [{"sweep": "distance", "key_kind": "random", "n_pairs": distance_pairs, "distance": x,
             "fillers_before": total_length - distance_pairs - x, "fillers_after": x} for x in distances]
    pts += [{"sweep": "correlation", "key_kind": kind, "n_pairs": correlation_pairs} for kind in KEY_KINDS[:2]]
    pts += [{"sweep": "correlation", "key_kind": "near_duplicate", "n_pairs": correlation_pairs, "similarity": s}
            for s in similarities]
    return pts


def run_recall(
    *,
    d: int = 64,
    dv: int = 64,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    n_values: Sequence[int] | None = None,
    distance_pairs: int | None = None,
    total_length: int | None = None,
    distances: Sequence[int] | None = None,
    correlation_pairs: int | None = None,
    similarities: Sequence[float] = (0.5, 0.8, 0.95),
    trials: int = 16,
    seed: int = 0,
    progress: bool = False,
) -> list[dict[str, Any]]:
    """Every sweep point for every mechanism: one record each, with ``accuracy`` and ``chance`` (1 / N).

    Defaults scale with d: N from d/8 to 8d; d/4 pairs at distances up to the end of 4d writes; d/2 pairs for the
    correlation sweep. A point's keys, values and fillers depend on the seed and the point only.
    """
    n_values = n_values or [max(1, d // 8) * 2**i for i in range(7)]
    distance_pairs = distance_pairs or max(1, d // 4)
    total_length = total_length or 4 * d
    if distances is None:
        room = total_length - distance_pairs
        distances = sorted({0, *(min(room, x) for x in (d // 4, 3 * d // 4, 7 * d // 4)), room})
    correlation_pairs = correlation_pairs or max(1, d // 2)
    mechs = mechanisms(alphas)
    plan = sweep_points(d=d, n_values=n_values, distance_pairs=distance_pairs, total_length=total_length,
                        distances=distances, correlation_pairs=correlation_pairs, similarities=similarities)
    records = []
    with tqdm(total=len(plan) * len(mechs), disable=not progress, desc="recall", unit="run") as bar:
        for i, pt in enumerate(plan):
            args = {k: v for k, v in pt.items() if k not in ("sweep", "distance")}
            for mech in mechs:
                acc = recall_accuracy(mech, d=d, dv=dv, trials=trials, seed=seed * 100_003 + i, **args)
                records.append({**pt, "mechanism": mech.label, "kind": mech.kind, "alpha": mech.alpha,
                                "state_width": mech.state_width(d), "accuracy": acc, "chance": 1 / pt["n_pairs"]})
                bar.update()
    return records


# ------------------------------------------------------------------------------------------------ output
RESULT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "linattn recall result",
    "type": "object",
    "required": ["tool", "linattn_version", "created_utc", "config", "records"],
    "properties": {
        "tool": {"const": "recall"},
        "config": {"type": "object", "required": ["d", "dv", "trials", "alphas", "seed", "decode", "feature_map"]},
        "records": {"type": "array", "minItems": 1, "items": {
            "type": "object",
            "required": ["sweep", "key_kind", "n_pairs", "mechanism", "accuracy", "chance", "state_width"],
            "properties": {
                "sweep": {"enum": ["capacity", "distance", "correlation"]},
                "key_kind": {"enum": list(KEY_KINDS)},
                "n_pairs": {"type": "integer", "minimum": 1},
                "accuracy": {"type": "number", "minimum": 0, "maximum": 1},
            },
        }},
    },
}


def _column(r: dict[str, Any]) -> str:
    if r["sweep"] == "capacity":
        return f"{'orth' if r['key_kind'] == 'orthogonal' else 'rand'} N={r['n_pairs']}"
    if r["sweep"] == "distance":
        return f"dist={r['distance']}"
    return f"dup {r['similarity']:g}" if r["key_kind"] == "near_duplicate" else r["key_kind"][:4]


def table(records: list[dict[str, Any]], sweep: str) -> str:
    """Accuracy (%) per mechanism (rows) and sweep point (columns)."""
    rows = [r for r in records if r["sweep"] == sweep]
    cols = list(dict.fromkeys(_column(r) for r in rows))
    mechs = list(dict.fromkeys(r["mechanism"] for r in rows))
    acc = {(r["mechanism"], _column(r)): r["accuracy"] for r in rows}
    width = max(8, *(len(c) + 1 for c in cols))
    lines = [f"{'mechanism':<20}" + "".join(f"{c:>{width}}" for c in cols)]
    for m in mechs:
        lines.append(f"{m:<20}" + "".join(f"{100 * acc[(m, c)]:>{width}.0f}" for c in cols))
    return "\n".join(lines)


def explain(records: list[dict[str, Any]], sweep: str) -> str:
    """What the columns (and the row names) of `table` for ``sweep`` mean."""
    rows = [r for r in records if r["sweep"] == sweep]
    cell = "each cell: % of queries whose output is closest (cosine) to its own value among the N stored; chance 1/N"
    if sweep == "capacity":
        cols = "columns: 'rand N=n' n pairs with random unit keys, 'orth N=n' n pairs with orthogonal keys (n <= d)"
    elif sweep == "distance":
        r = rows[0]
        cols = (f"columns: 'dist=k' k filler writes (random keys and values) between the {r['n_pairs']} pairs and "
                f"the queries, {r['fillers_before'] + r['n_pairs'] + r['fillers_after']} writes in all")
    else:
        cols = (f"columns: keys of the {rows[0]['n_pairs']} pairs, 'orth' orthogonal, 'rand' random, 'dup s' near "
                "duplicates with expected cosine s between keys")
    return f"  {cols};\n  {cell}; rows: 'a=' is the gate alpha of a gated mechanism"


def plot(doc: dict[str, Any], path: str | Path, *, overwrite: bool = False) -> Path:
    """Four panels: accuracy vs N (random keys, orthogonal keys), vs distance, vs key correlation."""
    plt = pyplot()
    recs = doc["records"]
    d = doc["config"]["d"]
    mechs = list(dict.fromkeys(r["mechanism"] for r in recs))
    colors = dict(zip(mechs, plt.cm.tab10.colors, strict=False))
    # 2 x 2 at 11 x 8.5 inches reads at screen size; one legend for all four panels, outside the curves
    fig, grid = plt.subplots(2, 2, figsize=(11, 8.5), layout="constrained")
    axes = list(grid.flat)
    panels = [("capacity", "random", "n_pairs", "random keys: accuracy vs N"),
              ("capacity", "orthogonal", "n_pairs", "orthogonal keys (N <= d)"),
              ("distance", None, "distance", "distance from the writes to the queries"),
              ("correlation", None, None, "key correlation")]
    for ax, (sweep, kind, x_key, title) in zip(axes, panels, strict=True):
        for m in mechs:
            rows = [r for r in recs if r["sweep"] == sweep and r["mechanism"] == m
                    and (kind is None or r["key_kind"] == kind)]
            xs = [r[x_key] for r in rows] if x_key else list(range(len(rows)))
            style = "--" if m.startswith("gated") else "-"
            ax.plot(xs, [100 * r["accuracy"] for r in rows], style, marker="o", ms=3, color=colors[m], label=m)
        if sweep == "capacity":
            ax.set_xscale("log", base=2)
            ax.axvline(d, color="gray", lw=0.8, ls=":")
            ax.set_xlabel(f"stored pairs N (dotted: d = {d})")
            if kind == "random":
                ns = sorted({r["n_pairs"] for r in recs if r["sweep"] == sweep and r["key_kind"] == kind})
                ax.plot(ns, [100 / n for n in ns], color="black", lw=0.8, ls=":", label="chance (1/N)")
                ax.axvline(2 * d, color="gray", lw=0.8, ls="-.")
                ax.set_xlabel(f"stored pairs N (dotted: d = {d}; dash-dot: 2d = DPFP width)")
        elif sweep == "distance":
            first = next(r for r in recs if r["sweep"] == "distance")
            ax.set_xlabel(f"filler writes between the {first['n_pairs']} pairs and the queries\n"
                          f"({first['fillers_before'] + first['n_pairs'] + first['fillers_after']} writes in all)")
        else:
            rows = [r for r in recs if r["sweep"] == sweep and r["mechanism"] == mechs[0]]
            ax.set_xticks(range(len(rows)), [_column(r) for r in rows])
            ax.set_xlabel(f"{rows[0]['n_pairs']} pairs; keys")
        ax.set(title=title, ylabel="exact retrievals (%)", ylim=(-3, 103))
        ax.grid(True, alpha=0.3)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right center", fontsize=9,
               title="mechanism (a = gate alpha)")
    fig.suptitle(f"associative recall, d = {d}, no training: exact retrievals", fontsize=12)
    return save_figure(fig, path, overwrite=overwrite, dpi=110)


# ------------------------------------------------------------------------------------------------ CLI
def _floats(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        return tuple(float(s) for s in value.split(",") if s.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated numbers, got {value!r}") from None


@click.command(name="recall", context_settings=cli_files.CONTEXT)
@click.option("--d", "d", type=click.IntRange(min=2), default=64, show_default=True, help="Key width (state width).")
@click.option("--dv", type=click.IntRange(min=1), default=64, show_default=True, help="Value width.")
@click.option("--alphas", default=",".join(map(str, DEFAULT_ALPHAS)), show_default=True, callback=_floats,
              help="Gates of the gated and gated-delta mechanisms, in (0, 1].")
@click.option("--similarities", default="0.5,0.8,0.95", show_default=True, callback=_floats,
              help="Expected cosine between near-duplicate keys, in (0, 1).")
@click.option("--trials", type=click.IntRange(min=1), default=16, show_default=True, help="Sequences per point.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@cli_files.quick_option(help="Width 16, two trials per point: checks the tool in seconds; its numbers mean "
                        "nothing.")
@cli_files.threads_option()
@cli_files.output_option()
@cli_files.plot_option(help="Write the PNG plot here.", dest="plot_path")
@cli_files.overwrite_option()
@cli_files.no_progress_option()
@click.pass_context
def command(ctx, d, dv, alphas, similarities, trials, seed, quick, threads, output, plot_path, overwrite,
            no_progress) -> None:
    """Associative-recall diagnostic (no training): exact retrievals vs N, distance and key correlation. Prints
    the tables; writes files only with -o/--output and --plot."""
    cli_files.check_outputs(overwrite, {"--output": output, "--plot": plot_path})
    cli_files.apply_threads(ctx, threads)
    small = cli_files.quick_values(ctx, quick, {"d": 16, "dv": 16, "trials": 2})
    d, dv, trials = small.get("d", d), small.get("dv", dv), small.get("trials", trials)
    try:
        mechanisms(alphas)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--alphas") from None
    if not all(0 < s < 1 for s in similarities):
        raise click.BadParameter(f"similarities must lie in (0, 1), got {', '.join(map(str, similarities))}",
                                 param_hint="--similarities")
    start = time.perf_counter()
    records = run_recall(d=d, dv=dv, alphas=alphas, similarities=similarities, trials=trials, seed=seed,
                         progress=not no_progress)
    doc = {
        "tool": "recall",
        "linattn_version": linattn.__version__,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {
            "d": d, "dv": dv, "trials": trials, "alphas": list(alphas), "similarities": list(similarities),
            "seed": seed,
            "decode": "exact if the output's cosine similarity is highest with the right value among the N stored",
            "feature_map": "accumulate/gated: DPFP nu=1 (Schlag et al. 2021), width 2d; delta rules: identity",
            "softmax": "logits sqrt(d) * cos(q, k) over every written token",
            "keys": "unit norm; delta rules beta = 1; fillers: random unit keys and values",
            "form": "chunk",
        },
        "records": records,
    }
    doc["elapsed_s"] = round(time.perf_counter() - start, 2)
    validate(doc, RESULT_SCHEMA, source="recall result")
    for sweep, title in (("capacity", "capacity: accuracy (%) vs stored pairs N"),
                         ("distance", "distance: accuracy (%) vs filler writes between pairs and queries"),
                         ("correlation", "correlation: accuracy (%) vs key kind")):
        click.echo(f"\n{title}\n{explain(records, sweep)}\n{table(records, sweep)}")
    if output:
        cli_files.write("--output", atomic_write_json, output, doc, overwrite=overwrite)
    if plot_path:
        cli_files.write("--plot", lambda p, overwrite: plot(doc, p, overwrite=overwrite), plot_path,
                        overwrite=overwrite)
    click.echo(f"({doc['elapsed_s']:.1f} s)")
