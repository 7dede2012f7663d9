"""The written part of ``linattn bench``: the result document, the decision, the side-by-side table, the plot.

Everything here reads rows of numbers and writes nothing but the plot; `decide` and `compare` are
pure functions of their arguments, so the decision logic is tested without measuring anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from linattn.tools.bench.plan import BASELINE, CANDIDATE_PATHS, FEATURES, Plan, normalizes
from linattn.tools.bench.workload import PEAK_MEMORY_METHOD, TIMING_METHOD, TRANSIENT_UNAVAILABLE
from linattn.tools.harness.machine import busy_reason
from linattn.tools.harness.plotting import save_figure

SCHEMA = "bench_result"
SCHEMA_VERSION = 2  # 2 adds ``contention`` and evidence level "disturbed"; files of version 1 stay readable
# A row is unstable when its p90 step is this many times its median (quiet runs stay under 2.5: the first step of
# each turn of 10 may find its data out of cache); the fixed state's step does the same work at every L, so its
# median changing more than STATE_FLAT_FACTOR-fold over L means something else took the time.
UNSTABLE_P90_FACTOR = 5.0
STATE_FLAT_FACTOR = 3.0
CONTENTION_METHOD = (
    "others_cpu_cores: CPU seconds the whole machine spent busy (/proc/stat) minus this process's own CPU time, "
    "over the wall time, sampled for 0.3 s before the run (others_cpu_cores_before) and over the whole "
    "measurement (others_cpu_cores); disturbed when either exceeds 20% of the cores, when a row's p90 step is over "
    f"{UNSTABLE_P90_FACTOR:g}x its median, or when a fixed state's median step (the same work at every L) varies "
    f"over {STATE_FLAT_FACTOR:g}x across L"
)


def _index(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Rows by (path, sequence_length)."""
    return {(r["path"], r["sequence_length"]): r for r in rows}


# ---------------------------------------------------------------------------------------------------- judging
def time_crossover(lengths: Sequence[int], baseline_ms: Sequence[float], candidate_ms: Sequence[float]):
    """Length where the candidate's step becomes as fast as the baseline's: log-log interpolation between the
    two measured lengths where the ratio crosses 1. Returns (length or None, note)."""
    pts = sorted(zip(lengths, baseline_ms, candidate_ms, strict=True))
    logr = [math.log(b / c) for _, b, c in pts]  # > 0: candidate faster
    for ((l0, *_), (l1, *_)), (r0, r1) in zip(pairwise(pts), pairwise(logr), strict=True):
        if r0 < 0 <= r1 or r0 > 0 >= r1:
            x = math.log(l0) + (math.log(l1) - math.log(l0)) * (-r0) / (r1 - r0)
            faster = "faster" if r1 > r0 else "slower"
            return math.exp(x), f"candidate becomes {faster} than the baseline between L={l0} and L={l1}"
    if all(r > 0 for r in logr):
        return None, f"candidate faster at every measured L (crossover below L={pts[0][0]})"
    if all(r < 0 for r in logr):
        return None, f"candidate slower at every measured L (no crossover up to L={pts[-1][0]})"
    return None, "no single crossover in the measured range"


