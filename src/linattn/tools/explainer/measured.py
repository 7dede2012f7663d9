"""Measured numbers the explainer quotes: a small summary of committed `linattn recall` / `stability` results.

The summary ships as package data (``measured.json``) so that an installed package builds the page without the
repository's ``benchmarks/results``; ``tests/test_explainer.py`` rebuilds it from those files and checks that the
two agree, so the page cannot quote numbers the result files do not hold. Regenerate after rerunning the tools::

    python -m linattn.tools.explainer.measured benchmarks/results
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

RECALL_FILE = "recall_d64.json"
STABILITY_FILE = "stability_cpu.json"
STABILITY_RECURRENT_FILE = "stability_cpu_recurrent.json"
MQAR_FILE = "mqar_sweep.json"
RECALL_MECHANISMS = ("softmax", "accumulate", "gated a=0.9", "gated a=0.99", "delta")


def summarize(results_dir: str | Path) -> dict[str, Any]:
    """Recall against distance and capacity, and accumulate's error and largest state entry against length."""
    root = Path(results_dir)
    recall = json.loads((root / RECALL_FILE).read_text())
    distance = [
        {"mechanism": r["mechanism"], "distance": r["distance"], "accuracy": r["accuracy"]}
        for r in recall["records"]
        if r["sweep"] == "distance" and r["mechanism"] in RECALL_MECHANISMS
    ]
    capacity = [
        {"mechanism": r["mechanism"], "n_pairs": r["n_pairs"], "accuracy": r["accuracy"]}
        for r in recall["records"]
        if r["sweep"] == "capacity" and r["key_kind"] == "random" and r["mechanism"] in RECALL_MECHANISMS
    ]

    def lengths(name: str, form: str) -> list[dict[str, Any]]:
        doc = json.loads((root / name).read_text())
        return [
            {"form": form, "dtype": r["dtype"], "length": r["length"], "max_rel_err": r["max_rel_err"],
             "state_abs_max": r["state_abs_max"], "reference_state_abs_max": r["reference_state_abs_max"]}
            for r in doc["records"]
            if r["rule"] == "accumulate" and r["input_scale"] == 1.0 and r["chunk_size"] in (None, 64)
            and r["dtype"] in ("float32", "bfloat16")
        ]

    mqar = json.loads((root / MQAR_FILE).read_text())
    groups, mqar_rows = mqar_table(mqar)
    return {
        "mqar_file": f"benchmarks/results/{MQAR_FILE}",
        "mqar_config": {"num_layers": mqar["config"]["num_layers"], "lrs": mqar["config"]["lrs"],
                        "seeds": len(mqar["config"]["seeds"]),
                        "max_steps": max(setting[2] for setting in mqar["config"]["settings"]),
                        "plateau_steps": mqar["config"].get("plateau_steps", 0),
                        "runs": mqar["progress"]["finished"], "total_runs": mqar["progress"]["total"]},
        "mqar_groups": groups,
        "mqar": mqar_rows,
        "recall_file": f"benchmarks/results/{RECALL_FILE}",
        "recall_config": {k: recall["config"][k] for k in ("d", "trials")},
        "recall_distance": distance,
        "recall_capacity": capacity,
        "stability_files": [f"benchmarks/results/{STABILITY_FILE}", f"benchmarks/results/{STABILITY_RECURRENT_FILE}"],
        "stability": lengths(STABILITY_FILE, "chunk") + lengths(STABILITY_RECURRENT_FILE, "recurrent"),
    }


# Mixers of the MQAR sweep with a softmax attention layer: they keep a KV cache that grows with the sequence.
MQAR_ATTENTION_MIXERS = ("attention", "hybrid")


def mqar_table(doc: dict[str, Any]) -> tuple[list[dict[str, int]], list[dict[str, Any]]]:
    """The MQAR sweep's best entries as a table: the (width, length, pairs) groups in which every mixer has its
    three seeds (a partial sweep shows only those; none: empty lists), and per mixer its state floats by width,
    whether it also keeps a KV cache, and per group the test accuracy at the winning learning rate (mean, min, max
    over the seeds), whether that entry is on the plateau and whether it won in the plateau extension."""
    mixers = doc["config"]["mixers"]
    best = {(b["mixer"], b["d_model"], b["seq_len"], b["num_pairs"]): b for b in doc["best"]}
    keys = sorted({k[1:] for k in best}, key=lambda g: (g[1], g[2], g[0]))  # length, pairs, then width
    groups = [g for g in keys if all((m, *g) in best and best[(m, *g)]["complete"] for m in mixers)]
    if not groups:
        return [], []
    rows = [{"mixer": m, "kv_cache": m in MQAR_ATTENTION_MIXERS,
             "state_floats": {str(d): best[(m, d, T, n)]["state_floats"] for d, T, n in groups},
             "accuracy": [[best[(m, *g)][k] for k in ("test_mean", "test_min", "test_max")] for g in groups],
             "plateau": [best[(m, *g)]["plateau"] for g in groups],
             "extended": [best[(m, *g)].get("extended", False) for g in groups]} for m in mixers]
    return [{"d_model": d, "seq_len": T, "num_pairs": n} for d, T, n in groups], rows


def load_measured() -> dict[str, Any]:
    """The shipped summary (``linattn/tools/explainer/measured.json``)."""
    return json.loads(resources.files("linattn.tools.explainer").joinpath("measured.json").read_text(encoding="utf-8"))


if __name__ == "__main__":
    out = Path(__file__).with_name("measured.json")
    out.write_text(json.dumps(summarize(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"), indent=1) + "\n")
    print(f"wrote {out}")
