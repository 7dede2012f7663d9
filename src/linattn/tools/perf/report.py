"""Reading a ``linattn perf`` run: side-by-side speedups, thread scaling, the targets, and the Markdown tables."""

from __future__ import annotations

from typing import Any

from linattn.tools.perf import peers as pp
from linattn.tools.perf.work import CPU_IMPL, PerfConfig

GROUPS = ("fwd", "fwdbwd", "recurrent", "decode")


# --- comparisons and targets ---------------------------------------------------------------------------------------


def attach_ratios(results: list[dict]) -> None:
    """Side-by-side speedups: for every ok peer (or softmax) case, linattn's same variant at the same shape.

    ``linattn_speedup`` = other time / linattn time (> 1: linattn is faster); linattn rows collect them in
    ``speedup_vs``. Softmax is compared with every linattn variant at its shape.
    """
    ours = {(r["group"], r["variant"], r["shape"]["B"], r["shape"]["T"]): r
            for r in results if r["impl"] == "linattn" and r["status"] == "ok"}
    for r in results:
        if r["impl"] == "linattn":
            r.setdefault("speedup_vs", {})
    for r in results:
        if r["impl"] == "linattn" or r["status"] != "ok":
            continue
        B, T = r["shape"]["B"], r["shape"]["T"]
        variants = pp.VARIANTS if r["variant"] == "softmax" else (r["variant"],)
        for variant in variants:
            mine = ours.get((r["group"], variant, B, T))
            if mine is not None:
                mine["speedup_vs"][r["impl"]] = r["median_ms"] / mine["median_ms"]
        main = ours.get((r["group"], "accumulate" if r["variant"] == "softmax" else r["variant"], B, T))
        r["linattn_speedup"] = None if main is None else r["median_ms"] / main["median_ms"]


def _find(results, group, variant, impl, B, T=None):
    for r in results:
        if (r["group"], r["variant"], r["impl"], r["shape"]["B"], r["shape"]["T"]) == (group, variant, impl, B, T):
            return r
    return None


def _detail(measured, missing: list[str]) -> str:
    """'a 1.2x, b 3.4x; not measured: c' for a target's detail column."""
    parts = [", ".join(measured)] + (["not measured: " + ", ".join(missing)] if missing else [])
    return "; ".join(p for p in parts if p)


def _target(tid: str, description: str, threshold: float, value: float | None, unit: str, detail: str,
            *, at_most: bool = False) -> dict[str, Any]:
    if value is None:
        status = "not measured"
    else:
        status = "met" if (value <= threshold if at_most else value >= threshold) else "missed"
    return {"id": tid, "description": description, "comparison": "<=" if at_most else ">=", "threshold": threshold,
            "value": value, "unit": unit, "status": status, "detail": detail}


def _why_missing(r: dict | None) -> str:
    return "case not run (not selected)" if r is None else f"{r['status']}: {r['reason']}"


