"""Runs a `SweepConfig` over worker processes and keeps its result file current.

The result file is rewritten (atomically) after every finished run, so at any moment it holds every finished run
and is a valid ``mqar_sweep`` document. Starting again with the same configuration and the same ``output``
resumes: finished runs are kept and skipped, everything else is run. A file of another configuration is refused
unless ``overwrite`` is given; then the runs the new configuration would repeat unchanged (same
`run_inputs`) carry over and the rest are dropped. A run killed half way is lost
and run again from scratch (runs are minutes).
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

import linattn
from linattn.tools.harness import machine
from linattn.tools.harness.results import read_result, write_result
from linattn.tools.mqar import sweep
from linattn.tools.mqar.sweep import Job, SweepConfig

SCHEMA = "linattn.mqar_sweep/1"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def config_doc(cfg: SweepConfig) -> dict[str, Any]:
    """The part of the file that must match for a resume: the sweep and the stopping and plateau rules."""
    return {**cfg.as_json(), "solved": sweep.SOLVED, "min_gain": sweep.MIN_GAIN,
            "plateau_factor": sweep.PLATEAU_FACTOR, "chance": "1/num_pairs", "selection": "validation accuracy"}


def previous_runs(cfg: SweepConfig, output: Path | None, *, overwrite: bool) -> tuple[list, dict[str, Any] | None]:
    """(finished runs, the existing document) to resume from ``output``; ([], None) when there is none. Raises
    ValueError when the file is not a sweep result or of another configuration, unless ``overwrite``: then
    another configuration's runs carry over where `carried_over` says so."""
    if output is None or not os.path.lexists(output):
        return [], None
    try:
        doc = read_result(output, "mqar_sweep")
    except ValueError as exc:
        if overwrite:
            return [], None
        raise ValueError(f"output: {output} exists and is not a sweep result to resume ({exc}); "
                         "pass --overwrite to replace it") from None
    want = config_doc(cfg)
    diff = sorted(k for k in want.keys() | doc["config"].keys() if want.get(k) != doc["config"].get(k))
    if not diff:
        return list(doc["runs"]), doc
    if not overwrite:
        raise ValueError(f"output: {output} holds a sweep of another configuration (differs in {', '.join(diff)}); "
                         "resuming needs the same command; pass --overwrite to replace it, keeping the runs this "
                         "configuration would repeat unchanged")
    return carried_over(cfg, doc), doc


