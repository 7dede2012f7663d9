"""One ``linattn mqar`` run: train and evaluate every mixer (`train`, the controls of
`controls`), then time the decode latency of every mixer side by side; or only the latency
pass, for the checkpoints of an earlier result. Returns the result document (schema ``mqar``)."""

from __future__ import annotations

import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import linattn
from linattn.nn import KVCache
from linattn.tools.harness import machine
from linattn.tools.harness.timer import time_turns
from linattn.tools.mqar.controls import control_pairs, controls
from linattn.tools.mqar.train import TrainConfig, build_model, config_dict, evaluate, load_weights, state_floats, train

SCHEMA = "linattn.mqar/2"
QUICK = {"vocab_size": 32, "seq_len": 32, "train_pairs": (2, 4), "steps": 120, "batch_size": 32,
         "eval_pairs": (2, 4, 8), "eval_examples": 64, "histories": (512, 2048), "latency_repeats": 3}
FULL = {"vocab_size": 48, "seq_len": 48, "train_pairs": (2, 4, 8), "steps": 4000, "batch_size": 32,
        "eval_pairs": (2, 4, 8, 12), "eval_examples": 256, "histories": (2048, 8192, 32768), "latency_repeats": 7}


def _short_long(rows: list[dict[str, Any]], n: int) -> tuple[float | None, float | None]:
    pick = {r["distance"]: r["accuracy"] for r in rows if r["num_pairs"] == n}
    return pick.get("short"), pick.get("long")


@torch.no_grad()
def decode_latency(models: dict[str, Any], histories: tuple[int, ...], *, repeats: int, calls: int = 5,
                   progress: bool = True) -> list[dict[str, Any]]:
    """Median milliseconds per decoded token (batch 1) for every (mixer, history), interleaved so that every
    mixer sees the same machine load (the harness timer's `time_turns`); each timed call is ``calls`` steps
    from the same cache (the history stays L)."""
    caches = {}
    for name, model in models.items():
        _, base = model(torch.ones(1, 8, dtype=torch.int64))
        for L in histories:
            layer_caches = []
            for block, c in zip(model.layers, base, strict=True):
                if isinstance(c, KVCache):
                    m = block.mixer
                    gen = torch.Generator().manual_seed(L)
                    c = KVCache(torch.randn(1, L, m.num_heads, m.head_dim, generator=gen),
                                torch.randn(1, L, m.num_heads, m.head_dim, generator=gen))
                layer_caches.append(c)
            caches[(name, L)] = layer_caches
    token = torch.ones(1, 1, dtype=torch.int64)
    keys = list(caches)

    def steps(key: tuple[str, int]):
        model, cache = models[key[0]], caches[key]

        def call() -> None:
            for _ in range(calls):
                model(token, cache)

        return call

    bar = tqdm(total=repeats, desc="decode latency", disable=not progress, unit="round")
    seen = [0]

    def tick(j: int, _out: Any) -> None:  # one untimed call per key first, then one tick per round of turns
        seen[0] += 1
        if seen[0] > len(keys) and j == len(keys) - 1:
            bar.update(1)

    try:
        timings = time_turns([steps(k) for k in keys], repeats=repeats, warmup=1, observe=tick)
    finally:
        bar.close()
    rows = []
    for (name, L), t in zip(keys, timings, strict=True):
        model = models[name]
        kv_bytes = sum(c.k.numel() + c.v.numel() for c in caches[(name, L)] if isinstance(c, KVCache)) * 4
        rows.append({"mixer": name, "history": L, "ms_per_token": round(t.median_s / calls * 1e3, 4),
                     "ms_min": round(t.min_s / calls * 1e3, 4), "kv_cache_bytes": kv_bytes,
                     "state_bytes": state_floats(model) * 4})
    return rows


