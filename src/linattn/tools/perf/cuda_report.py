"""Ratios and the Markdown report of ``linattn perf --device cuda`` (`linattn.tools.perf.cuda`)."""

from __future__ import annotations

from typing import Any

LINATTN = "linattn.triton"
SDPA = "torch.sdpa"


def _key(row: dict[str, Any]) -> tuple:
    s = row["shape"]
    return row["group"], s["B"], s["T"], s["H"], s["D"]


def attach_ratios(rows: list[dict[str, Any]]) -> None:
    """Per row: ``fla_over_linattn`` (fla's median time over linattn's for the same variant, shape and pass; above
    1 means linattn is faster) on both rows of the pair, and ``sdpa_over_this`` (SDPA's time over this row's)."""
    by = {(_key(r), r["variant"], r["impl"]): r for r in rows}
    sdpa = {_key(r): r for r in rows if r["impl"] == SDPA}
    for r in rows:
        r["fla_over_linattn"] = None
        r["sdpa_over_this"] = None
        if r.get("median_ms") is None:
            continue
        s = sdpa.get(_key(r))
        if s is not None and s.get("median_ms") is not None and r["impl"] != SDPA:
            r["sdpa_over_this"] = s["median_ms"] / r["median_ms"]
        if r["impl"] == SDPA:
            continue
        ours = by.get((_key(r), r["variant"], LINATTN))
        peers = [p for (k, v, i), p in by.items() if k == _key(r) and v == r["variant"] and i != LINATTN]
        if ours is None or not peers or ours.get("median_ms") is None or peers[0].get("median_ms") is None:
            continue
        r["fla_over_linattn"] = peers[0]["median_ms"] / ours["median_ms"]


def _ms(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if row.get("median_ms") is None:
        return row.get("status", "?")
    return f"{row['median_ms']:.3f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def render_markdown(doc: dict[str, Any]) -> str:
    """Rates, the float64 cross-check, then one table per shape: median ms per pass for linattn and fla, fla's
    time over linattn's, linattn's TFLOP/s and its fraction of the measured matmul rate."""
    env, rates = doc["environment"], doc["machine"]
    lines = [
        f"# linattn perf --device cuda ({env['device']}, bfloat16, triton {env['triton']}, CUDA {env['cuda']})",
        "",
        f"Measured in this run: bfloat16 matmul {rates['matmul']['tflops']:.1f} TFLOP/s (n = {rates['matmul']['n']}), "
        f"copy {rates['copy']['gbps']:.0f} GB/s (read + write). Run took {doc['elapsed_s']:.0f} s.",
        "",
        "## Check against float64 (linattn's torch chunk form on the same inputs)",
        "",
        "| variant | impl | output max rel err | gradient max rel err |",
        "|---|---|---|---|",
    ]
    for c in doc["crosscheck"]:
        for impl, r in c.items():
            if not isinstance(r, dict):
                continue
            if "error" in r:
                lines.append(f"| {c['variant']} | {impl} | {r['error'][:80]} | |")
            else:
                lines.append(f"| {c['variant']} | {impl} | {r['out_max_rel_err']:.2e} | {r['grad_max_rel_err']:.2e} |")
    rows = doc["cases"]
    shapes = list(dict.fromkeys((r["shape"]["B"], r["shape"]["T"], r["shape"]["H"], r["shape"]["D"]) for r in rows))
    for B, T, H, D in shapes:
        here = [r for r in rows if (r["shape"]["B"], r["shape"]["T"], r["shape"]["H"], r["shape"]["D"]) == (B, T, H, D)]
        lines += ["", f"## B={B}, T={T}, H={H}, D={D}", "",
                  "| variant | peer | pass | linattn ms | peer ms | peer / linattn | linattn TFLOP/s | of matmul |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in here:
            if r["impl"] == SDPA:
                lines.append(f"| softmax (SDPA) | | {r['group']} | | {_ms(r)} | | | |")
        variants = list(dict.fromkeys(r["variant"] for r in here if r["impl"] != SDPA))
        for variant in variants:
            for group in ("fwd", "fwdbwd"):
                pair = [r for r in here if r["variant"] == variant and r["group"] == group]
                ours = next((r for r in pair if r["impl"] == LINATTN), None)
                peer = next((r for r in pair if r["impl"] != LINATTN), None)
                if ours is None and peer is None:
                    continue
                ratio = (ours or peer).get("fla_over_linattn")
                tf = "-" if ours is None or ours.get("tflops") is None else f"{ours['tflops']:.1f}"
                frac = "-" if ours is None or ours.get("frac_matmul") is None else f"{ours['frac_matmul']:.1%}"
                lines.append(f"| {variant} | {peer['impl'] if peer else '-'} | {group} | {_ms(ours)} | {_ms(peer)} | "
                             f"{_x(ratio)} | {tf} | {frac} |")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        lines += ["", "## Not measured", ""] + [f"- {r['name']}: {r['status']} ({r['reason']})" for r in bad]
    return "\n".join(lines) + "\n"