def carried_over(cfg: SweepConfig, doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of ``doc`` (a sweep of another configuration) that ``cfg`` would repeat unchanged: the job is one
    of ``cfg``'s and `run_inputs` agree (none when the stopping or plateau rules
    differ)."""
    stored = dict(doc["config"])
    rules = {k: stored.pop(k, None) for k in ("solved", "min_gain", "plateau_factor", "chance", "selection")}
    if any(rules[k] != v for k, v in config_doc(cfg).items() if k in rules):
        return []
    try:
        old = SweepConfig.from_json(stored)
    except (TypeError, ValueError):
        return []  # a config this code cannot read decides nothing here
    jobs = {Job(*j.group, j.lr, s, ext) for j in sweep.lr_jobs(cfg) for s in cfg.seeds
            for ext in ((False, True) if cfg.plateau_steps else (False,))}
    return [r for r in doc["runs"]
            if Job.of(r) in jobs and sweep.run_inputs(old, Job.of(r)) == sweep.run_inputs(cfg, Job.of(r))]


def session_doc(workers: int) -> dict[str, Any]:
    return {"started": _now(), "updated": _now(), "workers": workers, "runs_finished": 0,
            "machine": {"cpu": machine.processor_name(), "cores": os.cpu_count(), "platform": platform.platform(),
                        "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "numpy": np.__version__, "linattn": linattn.__version__}}


def build_doc(cfg: SweepConfig, runs: list, sessions: list, created: str) -> dict[str, Any]:
    best = sweep.select_best(cfg, runs)
    total = sweep.total_runs(cfg, runs)
    return {"schema": SCHEMA, "created": created, "updated": _now(), "config": config_doc(cfg),
            "machine": sessions[-1]["machine"], "versions": sessions[-1]["versions"], "sessions": sessions,
            "progress": {"finished": len(runs), "total": total,
                         "complete": len(runs) == total and all(b["complete"] for b in best)},
            "runs": runs, "best": best}


class _Inline:
    """An executor that runs each job on submit, in this process (one worker: no process start-up)."""

    def submit(self, fn: Callable, *args: Any) -> Future:
        fut: Future = Future()
        fut.set_result(fn(*args))
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def _init_worker() -> None:
    torch.set_num_threads(1)


def _describe(run: dict[str, Any]) -> str:
    return (f"{run['mixer']} d{run['d_model']} T{run['seq_len']}/{run['num_pairs']} lr {run['lr']:g} "
            f"seed {run['seed']}{' (plateau extension)' if run.get('extended') else ''}")


def run_sweep(cfg: SweepConfig, *, output: str | os.PathLike | None, workers: int = 1, overwrite: bool = False,
              progress: bool = True, stop_after: int | None = None) -> dict[str, Any]:
    """Run every unfinished run of ``cfg`` on ``workers`` processes (torch threads 1 each), writing ``output``
    after each; returns the document. ``stop_after`` ends the session after that many runs (a simulated kill)."""
    output = None if output is None else Path(output)
    runs, old = previous_runs(cfg, output, overwrite=overwrite)
    if old is not None and old["config"] != config_doc(cfg):
        tqdm.write(f"output: {output} held {len(old['runs'])} runs of another configuration; {len(runs)} carry over "
                   "unchanged, the rest are run again")
    sessions = (old["sessions"] if old else []) + [session_doc(workers)]
    created = old["created"] if old else _now()
    if output is not None:  # the file exists from the start; refuses a file that appeared unless resuming
        write_result(build_doc(cfg, runs, sessions, created), output, "mqar_sweep", overwrite=overwrite or bool(old))
    done = {Job.of(r) for r in runs}
    queued: set[Job] = set(done)
    pending: deque[Job] = deque()

    def enqueue(jobs: list[Job], front: bool) -> None:
        for job in reversed(jobs) if front else jobs:
            if job not in queued:
                queued.add(job)
                pending.appendleft(job) if front else pending.append(job)

    enqueue(sweep.lr_jobs(cfg), front=False)
    enqueue(sweep.seed_jobs(cfg, sweep.select_best(cfg, runs)), front=True)  # seeds of finished groups first
    threads_before = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread per run, in this process too when it trains inline
    ex: Any = _Inline() if workers == 1 else ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker)
    bar = tqdm(total=sweep.total_runs(cfg, runs), initial=len(runs), desc="mqar sweep", unit="run",
               disable=not progress, dynamic_ncols=True)
    in_flight: dict[Future, Job] = {}
    new = 0
    doc = build_doc(cfg, runs, sessions, created)
    try:
        while pending or in_flight:
            while pending and len(in_flight) < workers and (stop_after is None or new + len(in_flight) < stop_after):
                job = pending.popleft()
                in_flight[ex.submit(sweep.train_run, cfg, job)] = job
            if not in_flight:
                break
            finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for fut in finished:
                in_flight.pop(fut)
                rec = {**fut.result(), "session": len(sessions) - 1}
                runs.append(rec)
                new += 1
                sessions[-1].update(updated=_now(), runs_finished=new)
                doc = build_doc(cfg, runs, sessions, created)
                if output is not None:
                    write_result(doc, output, "mqar_sweep", overwrite=True)
                enqueue(sweep.seed_jobs(cfg, doc["best"]), front=True)
                bar.total = doc["progress"]["total"]  # grows when a group needs the plateau extension
                bar.update(1)
                _report(bar, rec, doc["best"], f"{len(runs)}/{doc['progress']['total']}")
    finally:
        ex.shutdown(wait=True, cancel_futures=True)
        bar.close()
        torch.set_num_threads(threads_before)
    return doc


def _report(bar: tqdm, rec: dict[str, Any], best: list[dict[str, Any]], count: str) -> None:
    """One log line per run; the bar shows the best finished group of the run's setting and width."""
    line = (f"{_describe(rec)}: test {100 * rec['test_accuracy']:.1f}% val {100 * rec['val_accuracy']:.1f}% "
            f"({rec['stop_reason']} at {rec['steps']}, {rec['wall_s']:.0f} s"
            f"{'' if rec['left_plateau'] else ', on the plateau'})")
    same = [b for b in best if (b["d_model"], b["seq_len"], b["num_pairs"])
            == (rec["d_model"], rec["seq_len"], rec["num_pairs"])]
    if same:
        top = max(same, key=lambda b: b["test_mean"])
        now = (f"best d{top['d_model']} T{top['seq_len']}/{top['num_pairs']}: {top['mixer']} "
               f"{100 * top['test_mean']:.0f}%")
        bar.set_postfix_str(now)
        line += f"; {now}"
    # one line per run also without the bar (a log file), stamped and counted
    tqdm.write(f"[{time.strftime('%H:%M:%S')} {count}] {line}")