def compare(
    rows: Sequence[dict[str, Any]], candidate_paths: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per candidate and L: history/state bytes and baseline/candidate median time and peak; plus crossovers."""
    by = _index(rows)
    lengths = sorted({L for (p, L) in by if p == BASELINE})
    comparisons, crossovers = [], []
    for path in candidate_paths:
        common = [L for L in lengths if (path, L) in by]
        for L in common:
            b, c = by[(BASELINE, L)], by[(path, L)]
            comparisons.append(
                {
                    "path": path,
                    "sequence_length": L,
                    "history_to_state_bytes": b["state_bytes"] / c["state_bytes"],
                    "median_time_ratio": b["median_step_ms"] / c["median_step_ms"] if c["median_step_ms"] else None,
                    "peak_memory_ratio": b["peak_memory_mb"] / c["peak_memory_mb"] if c["peak_memory_mb"] else None,
                }
            )
        if not common:
            continue
        per_token = by[(BASELINE, common[-1])]["state_bytes"] / common[-1]
        base_ms = [by[(BASELINE, L)]["median_step_ms"] for L in common]
        cand_ms = [by[(path, L)]["median_step_ms"] for L in common]
        if all(m > 0 for m in base_ms + cand_ms):
            t_cross, note = time_crossover(common, base_ms, cand_ms)
        else:
            t_cross, note = None, "a median step time of 0 ms: timer too coarse for a crossover"
        crossovers.append(
            {
                "path": path,
                "bytes_crossover_length": by[(path, common[-1])]["state_bytes"] / per_token,
                "time_crossover_length": t_cross,
                "time_crossover_note": note,
            }
        )
    return comparisons, crossovers


def decide(
    rows: Sequence[dict[str, Any]],
    *,
    candidate_paths: Sequence[str],
    lengths: Sequence[int] | None = None,
    reference_checks: Sequence[dict[str, Any]] = (),
    failure: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Accept the fixed-state mechanism when the KV history's bytes grow with L, every candidate's state bytes
    stay constant, every output is finite and the state output matches float64; otherwise reject or say why the
    run cannot tell. Pure: reads only its arguments."""
    checks: dict[str, bool | None] = {
        "history_bytes_grow": None,
        "state_bytes_constant": None,
        "outputs_finite": None,
        "reference_match": None,
    }

    def out(outcome: str, reason: str) -> dict[str, Any]:
        return {"outcome": outcome, "reason": reason, "checks": checks}

    if failure is not None:
        return out("inconclusive_run_failed", f"the run failed ({failure['stage']}): {failure['message']}")
    by = _index(rows)
    lengths = sorted(set(lengths) if lengths is not None else {L for _, L in by})
    missing = [f"{p}@L={L}" for p in [BASELINE, *candidate_paths] for L in lengths if (p, L) not in by]
    if missing or not lengths:
        return out("inconclusive_missing_rows", "no rows measured for " + (", ".join(missing) or "any length"))
    hist = [by[(BASELINE, L)]["state_bytes"] for L in lengths]
    checks["outputs_finite"] = all(r["outputs_finite"] for r in rows)
    checks["reference_match"] = all(c["passed"] for c in reference_checks) if reference_checks else None
    checks["history_bytes_grow"] = len(lengths) >= 2 and all(a < b for a, b in pairwise(hist))
    growing = [p for p in candidate_paths if len({by[(p, L)]["state_bytes"] for L in lengths}) > 1]
    checks["state_bytes_constant"] = len(lengths) >= 2 and not growing
    if len(lengths) < 2:
        return out("inconclusive_too_few_lengths", f"one length (L={lengths[0]}) cannot show growth with L")
    if not checks["outputs_finite"]:
        bad = sorted({f"{r['path']}@L={r['sequence_length']}" for r in rows if not r["outputs_finite"]})
        return out("reject_non_finite_outputs", "non-finite outputs in " + ", ".join(bad))
    if checks["reference_match"] is False:
        bad = [
            f"{c['path']}@L={c['sequence_length']} (max error {c['max_abs_error']}, tolerance {c['tolerance']})"
            for c in reference_checks
            if not c["passed"]
        ]
        return out("reject_reference_mismatch", "state output differs from the float64 reference: " + "; ".join(bad))
    if growing:
        return out("reject_state_bytes_grow", "recurrent state bytes change with L for " + ", ".join(growing))
    if not checks["history_bytes_grow"]:
        return out("inconclusive_history_not_growing", f"KV history bytes {hist} do not grow with L={lengths}")
    states = ", ".join(f"{p} {by[(p, lengths[0])]['state_bytes']:,}" for p in candidate_paths)
    ref = "" if checks["reference_match"] is None else "; state output matches the float64 reference"
    return out(
        "accept_fixed_state_growth_mechanism",
        f"KV history grows from {hist[0]:,} to {hist[-1]:,} bytes over L={lengths[0]}..{lengths[-1]} while the "
        f"recurrent state stays at {states} bytes; every output finite{ref}",
    )


def assess_contention(
    rows: Sequence[dict[str, Any]],
    *,
    cores: int | None,
    threads: int,
    threads_source: str,
    others_before: float | None,
    others_during: float | None,
    loadavg_before: Sequence[float] | None,
) -> dict[str, Any]:
    """Whether the timings can be trusted: other processes' CPU use before and during the run, and two signs
    in the rows themselves (a p90 far above the median; a fixed state whose step time moves with L). Pure."""
    reasons = []
    for when, others in (("before the run", others_before), ("during the run", others_during)):
        why = busy_reason(others, cores, threads)
        if why:
            reasons.append(f"{why} {when}")
    for r in rows:
        if r["median_step_ms"] > 0 and r["p90_step_ms"] > UNSTABLE_P90_FACTOR * r["median_step_ms"]:
            reasons.append(
                f"{r['path']}@L={r['sequence_length']}: p90 step {r['p90_step_ms']:.3g} ms is "
                f"{r['p90_step_ms'] / r['median_step_ms']:.0f}x the median {r['median_step_ms']:.3g} ms"
            )
    for path in sorted({r["path"] for r in rows if r["path"] != BASELINE}):
        med = [r["median_step_ms"] for r in rows if r["path"] == path]
        if len(med) >= 2 and min(med) > 0 and max(med) > STATE_FLAT_FACTOR * min(med):
            reasons.append(
                f"{path}: median step {min(med):.3g} to {max(med):.3g} ms across L although its work does not "
                "depend on L"
            )
    return {
        "disturbed": bool(reasons),
        "reasons": reasons,
        "cores": cores,
        "threads": threads,
        "threads_source": threads_source,
        "others_cpu_cores_before": others_before,
        "others_cpu_cores": others_during,
        "loadavg_before": None if loadavg_before is None else [float(x) for x in loadavg_before],
        "method": CONTENTION_METHOD,
    }


def evidence_level(failure: dict[str, str] | None, contention: dict[str, Any] | None) -> str:
    """``incomplete`` (the run failed), ``disturbed`` (timings not to be trusted) or ``measured``."""
    if failure:
        return "incomplete"
    return "disturbed" if contention and contention["disturbed"] else "measured"


# ---------------------------------------------------------------------------------------------------- documents
def describe_paths(plan: Plan) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    baseline = {
        "path": BASELINE,
        "description": "static KV cache of L slots; each step writes the new token's K and V into slot L-1 in "
        "place and attends with the one query over all L slots",
        "attention": "torch.nn.functional.scaled_dot_product_attention (no mask: one query sees every slot)",
        "cache_layout": f"K and V, each [B, H, L, D] in {plan.dtype}, allocated once per L",
    }
    candidates = []
    for rule in plan.rules:
        norm = normalizes(rule)
        candidates.append(
            {
                "path": CANDIDATE_PATHS[rule],
                "rule": rule,
                "feature_map": FEATURES[rule][0],
                "normalize": norm,
                "description": "state after L-1 history tokens (prefilled by linattn.linear_attention, chunk form); "
                "each step is linattn.step(q, k, v, state, inplace=True)",
                "state_layout": f"S [B, H, D, D]{' and z [B, H, D]' if norm else ''} in {plan.state_dtype}",
            }
        )
    return baseline, candidates


def build_document(
    plan: Plan,
    *,
    identity: dict[str, Any],
    hardware: dict[str, Any],
    rows: list[dict[str, Any]],
    reference_checks: list[dict[str, Any]],
    failure: dict[str, str] | None,
    transient_measured: bool = True,
    contention: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result file's document; ``contention`` (see `assess_contention`) is required by schema 2."""
    baseline, candidates = describe_paths(plan)
    comparisons, crossovers = compare(rows, plan.candidate_paths)
    memory_method = PEAK_MEMORY_METHOD[plan.device]
    if plan.device == "cpu" and not transient_measured:
        memory_method += TRANSIENT_UNAVAILABLE
    return {
        "schema_version": SCHEMA_VERSION,
        "identity": identity,
        "workload": plan.workload(),
        "hardware": hardware,
        "baseline": baseline,
        "candidates": candidates,
        "metrics": {
            "rows": rows,
            "timing_method": TIMING_METHOD[plan.device],
            "peak_memory_method": memory_method,
            "reference_checks": reference_checks,
            "comparisons": comparisons,
            "crossovers": crossovers,
        },
        "evidence_level": evidence_level(failure, contention),
        "contention": contention,
        "failure": failure,
        "decision": decide(
            rows,
            candidate_paths=plan.candidate_paths,
            lengths=plan.sequence_lengths,
            reference_checks=reference_checks,
            failure=failure,
        ),
    }


# ---------------------------------------------------------------------------------------------------- table
_COLUMNS = ["state bytes", "median ms", "p90 ms", "peak MiB"]
_WIDTHS = [13, 10, 9, 9]


def _fmt_ms(x: float) -> str:
    return f"{x:.4f}" if x < 1 else f"{x:.3f}"


def _fmt_len(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _cells(values: Sequence[str]) -> str:
    return "  ".join(f"{c:>{wd}}" for c, wd in zip(values, _WIDTHS, strict=True))


def _row_cells(r: dict[str, Any] | None) -> list[str]:
    if r is None:
        return ["-"] * len(_COLUMNS)
    flag = "" if r["outputs_finite"] else "!"
    return [
        f"{r['state_bytes']:,}",
        _fmt_ms(r["median_step_ms"]) + flag,
        _fmt_ms(r["p90_step_ms"]),
        f"{r['peak_memory_mb']:.3f}",
    ]


def _summary(i: int, d: dict[str, Any]) -> list[str]:
    """Ratios, crossovers, reference checks, failure and decision of the ``i``-th file."""
    m, lines = d["metrics"], []
    for cross in m["crossovers"]:
        ratios = "  ".join(
            f"L={c['sequence_length']:,}: {c['median_time_ratio']:.2f}x"
            for c in m["comparisons"]
            if c["path"] == cross["path"] and c["median_time_ratio"] is not None
        )
        lines.append(f"[{i}] {cross['path']}: KV/state median step time  {ratios}")
        lines.append(
            f"    bytes crossover L = {_fmt_len(cross['bytes_crossover_length'])}; time crossover L ~ "
            f"{_fmt_len(cross['time_crossover_length'])} ({cross['time_crossover_note']})"
        )
    for c in m["reference_checks"]:
        err = "non-finite" if c["max_abs_error"] is None else f"{c['max_abs_error']:.2e}"
        verdict = "ok" if c["passed"] else "FAILED"
        lines.append(
            f"[{i}] reference check {c['path']} @ L={c['sequence_length']:,}: max abs error {err} "
            f"(tolerance {c['tolerance']:g}) {verdict}"
        )
    if d["failure"]:
        lines.append(f"[{i}] failure ({d['failure']['stage']}): {d['failure']['message']}")
    cont = d.get("contention")
    if cont and cont["disturbed"]:
        lines.append(f"[{i}] WARNING: timings disturbed, step times and the time crossover are not to be trusted:")
        lines += [f"    - {why}" for why in cont["reasons"][:6]]
        if len(cont["reasons"]) > 6:
            lines.append(f"    - and {len(cont['reasons']) - 6} more (contention.reasons in the file)")
    elif "contention" not in d:
        lines.append(f"[{i}] (schema version {d['schema_version']}: contention was not recorded)")
    lines.append(f"[{i}] decision: {d['decision']['outcome']} - {d['decision']['reason']}")
    return lines


def format_table(docs: Sequence[dict[str, Any]]) -> str:
    """One block of columns per result file (bytes kept, median and p90 step time, peak memory) side by side."""
    lines = []
    for i, d in enumerate(docs, 1):
        w, hw, ident = d["workload"], d["hardware"], d["identity"]
        lines.append(
            f"[{i}] {ident['workload_id']}_{ident['run_label']}: {hw['device']} {hw['device_name']} "
            f"({hw['threads']} threads), {w['dtype']} tokens, {w['state_dtype']} state, B={w['batch']} "
            f"H={w['query_heads']} D={w['head_dim']}, {w['repeats']} repeats after {w['warmup']} warmup"
        )
    keys: dict[tuple[int, str], None] = {}  # (L, path) in order of first appearance, baseline first per L
    for d in docs:
        for r in sorted(d["metrics"]["rows"], key=lambda r: (r["sequence_length"], r["path"] != BASELINE)):
            keys[(r["sequence_length"], r["path"])] = None
    lookup = [_index(d["metrics"]["rows"]) for d in docs]
    path_w = max([len("path")] + [len(p) for _, p in keys])
    head = f"{'L':>7}  {'path':<{path_w}}"
    sub = " " * len(head)
    for i in range(1, len(docs) + 1):
        group = _cells(_COLUMNS)
        head += f" | {group}"
        sub += f" | {f'[{i}]':<{len(group)}}"
    lines += ["", sub.rstrip(), head, "-" * len(head)]
    for L, p in keys:
        lines.append(f"{L:>7,}  {p:<{path_w}}" + "".join(f" | {_cells(_row_cells(lk.get((p, L))))}" for lk in lookup))
    lines.append("")
    for i, d in enumerate(docs, 1):
        lines += _summary(i, d)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- plot
def _mark(ax, x: float, text: str, *, ls: str, fontsize: int, y: float = 0.97) -> None:
    """A vertical line at ``x`` with its label written along it, top down from height ``y`` (axes fraction)."""
    ax.axvline(x, ls=ls, color="gray")
    ax.annotate(
        text, (x, y), xycoords=("data", "axes fraction"), fontsize=fontsize, va="top", ha="right", rotation=90,
        bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1},
    )


_RUN_STYLES = ("-", "--", ":", "-.")
_PATH_MARKERS = "os^Dv<>"


def run_name(d: dict[str, Any]) -> str:
    """``<workload_id>_<run_label>``: the default file name of a run, which is how runs are told apart."""
    return f"{d['identity']['workload_id']}_{d['identity']['run_label']}"


def _run_key(i: int, d: dict[str, Any]) -> str:
    hw, ident = d["hardware"], d["identity"]
    flag = ", TIMINGS DISTURBED" if d.get("evidence_level") == "disturbed" else ""
    return f"[{i + 1}] {run_name(d)}: {hw['device']}, {hw['threads']} threads, {ident['created_utc']}{flag}"


def _plot_doc(ax_b, ax_t, d: dict[str, Any], i: int, tag: str, path_colors: dict[str, str]) -> list[str]:
    """One result file's lines on the bytes (``ax_b``) and time (``ax_t``) axes: the color says the path, the
    line style the run. Returns the time-crossover notes that have no mark to draw."""
    rows = d["metrics"]["rows"]
    paths = [BASELINE] + [c["path"] for c in d["candidates"]]
    for path in paths:
        pr = sorted((r for r in rows if r["path"] == path), key=lambda r: r["sequence_length"])
        if not pr:
            continue
        color = path_colors.setdefault(path, f"C{len(path_colors) % 10}")
        style = {"marker": _PATH_MARKERS[list(path_colors).index(path) % 7], "color": color,
                 "ls": _RUN_STYLES[i % len(_RUN_STYLES)]}
        Ls = [r["sequence_length"] for r in pr]
        ax_b.plot(Ls, [r["state_bytes"] for r in pr], label=f"{tag}{path}", **style)
        med = np.array([r["median_step_ms"] for r in pr])
        p90 = np.array([r["p90_step_ms"] for r in pr])
        ax_t.errorbar(Ls, med, yerr=[np.zeros_like(med), p90 - med], capsize=3, label=f"{tag}{path}", **style)
    notes = []
    for k, cross in enumerate(d["metrics"]["crossovers"]):
        Lt = cross["time_crossover_length"]
        if Lt is not None:  # staggered per run and candidate so that labels at nearby L do not overlap
            _mark(ax_t, Lt, f"{tag}L~{Lt:,.0f}", ls=_RUN_STYLES[i % len(_RUN_STYLES)], fontsize=7,
                  y=0.97 - 0.2 * ((i + k) % 4))
        else:
            notes.append(f"{tag}{cross['path']}: {cross['time_crossover_note']}")
    return notes


def _bytes_guides(ax_b, docs: Sequence[dict[str, Any]]) -> None:
    """Where the KV bytes (exactly linear in L) meet each state's constant bytes: drawn once per distinct line,
    with the runs that share it, so identical runs do not stack identical labels."""
    fits: dict[float, list[int]] = {}
    marks: dict[int, list[int]] = {}
    states: set[int] = set()
    lo, hi = math.inf, 0
    for i, d in enumerate(docs):
        rows, crosses = d["metrics"]["rows"], d["metrics"]["crossovers"]
        base = sorted((r for r in rows if r["path"] == BASELINE), key=lambda r: r["sequence_length"])
        if not base or not crosses:
            continue
        fits.setdefault(base[-1]["state_bytes"] / base[-1]["sequence_length"], []).append(i + 1)
        for c in crosses:
            marks.setdefault(round(c["bytes_crossover_length"]), []).append(i + 1)
        states |= {r["state_bytes"] for r in rows if r["path"] != BASELINE}
        lo = min(lo, base[0]["sequence_length"], *(c["bytes_crossover_length"] for c in crosses))
        hi = max(hi, base[-1]["sequence_length"])
    if not fits:
        return
    many = len(docs) > 1
    xs = np.geomspace(max(lo / 2, 1), hi, 50)
    for per_token, runs in fits.items():
        who = f"{runs} " if many else ""
        ax_b.plot(xs, per_token * xs, ls="--", color="gray", lw=0.8, label=f"{who}KV bytes = {per_token:,.0f} * L")
    for state in sorted(states):
        ax_b.plot(xs, np.full_like(xs, state), ls="--", color="gray", lw=0.5)
    for k, (Lb, runs) in enumerate(sorted(marks.items())):
        who = f"[{', '.join(map(str, sorted(set(runs))))}] " if many else ""  # run numbers, as the title's [1] [2]
        _mark(ax_b, Lb, f"{who}bytes equal at L={Lb:,.0f}", ls=":", fontsize=8, y=0.97 - 0.25 * (k % 3))


def plot_results(docs: Sequence[dict[str, Any]], out: str | os.PathLike, *, overwrite: bool = False) -> Path:
    """State bytes and median step time against L, log-log, every path of every run (color: path, line style:
    run), crossovers marked, runs named under the title; written atomically."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, NullFormatter

    many = len(docs) > 1
    fig = Figure(figsize=(12, 5.6 + (0.22 * len(docs) if many else 0)), layout="constrained")
    ax_b, ax_t = fig.subplots(1, 2)
    colors: dict[str, str] = {}
    notes = []
    for i, d in enumerate(docs):
        notes += _plot_doc(ax_b, ax_t, d, i, f"[{i + 1}] " if many else "", colors)
    _bytes_guides(ax_b, docs)
    for k, note in enumerate(notes):
        ax_t.text(0.02, 0.02 + 0.05 * k, note, transform=ax_t.transAxes, fontsize=7)
    all_lengths = sorted({r["sequence_length"] for d in docs for r in d["metrics"]["rows"]})
    for ax, ylabel in ((ax_b, "bytes kept between steps"), (ax_t, "step time, median (bar to p90), ms")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("history length L (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        # below the axes: inside, a legend would hide the crossover labels near the smallest L
        ax.legend(fontsize=7 if many else 8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
        ax.set_xticks(all_lengths)
    d0 = docs[0]
    w = d0["workload"]
    shape = (f"{d0['hardware']['device']}, {w['dtype']}, state {w['state_dtype']}, B={w['batch']} "
             f"H={w['query_heads']} D={w['head_dim']}")
    title = "decode step: explicit KV history vs fixed recurrent state"
    if many:
        title += "\n" + "\n".join(_run_key(i, d) for i, d in enumerate(docs))
    else:
        title += f" ({shape}, {run_name(d0)})"
        if d0.get("evidence_level") == "disturbed":
            title += "\nTIMINGS DISTURBED by other processes (contention.reasons in the file): do not trust the times"
    fig.suptitle(title, fontsize=9 if many else 10)
    return save_figure(fig, out, overwrite=overwrite, dpi=120)
