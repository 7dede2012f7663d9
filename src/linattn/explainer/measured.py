"""Measured numbers the explainer quotes: a small summary of committed `linattn recall` / `stability` results.

The summary ships as package data (``measured.json``) so that an installed package builds the page without the
repository's ``benchmarks/results``; ``tests/test_explainer.py`` rebuilds it from those files and checks that the
two agree, so the page cannot quote numbers the result files do not hold. Regenerate after rerunning the tools::

    python -m linattn.explainer.measured benchmarks/results
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
MQAR_FILE = "mqar_cpu_4000steps_seeds.json"
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
    mqar_rows = [
        {"mixer": m["mixer"], "state_floats": m["state_floats"], "seeds": len(m["seeds"]),
         "acc_all@8": m["metrics"]["acc_all@8"]["mean"], "acc_all@12": m["metrics"]["acc_all@12"]["mean"]}
        for m in mqar["mixers"]
    ]
    return {
        "mqar_file": f"benchmarks/results/{MQAR_FILE}",
        "mqar_config": {k: mqar["config"][k] for k in ("seq_len", "train_pairs", "steps", "num_layers", "head_dim")},
        "mqar": mqar_rows,
        "recall_file": f"benchmarks/results/{RECALL_FILE}",
        "recall_config": {k: recall["config"][k] for k in ("d", "trials")},
        "recall_distance": distance,
        "recall_capacity": capacity,
        "stability_files": [f"benchmarks/results/{STABILITY_FILE}", f"benchmarks/results/{STABILITY_RECURRENT_FILE}"],
        "stability": lengths(STABILITY_FILE, "chunk") + lengths(STABILITY_RECURRENT_FILE, "recurrent"),
    }


def load_measured() -> dict[str, Any]:
    """The shipped summary (``linattn/explainer/measured.json``)."""
    return json.loads(resources.files("linattn.explainer").joinpath("measured.json").read_text(encoding="utf-8"))


if __name__ == "__main__":
    out = Path(__file__).with_name("measured.json")
    out.write_text(json.dumps(summarize(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"), indent=1) + "\n")
    print(f"wrote {out}")