def summary_table(records: list[dict[str, Any]], latency: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """One row per mixer: accuracy at ``n`` pairs (short, long, all distances) next to its decode latency."""
    table = []
    for rec in records:
        short, long = _short_long(rec["eval"], n)
        table.append({"mixer": rec["mixer"], "num_pairs": n, "acc_short": short, "acc_long": long,
                      "acc_all": next(r["accuracy"] for r in rec["eval"] if r["num_pairs"] == n
                                      and r["distance"] == "all"),
                      "ms_per_token": {str(r["history"]): r["ms_per_token"] for r in latency
                                       if r["mixer"] == rec["mixer"]}})
    return table


def latency_only(doc: dict[str, Any], source: str, checkpoint_dir: Path, *, histories: tuple[int, ...] | None,
                 repeats: int | None, threads: int, progress: bool = True) -> dict[str, Any]:
    """Only the decode-latency pass, for the trained checkpoints of a result ``doc`` (read from ``source``):
    every model is rebuilt from ``checkpoint_dir/<mixer>.safetensors`` (refused unless it has the result's
    configuration and the steps the result records), timed, and the latency and table of a copy of ``doc``
    replaced. The evaluations are carried over unchanged."""
    torch.set_num_threads(threads)
    c = doc["config"]
    cfg = TrainConfig(**{k: (tuple(c[k]) if k == "train_pairs" else c[k]) for k in config_dict(TrainConfig())})
    models = {}
    for rec in doc["models"]:
        path = Path(checkpoint_dir) / f"{rec['mixer']}.safetensors"
        if not path.is_file():
            raise ValueError(f"checkpoint-dir: no checkpoint {path} for mixer {rec['mixer']}")
        model = build_model(rec["mixer"], cfg)
        step = load_weights(path, model, rec["mixer"], cfg)
        if step != rec["steps_done"]:
            raise ValueError(f"checkpoint-dir: {path} is at step {step}, the result records {rec['steps_done']}")
        models[rec["mixer"]] = model.eval()
    hs = tuple(histories or c["histories"] or FULL["histories"])
    reps = repeats or c.get("latency_repeats") or FULL["latency_repeats"]
    before = os.getloadavg()
    latency = decode_latency(models, hs, repeats=reps, progress=progress)
    out = {**doc, "config": {**c, "histories": list(hs), "latency_repeats": reps}, "latency": latency,
           "table": summary_table(doc["models"], latency, doc["table"][0]["num_pairs"] if doc["table"]
                                  else max(cfg.train_pairs)),
           "latency_pass": {"created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "source": source,
                            "loadavg_before": list(before), "loadavg_after": list(os.getloadavg())}}
    out["environment"] = {**doc["environment"], "torch_threads": torch.get_num_threads()}
    return out


def run(mixers: tuple[str, ...], cfg: TrainConfig, *, eval_pairs: tuple[int, ...], eval_examples: int,
        histories: tuple[int, ...], latency_repeats: int, budget_s: float | None, checkpoint_dir: Path | None,
        resume: bool, threads: int, with_controls: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train, evaluate and time every mixer; returns the result document (schema ``mqar``)."""
    torch.set_num_threads(threads)
    start = time.perf_counter()
    load_before = os.getloadavg()
    models, records = {}, []
    for mixer in mixers:
        ckpt = None if checkpoint_dir is None else Path(checkpoint_dir) / f"{mixer}.safetensors"
        model, info = train(mixer, cfg, checkpoint=ckpt, resume=resume, budget_s=budget_s, progress=progress)
        rows = evaluate(model, cfg, pairs=eval_pairs, examples=eval_examples)
        log = info.pop("log")
        stride = max(1, len(log) // 100)
        rec = {"mixer": mixer, "layers": list(model.mixers), "params": sum(p.numel() for p in model.parameters()),
               "state_floats": state_floats(model), **info, "final_loss": log[-1][1] if log else None,
               "loss_curve": log[::stride], "eval": rows,
               "controls": controls(model, cfg, n=control_pairs(cfg), examples=eval_examples)
               if with_controls else None}
        records.append(rec)
        models[mixer] = model
        if progress:
            acc = ", ".join(f"{r['num_pairs']}:{100 * r['accuracy']:.0f}%" for r in rows if r["distance"] == "all")
            tqdm.write(f"{mixer}: {info['steps_done']} steps ({info['stop_reason']}), accuracy by pairs {acc}")
    load_mid = os.getloadavg()
    latency = decode_latency(models, histories, repeats=latency_repeats, progress=progress) if histories else []
    table = summary_table(records, latency, max(cfg.train_pairs))
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {**config_dict(cfg), "mixers": list(mixers), "eval_pairs": list(eval_pairs),
                   "eval_examples": eval_examples, "histories": list(histories),
                   "latency_repeats": latency_repeats, "budget_s": budget_s, "resume": resume,
                   "short_distance": f"<= {cfg.seq_len // 4}", "long_distance": f"> {cfg.seq_len // 2}",
                   "chance": "1/num_pairs if the model only knows that the answer is one of the stored values"},
        "environment": {"cpu": machine.processor_name(), "cores": os.cpu_count(),
                        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                        "linattn": linattn.__version__, "python": platform.python_version(),
                        "loadavg_before": list(load_before), "loadavg_before_latency": list(load_mid),
                        "loadavg_after": list(os.getloadavg())},
        "models": records,
        "latency": latency,
        "table": table,
        "elapsed_s": round(time.perf_counter() - start, 2),
    }