def evaluate_targets(results: list[dict], rates: dict, cfg: PerfConfig, checks: list[dict]) -> list[dict]:
    """The speed targets, judged on one pass's numbers at ``cfg.target`` (and ``cfg.long`` for growth)."""
    B, T = cfg.target
    Bl, Tl = cfg.long
    bad_peers = {c["peer"] for c in checks if c["status"] == "MISMATCH"}
    out = []
    speed_targets = [("fwd", 5.0, "accumulate", "fla.naive_chunk_linear_attn"),
                     ("fwd", 5.0, "delta", "fla.delta_rule_chunkwise"),
                     ("fwd", 5.0, "gated_delta", "fla.naive_chunk_gated_delta_rule"),
                     ("fwd", 5.0, "gated_delta", "hf.torch_chunk_gated_delta_rule"),
                     ("fwdbwd", 3.0, "accumulate", "fla.naive_chunk_linear_attn"),
                     ("fwdbwd", 3.0, "delta", "fla.delta_rule_chunkwise"),
                     ("fwdbwd", 3.0, "gated_delta", "fla.naive_chunk_gated_delta_rule"),
                     ("fwdbwd", 3.0, "gated_delta", "hf.torch_chunk_gated_delta_rule")]
    for group, thr, variant, peer in speed_targets:
        mine, theirs = _find(results, group, variant, "linattn", B, T), _find(results, group, variant, peer, B, T)
        what = "forward" if group == "fwd" else "forward+backward"
        value = detail = None
        if mine is None or mine["status"] != "ok":
            detail = "linattn " + _why_missing(mine)
        elif theirs is None or theirs["status"] != "ok":
            detail = "peer " + _why_missing(theirs)
        elif peer in bad_peers:
            detail = "peer computes a different function (cross-check MISMATCH); ratio not comparable"
        else:
            value = theirs["median_ms"] / mine["median_ms"]
            detail = f"linattn {mine['median_ms']:.3g} ms vs {theirs['median_ms']:.3g} ms"
        out.append(_target(f"{group}_{variant}_vs_{peer}", f"{variant} chunk {what} >= {thr:g}x faster than {peer}",
                           thr, value, "x", detail))
    acc = _find(results, "fwd", "accumulate", "linattn", B, T)
    ok = acc is not None and acc["status"] == "ok"
    out.append(_target("fwd_accumulate_matmul_fraction", "accumulate chunk forward >= 30% of the measured matmul rate",
                       0.30, acc["frac_matmul"] if ok else None, "fraction",
                       (f"{acc['gflops']:.1f} of {rates['matmul']['gflops']:.1f} GFLOP/s" if ok
                        else "linattn " + _why_missing(acc))))
    bound = 1.125 * Tl / T  # 4.5x for 4x the tokens
    for group in ("fwd", "fwdbwd"):
        for metric, field in (("time", "median_ms"), ("peak memory", "peak_mem_bytes")):
            ratios, missing = {}, []
            for variant in pp.VARIANTS:
                a = _find(results, group, variant, "linattn", B, T)
                b = _find(results, group, variant, "linattn", Bl, Tl)
                if a and b and a["status"] == b["status"] == "ok" and a[field] and b[field]:
                    ratios[variant] = b[field] / a[field]
                else:
                    missing.append(variant)
            worst = max(ratios, key=ratios.get) if ratios else None
            detail = _detail((f"{v} {x:.2f}x" for v, x in ratios.items()), missing)
            what = "forward" if group == "fwd" else "forward+backward"
            out.append(_target(f"{group}_linear_{metric.replace(' ', '_')}",
                               f"chunk {what} {metric}: T={Tl} costs <= {bound:g}x T={T} (all variants; worst shown)",
                               bound, None if missing or worst is None else ratios[worst], "x", detail, at_most=True))
    Bd = max(cfg.decode_batches)
    fracs, missing = {}, []
    for variant in pp.VARIANTS:
        r = _find(results, "decode", variant, "linattn", Bd)
        if r and r["status"] == "ok":
            fracs[variant] = r["frac_copy"]
        else:
            missing.append(variant)
    worst = min(fracs, key=fracs.get) if fracs else None
    detail = _detail((f"{v} {x:.0%}" for v, x in fracs.items()), missing)
    out.append(_target(f"decode_b{Bd}_copy_fraction",
                       f"decode step at batch {Bd} >= 30% of copy bandwidth for the bytes it must move (worst shown)",
                       0.30, None if missing or worst is None else fracs[worst], "fraction", detail))
    return out + _cpu_kernel_targets(results, rates, cfg)


def _ok(r: dict | None) -> bool:
    return r is not None and r["status"] == "ok"


