"""The stability result: its JSON Schema, the worst error per length, and the table the command prints."""

from __future__ import annotations

from typing import Any

from linattn.tools.stability.measure import REFERENCE_TOL

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"], "minimum": 0}
RESULT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "linattn stability result",
    "type": "object",
    "required": ["tool", "linattn_version", "created_utc", "config", "reference", "records", "epsilon", "rescaling"],
    "properties": {
        "tool": {"const": "stability"},
        "config": {"type": "object", "required": ["rules", "form", "dtypes", "lengths", "scales", "chunk_sizes",
                                                   "seed"]},
        "reference": {"type": "object", "required": ["form", "chunk_size", "max_abs_diff_vs_numpy"]},
        "records": {"type": "array", "items": {
            "type": "object",
            "required": ["rule", "form", "dtype", "state_dtype", "length", "input_scale", "chunk_size", "error",
                         "max_abs_err", "max_rel_err", "median_rel_err", "min_den", "min_den_float64", "nan_count",
                         "inf_count", "state_nonfinite", "state_abs_max"],
            "properties": {"length": {"type": "integer", "minimum": 1}, "max_abs_err": _NUM, "max_rel_err": _NUM,
                           "min_den": _NUM, "nan_count": _INT, "inf_count": _INT, "state_nonfinite": _INT},
        }},
        "epsilon": {"type": "object", "required": ["den_min", "den_max", "cases"]},
        "rescaling": {"type": "object", "required": ["float64", "candidate"]},
    },
}


def worst_by_length(records: list[dict[str, Any]], rule: str, dtype: str) -> dict[int, float | None]:
    """Worst ``max_rel_err`` over input scales and chunk sizes, per length; None where a run failed."""
    out: dict[int, float | None] = {}
    for r in records:
        if r["rule"] != rule or r["dtype"] != dtype:
            continue
        err = None if r["error"] or r["max_rel_err"] is None else r["max_rel_err"]
        prev = out.get(r["length"], 0.0)
        out[r["length"]] = None if (err is None or prev is None) else max(prev, err)
    return out


def _fmt(x: float | None) -> str:
    return "  failed" if x is None else f"{x:8.1e}"


def summary(doc: dict[str, Any]) -> str:
    """The table the CLI prints: worst relative error per rule, dtype and length, then epsilon and rescaling."""
    lengths = doc["config"]["lengths"]
    cfg = doc["config"]
    chunks = f"chunk sizes {cfg['chunk_sizes']}" if cfg["form"] == "chunk" else "no chunk size in this form"
    state = f"; state in {cfg['state_dtype']}" if cfg.get("state_dtype") else "; state in the candidate dtype"
    ref = doc["reference"]
    worst_ref = max(ref["max_abs_diff_vs_numpy"].values())
    lines = [f"float64 ground truth vs NumPy reference loop (T={ref['check_length']}): max abs diff {worst_ref:.1e}, "
             f"tolerance {ref.get('tolerance', REFERENCE_TOL):.0e}: {'PASS' if ref.get('passed', True) else 'FAIL'}"]
    lines += [f"worst per-token relative error vs float64 ({cfg['form']} form; max over scales {cfg['scales']}, "
              f"{chunks}{state})",
              f"{'rule':<12} {'dtype':<9}" + "".join(f"{'T=' + str(t):>10}" for t in lengths) + "  nonfinite"]
    for rule in doc["config"]["rules"]:
        for name in doc["config"]["dtypes"]:
            worst = worst_by_length(doc["records"], rule, name)
            recs = [r for r in doc["records"] if r["rule"] == rule and r["dtype"] == name]
            bad = sum((r["nan_count"] or 0) + (r["inf_count"] or 0) + (r["state_nonfinite"] or 0) for r in recs)
            lines.append(f"{rule:<12} {name:<9}" + "".join(f"{_fmt(worst.get(t)):>10}" for t in lengths) + f"  {bad}")
    eps = doc["epsilon"]
    lines.append(f"\nepsilon (float64, den from {eps['den_min']:.1e} to {eps['den_max']:.1e}): "
                 "worst change, share of tokens changed > 1e-6, largest den changed > 1e-3")
    for c in eps["cases"]:
        big = "-" if c["max_den_changed_1e-3"] is None else f"{c['max_den_changed_1e-3']:.1e}"
        lines.append(f"  {c['eps_mode']:<5} eps={c['eps']:<7g} {c['max_rel_change']:.1e}  "
                     f"{100 * c['frac_changed_1e-6']:5.1f}%  {big}")
    rs = doc["rescaling"]
    p, r = rs["candidate"]["plain"], rs["candidate"]["rescaled"]
    lines.append(f"\nrescaling (T={rs['length']}, {rs['candidate']['dtype']}): plain max rel err "
                 f"{_fmt(p['max_rel_err'])}"
                 f" ({p['zero_outputs']} zero outputs, {p['state_nonfinite']} non-finite state entries); rescaled "
                 f"{_fmt(r['max_rel_err'])} ({r['n_rescales']} rescales); float64 rescaled vs plain "
                 f"{rs['float64']['max_rel_diff_rescaled_vs_plain']:.1e}, eps not rescaled "
                 f"{rs['float64']['max_rel_diff_eps_not_scaled']:.1e}")
    return "\n".join(lines)