def _cpu_kernel_targets(results: list[dict], rates: dict, cfg: PerfConfig) -> list[dict]:
    """The targets of the compiled CPU kernels (``impl == "linattn.cpu"``), judged on one pass."""
    B, T = cfg.target
    out = []
    for variant, other, thr in (("delta", "linattn", 3.0), ("gated_delta", "linattn", 3.0),
                                ("delta", "fla.delta_rule_chunkwise", 4.0),
                                ("gated_delta", "hf.torch_chunk_gated_delta_rule", 4.0)):
        mine, theirs = _find(results, "fwd", variant, CPU_IMPL, B, T), _find(results, "fwd", variant, other, B, T)
        value = theirs["median_ms"] / mine["median_ms"] if _ok(mine) and _ok(theirs) else None
        detail = (f"{mine['median_ms']:.3g} ms vs {theirs['median_ms']:.3g} ms" if value is not None
                  else f"{CPU_IMPL} {_why_missing(mine)}" if not _ok(mine) else f"{other} {_why_missing(theirs)}")
        name = "torch chunk form" if other == "linattn" else other
        out.append(_target(f"cpu_fwd_{variant}_vs_{other}", f"{variant} compiled forward >= {thr:g}x {name}", thr,
                           value, "x", detail))
    acc = _find(results, "fwd", "accumulate", CPU_IMPL, B, T)
    out.append(_target("cpu_fwd_accumulate_matmul_fraction", "accumulate compiled forward >= 60% of the matmul rate",
                       0.60, acc["frac_matmul"] if _ok(acc) else None, "fraction",
                       (f"{acc['gflops']:.1f} of {rates['matmul']['gflops']:.1f} GFLOP/s" if _ok(acc)
                        else f"{CPU_IMPL} {_why_missing(acc)}")))
    for Bd, field, thr, desc, at_most in ((min(cfg.decode_batches), "median_ms", 0.010, "ms per step (<= 10 us)", True),
                                          (max(cfg.decode_batches), "frac_copy", 0.80, "of copy bandwidth", False)):
        vals = {v: r[field] for v in pp.VARIANTS if _ok(r := _find(results, "decode", v, CPU_IMPL, Bd))}
        missing = [v for v in pp.VARIANTS if v not in vals]
        worst = (max if at_most else min)(vals, key=vals.get) if vals else None
        fmt = "{:.4f} ms" if at_most else "{:.0%}"
        out.append(_target(f"cpu_decode_b{Bd}_{field}", f"compiled decode step at batch {Bd}: {desc} (worst shown)",
                           thr, None if missing or worst is None else vals[worst], "ms" if at_most else "fraction",
                           _detail((f"{v} {fmt.format(x)}" for v, x in vals.items()), missing), at_most=at_most))
    return out


# --- thread scaling -----------------------------------------------------------------------------------------------


def thread_scaling(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every case measured (ok) at the fewest and at the most threads of the run: ``speedup`` = time at the
    fewest / time at the most (above 1: more threads help), and both passes' fractions of their own rates."""
    if len(runs) < 2:
        return []
    lo, hi = min(runs, key=lambda r: r["threads"]), max(runs, key=lambda r: r["threads"])
    if lo["threads"] == hi["threads"]:
        return []
    at_hi = {c["name"]: c for c in hi["cases"] if c["status"] == "ok"}
    out = []
    for a in lo["cases"]:
        b = at_hi.get(a["name"])
        if a["status"] != "ok" or b is None:
            continue
        out.append({"name": a["name"], "group": a["group"], "variant": a["variant"], "impl": a["impl"],
                    "shape": a["shape"], "threads": [lo["threads"], hi["threads"]],
                    "median_ms": [a["median_ms"], b["median_ms"]], "speedup": a["median_ms"] / b["median_ms"],
                    "frac_matmul": [a["frac_matmul"], b["frac_matmul"]],
                    "frac_copy": [a.get("frac_copy"), b.get("frac_copy")]})
    return out


def scaling_targets(scaling: list[dict[str, Any]], cfg: PerfConfig,
                    split_min_work: int | None = None) -> list[dict[str, Any]]:
    """From 1 to 2 threads: the compiled delta-rule prefills gain at least 1.85x, and no compiled decode step is
    slower with more threads (worst shown). Not measured unless the run had both 1 and 2 threads.

    ``split_min_work``: the state entries (B*H*Dk*Dw) from which the compiled decode step splits its heads over
    threads (``linattn.backends.policy.DECODE_SPLIT_MIN_ENTRIES``). Below it the same serial kernel runs at both
    counts, so its ratio measures only how far two timings of one kernel move: such variants are listed, not judged,
    and a batch none of whose variants splits gets the status "same kernel"."""
    by = {s["name"]: s for s in scaling if s["threads"] == [1, 2]}
    B, T = cfg.target
    out = []
    for variant in ("delta", "gated_delta"):
        r = by.get(f"fwd/{variant}/{CPU_IMPL}/B{B}_T{T}")
        out.append(_target(f"scaling_fwd_{variant}", f"{variant} compiled forward, 1 -> 2 threads: >= 1.85x", 1.85,
                           None if r is None else r["speedup"], "x",
                           "not run at 1 and 2 threads" if r is None else
                           f"{r['median_ms'][0]:.3g} ms -> {r['median_ms'][1]:.3g} ms"))
    for Bd in cfg.decode_batches:
        rows = {v: r for v in pp.VARIANTS if (r := by.get(f"decode/{v}/{CPU_IMPL}/B{Bd}")) is not None}
        vals = {v: r["speedup"] for v, r in rows.items()}
        same = {v for v, r in rows.items() if split_min_work is not None and _state_entries(v, r) < split_min_work}
        judged = {v: x for v, x in vals.items() if v not in same}
        missing = [v for v in pp.VARIANTS if v not in vals]
        worst = min(judged, key=judged.get) if judged else None
        detail = _detail((f"{v} {x:.2f}x" + (" (same kernel)" if v in same else "") for v, x in vals.items()),
                         missing)
        t = _target(f"scaling_decode_b{Bd}", f"compiled decode step at batch {Bd}, 1 -> 2 threads: never "
                    "slower (worst shown)", 1.0, None if missing or worst is None else judged[worst], "x", detail)
        if vals and not missing and not judged:
            t["value"] = min(vals.values())
            t["status"] = "same kernel"
            t["detail"] = (f"one serial kernel at both counts (state below the split's {split_min_work:,} entries), "
                           f"so these ratios are the machine's spread: {detail}")
        out.append(t)
    return out


def _state_entries(variant: str, row: dict[str, Any]) -> int:
    """B*H*Dk*Dw of a decode case's state (Dw = Dv + 1 for the normalized rules' z column)."""
    sh = row["shape"]
    return sh["B"] * sh["H"] * sh["D"] * (sh["D"] + (variant in ("accumulate", "gated_head", "gated_channel")))


# --- Markdown ------------------------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".3g") -> str:
    return "" if x is None else format(x, fmt)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _mib(x: int | None) -> str:
    return "" if x is None else f"{x / 2**20:.1f}"


def _targets_table(targets: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | threshold | measured | status | detail |", "|---|---|---|---|---|"]
    for t in targets:
        val = t["value"]
        unit = {"fraction": "{:.0%}", "ms": "{:.4f} ms"}.get(t["unit"], "{:.2f}x")
        shown = "" if val is None else unit.format(val)
        thr = unit.replace(".4f", "g").replace(".2f", "g").format(t["threshold"])
        lines.append(f"| {t['description']} | {t['comparison']} {thr} | {shown} | **{t['status']}** | {t['detail']} |")
    return lines


TITLES = {"fwd": "Chunk forward", "fwdbwd": "Chunk forward+backward (autograd, grads of q, k, v, g, beta)",
          "recurrent": "Recurrent form (token loop; run at the recurrent shapes only)",
          "decode": "Decode step (inplace=True)"}


def _pass(run: dict[str, Any], cores: int | None) -> list[str]:
    """One thread count: its rates, targets and one table per group."""
    m, n = run["machine"], run["threads"]
    load = run["loadavg_before"]
    lines = ["", f"## {n} thread{'s' if n > 1 else ''}", "",
             f"Rates at {n} thread{'s' if n > 1 else ''}, same run: float32 matmul {m['matmul']['n']}^2 "
             f"{m['matmul']['gflops']:.1f} GFLOP/s; copy {m['copy']['bytes_per_side'] / 2**20:.0f} MiB "
             f"{m['copy']['gbps']:.1f} GB/s (at decode-state size {m['copy_state_size']['bytes_per_side'] / 2**20:.1f}"
             f" MiB: {m['copy_state_size']['gbps']:.1f} GB/s). Load average before: "
             f"{'unknown' if load is None else f'{load[0]:.2f}'}; {run['elapsed_s']:.0f} s."]
    others = run["others_cpu_cores"]
    if others is not None and others > 0.2 * (cores or 1):
        lines += ["", f"**Warning:** other processes kept {others:.2f} of {cores} cores busy on average during "
                  "this pass; they competed for the CPU and these timings are not representative."]
    lines += ["", f"### Targets at {n} thread{'s' if n > 1 else ''}", "", *_targets_table(run["targets"])]
    for group in GROUPS:
        rows = [r for r in run["cases"] if r["group"] == group]
        if not rows:
            continue
        lines += ["", f"### {TITLES[group]}, {n} thread{'s' if n > 1 else ''}", ""]
        if group == "decode":
            lines += ["| variant | impl | B | us/step | tokens/s | GB/s moved | % copy | % matmul | peak MiB |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in rows:
                head = f"| {r['variant']} | {r['impl']} | {r['shape']['B']} |"
                if r["status"] != "ok":
                    lines.append(f"{head} {r['status']}: {r['reason']} | | | | | |")
                    continue
                lines.append(f"{head} {r['median_ms'] * 1e3:.1f} | {r['tokens_per_s']:.3g} | {r['gbps']:.2f} | "
                             f"{_pct(r['frac_copy'])} | {_pct(r['frac_matmul'])} | {_mib(r['peak_mem_bytes'])} |")
            continue
        lines += ["| variant | impl | B | T | median ms | tokens/s | GFLOP/s | % matmul | % copy | peak MiB | "
                  "linattn speedup |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            head = f"| {r['variant']} | {r['impl']} | {r['shape']['B']} | {r['shape']['T']} |"
            if r["status"] != "ok":
                lines.append(f"{head} {r['status']}: {r['reason']} | | | | | | |")
                continue
            sp = r.get("linattn_speedup")
            lines.append(f"{head} {r['median_ms']:.3g} | {r['tokens_per_s']:.3g} | {r['gflops']:.1f} | "
                         f"{_pct(r['frac_matmul'])} | {_pct(r.get('frac_copy'))} | {_mib(r['peak_mem_bytes'])} | "
                         f"{'' if sp is None else f'{sp:.2f}x'} |")
    return lines


def _scaling(doc: dict[str, Any]) -> list[str]:
    rows = doc["scaling"]
    if not rows:
        return []
    a, b = rows[0]["threads"]
    lines = ["", f"## Thread scaling: {a} -> {b} threads", "",
             f"speedup = time at {a} / time at {b} (above 1: the extra threads help). Fractions are of each pass's "
             "own matmul rate and copy bandwidth.", "", *_targets_table(doc["scaling_targets"]), "",
             f"| case | ms at {a} | ms at {b} | speedup | % matmul at {a} | % matmul at {b} | % copy at {a} | "
             f"% copy at {b} |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        (ma, mb), (fa, fb), (ca, cb) = r["median_ms"], r["frac_matmul"], r["frac_copy"]
        lines.append(f"| {r['name']} | {ma:.3g} | {mb:.3g} | {r['speedup']:.2f}x | {_pct(fa)} | {_pct(fb)} | "
                     f"{_pct(ca)} | {_pct(cb)} |")
    return lines


def render_markdown(doc: dict[str, Any]) -> str:
    """The result document as Markdown: machine line, cross-check, each thread count's rates, targets and tables,
    then the thread-scaling table."""
    env, cfg = doc["environment"], doc["config"]
    threads = ", ".join(str(r["threads"]) for r in doc["runs"])
    lines = [
        "# linattn CPU kernel benchmark" + (" (quick smoke configuration)" if cfg["quick"] else ""),
        "",
        f"{env['cpu']}, {env['cores']} cores, torch threads {threads}, torch {env['versions']['torch']}, "
        f"created {doc['created']}, {doc['elapsed_s']:.0f} s. H={cfg['H']}, D={cfg['D']}, float32. Every kernel "
        "is shown as a fraction of the float32 matmul rate (GFLOP/s over the fixed FLOP count) and of the copy "
        "bandwidth (bytes it must move over time), both measured in the same pass.",
    ]
    if doc["crosscheck"]:
        lines += ["", "## Cross-check: each peer vs linattn on the same inputs", "",
                  "| peer | variant | form | max abs diff | rel diff | status |", "|---|---|---|---|---|---|"]
        for c in doc["crosscheck"]:
            lines.append(f"| {c['peer']} | {c['variant']} | {c['form']} | {_f(c['max_abs_diff'], '.2e')} | "
                         f"{_f(c['rel_diff'], '.2e')} | {c['status']} |")
    for run in doc["runs"]:
        lines += _pass(run, env["cores"])
    lines += _scaling(doc)
    lines += ["", "linattn speedup = that row's time / linattn's time for the same variant and shape (softmax rows: "
              "vs linattn accumulate). linattn is the torch form (backend='torch'), linattn.cpu the compiled kernel "
              "(backend='cpu': forward, forward + its compiled backward, and decode). FLOP and byte counts: "
              "docs/perf.md."]
    return "\n".join(lines) + "\n"


def render_quick(doc: dict[str, Any]) -> str:
    """The ``--quick`` summary: one line per case with its time and its speed-up over linattn's torch form of the
    same case (bigger is faster), no targets (a smoke run's numbers judge nothing). Cases of peers that are not
    installed are left out and counted (the command names the peers once, before measuring)."""
    env, cfg = doc["environment"], doc["config"]
    threads = ", ".join(str(r["threads"]) for r in doc["runs"])
    lines = [f"linattn perf --quick: every case once at a tiny shape (H={cfg['H']}, D={cfg['D']}), {env['cpu']}, "
             f"{env['cores']} cores, torch threads {threads}, {doc['elapsed_s']:.0f} s. A smoke run: its numbers "
             "mean nothing and judge no target; run `linattn perf` for those."]
    missing: dict[str, None] = {}
    counts = {"ran": 0, "skipped": 0, "error": 0, "absent": 0}
    mismatched = [c["peer"] for c in doc["crosscheck"] if c["status"] in ("MISMATCH", "error")]
    width = max([len(r["name"]) for run in doc["runs"] for r in run["cases"]] + [24]) + 2
    for run in doc["runs"]:
        base = {(r["group"], r["variant"], r["shape"]["B"], r["shape"]["T"]): r["median_ms"]
                for r in run["cases"] if r["impl"] == "linattn" and r["status"] == "ok"}
        title = f"case ({run['threads']} thread{'s' if run['threads'] > 1 else ''})"
        lines += ["", f"{title:<{width}}{'ms':>10}  speed-up"]
        for r in run["cases"]:
            if r["status"] == "not installed":
                missing[r["impl"]] = None
                counts["absent"] += 1
                continue
            if r["status"] != "ok":
                counts["skipped" if r["status"] == "skipped" else "error"] += 1
                lines.append(f"{r['name']:<{width}}{r['status']:>10}  {r['reason']}")
                continue
            counts["ran"] += 1
            ref = base.get((r["group"], r["variant"], r["shape"]["B"], r["shape"]["T"]))
            speed = "" if ref is None or r["variant"] == "softmax" else f"{ref / r['median_ms']:.2f}x"
            lines.append(f"{r['name']:<{width}}{r['median_ms']:>10.3g}  {speed}")
    lines += ["", "speed-up = the time of linattn's torch form (impl linattn) for the same case / this row's time: "
              "above 1, this row is faster.",
              f"{counts['ran']} cases ran, {counts['skipped']} skipped, {counts['error']} failed"
              + (f", {counts['absent']} cases of peers left out ({', '.join(missing)})." if missing else ".")]
    if mismatched:
        lines.append(f"cross-check: {', '.join(mismatched)} did not match linattn (see the JSON's crosscheck).")
    return "\n".join(lines) + "\n"
