"""MQAR as zoology measures it: every (mixer, model width, sequence length, pairs) trained at several learning
rates with a held-out validation set and early stopping; the best learning rate is chosen on validation accuracy,
reported on a separate test set, and rerun with more seeds.

One training run (`train_run`) is a pure function of its `Job` and the `SweepConfig` (weights
from the seed, each step's batch from (seed, step), one torch thread), so a run lost to a kill is simply run again.

Stopping, checked every ``eval_every`` steps on the validation set:

* ``solved``: validation accuracy reached `SOLVED` (0.99).
* ``no_improvement``: the best validation accuracy did not rise by `MIN_GAIN` for ``patience`` evaluations;
  only once the run has left the plateau -- a run still on it trains on, since MQAR's plateaus end suddenly.
* ``steps``: the step limit of its setting.
* ``diverged``: a non-finite training loss.

The plateau extension (``plateau_steps``): a group none of whose learning-rate runs left the plateau is trained
again at every learning rate, seed 0, with ``plateau_steps`` steps (``extended`` runs); its best learning rate is
then chosen among both stages, and the seeds run at the winner's. Zoology trains to convergence; this spends the
longer budget only where the short one decided nothing.

The plateau rule (`left_plateau`): a run has left MQAR's plateau when its best validation accuracy is at
least twice chance, where chance is ``1 / num_pairs`` (a model that only knows the answer is one of the values
written in the sequence). Test accuracy is measured with the weights of the best validation evaluation.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from linattn.tools.mqar.data import IGNORE, Batch, generate
from linattn.tools.mqar.train import (
    MIXER_SPECS,
    TrainConfig,
    build_model,
    finite_weights,
    lr_at,
    model_inputs,
    state_floats,
    step_loss,
    train_batch,
)

SOLVED = 0.99
MIN_GAIN = 0.01
PLATEAU_FACTOR = 2.0
STOP_REASONS = ("solved", "no_improvement", "steps", "diverged")
_VAL_STREAM, _TEST_STREAM = 7_001, 7_002  # data seeds of the held-out sets: the same for every run of a setting


@dataclass(frozen=True)
class SweepConfig:
    """Everything that decides the sweep's results; two runs of one config give the same ``runs`` (one thread).

    ``settings``: (seq_len, num_pairs, max steps, batch size). ``lrs``: the learning rates tried with seed 0;
    ``seeds``: all seeds run at the winning learning rate (the first is the sweep's). Width ``d`` is
    ``num_heads`` heads of ``d / num_heads``. ``intermediate_size`` 0: blocks without an MLP, as zoology's MQAR
    models. Linear mixers keep their short convolution; ``attention_conv_size`` gives attention layers the same
    one (zoology's current MQAR models put a short convolution before every mixer, attention included), and
    ``attention_positions`` adds learned absolute positions to pure-attention models (zoology's first paper).
    ``mixed_in`` (seq_len, num_pairs, batch size): a short setting whose batches take every other training step
    (the even ones) of every setting with longer sequences, as zoology trains on a mixture led by short
    sequences; without it attention stays at chance at length 256 within 1,000 steps. () for none.
    ``plateau_steps``: the step limit of the plateau extension (module docstring); 0 for none."""

    mixers: tuple[str, ...]
    widths: tuple[int, ...]
    settings: tuple[tuple[int, int, int, int], ...]
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]
    vocab_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    val_examples: int
    test_examples: int
    evals_per_run: int
    patience: int
    quick: bool = False
    attention_positions: bool = False
    attention_conv_size: int = 0
    mixed_in: tuple[int, ...] = ()
    plateau_steps: int = 0

    def __post_init__(self) -> None:
        bad = [m for m in self.mixers if m not in MIXER_SPECS]
        if bad or not self.mixers:
            raise ValueError(f"mixers: unknown {', '.join(bad) or '(none given)'}; expected some of "
                             f"{', '.join(MIXER_SPECS)}")
        if any(w % self.num_heads or w < self.num_heads * 2 for w in self.widths) or not self.widths:
            raise ValueError(f"widths: each must be a multiple of num_heads ({self.num_heads}) with head width >= 2, "
                             f"got {self.widths}")
        for T, P, steps, _ in self.settings:
            generate(1, vocab_size=self.vocab_size, seq_len=T, num_pairs=P, seed=0)  # raises naming the problem
            if steps < self.evals_per_run:
                raise ValueError(f"settings: {steps} steps at (T={T}, pairs={P}) is fewer than evals_per_run")
        if self.mixed_in:
            if len(self.mixed_in) != 3 or min(self.mixed_in) < 1:
                raise ValueError(f"mixed_in: expected (seq_len, num_pairs, batch_size), got {self.mixed_in}")
            generate(1, vocab_size=self.vocab_size, seq_len=self.mixed_in[0], num_pairs=self.mixed_in[1], seed=0)
        if self.plateau_steps and self.plateau_steps < self.evals_per_run:
            raise ValueError(f"plateau_steps: {self.plateau_steps} is fewer than evals_per_run")
        if not self.lrs or min(self.lrs) <= 0:
            raise ValueError(f"lrs: expected positive learning rates, got {self.lrs}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: expected distinct seeds, got {self.seeds}")

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: ([list(x) for x in v] if k == "settings" else list(v) if isinstance(v, tuple) else v)
                for k, v in d.items()}

    @staticmethod
    def from_json(d: dict[str, Any]) -> SweepConfig:
        """The config of `as_json`; a file written before a field existed gets the value it ran with."""
        old = {"attention_positions": True} if "attention_conv_size" not in d else {}
        return SweepConfig(**(old | {k: (tuple(tuple(x) for x in v) if k == "settings" else tuple(v)
                                         if isinstance(v, list) else v) for k, v in d.items()}))


def log_lrs(lo: float, hi: float, n: int) -> tuple[float, ...]:
    """``n`` log-spaced learning rates from ``lo`` to ``hi``, rounded to 3 significant digits (zoology spaces
    its sweep as ``np.logspace(-4, -2, 4)``)."""
    return tuple(float(f"{x:.3g}") for x in np.logspace(math.log10(lo), math.log10(hi), n))


FULL = SweepConfig(
    mixers=tuple(MIXER_SPECS), widths=(64, 128),
    settings=((64, 4, 1000, 32), (64, 8, 1000, 16), (256, 16, 1000, 8), (256, 32, 1000, 8)),
    lrs=log_lrs(1e-3, 10**-1.5, 4), seeds=(0, 1, 2), vocab_size=80, num_layers=2, num_heads=2,
    intermediate_size=0, val_examples=128, test_examples=512, evals_per_run=25, patience=5,
    attention_conv_size=4, mixed_in=(64, 4, 32), plateau_steps=3000)
QUICK = SweepConfig(
    mixers=tuple(MIXER_SPECS), widths=(16, 32), settings=((48, 4, 40, 8),), lrs=(3e-3, 1e-2), seeds=(0, 1),
    vocab_size=32, num_layers=2, num_heads=2, intermediate_size=0, val_examples=32, test_examples=64,
    evals_per_run=4, patience=2, quick=True, attention_conv_size=4, mixed_in=(32, 4, 16))


@dataclass(frozen=True)
class Job:
    """One training run."""

    mixer: str
    d_model: int
    seq_len: int
    num_pairs: int
    lr: float
    seed: int
    extended: bool = False  # trained with the plateau extension's step limit

    @property
    def group(self) -> tuple[str, int, int, int]:
        """(mixer, d_model, seq_len, num_pairs): the runs among which the best learning rate is chosen."""
        return (self.mixer, self.d_model, self.seq_len, self.num_pairs)

    @staticmethod
    def of(run: dict[str, Any]) -> Job:
        return Job(run["mixer"], run["d_model"], run["seq_len"], run["num_pairs"], run["lr"], run["seed"],
                   run.get("extended", False))


def lr_jobs(cfg: SweepConfig) -> list[Job]:
    """The learning-rate runs (first seed), cheapest settings first so that a partial sweep holds whole groups."""
    return [Job(m, d, T, P, lr, cfg.seeds[0]) for T, P, _, _ in cfg.settings for d in cfg.widths for m in cfg.mixers
            for lr in cfg.lrs]


def steps_and_batch(cfg: SweepConfig, seq_len: int, num_pairs: int) -> tuple[int, int]:
    return next((s, b) for T, P, s, b in cfg.settings if (T, P) == (seq_len, num_pairs))


def chance(num_pairs: int) -> float:
    return 1.0 / num_pairs


def left_plateau(val_accuracy: float, num_pairs: int) -> bool:
    """The plateau rule: validation accuracy at least `PLATEAU_FACTOR` times chance (1 / pairs)."""
    return val_accuracy >= PLATEAU_FACTOR * chance(num_pairs)


@dataclass
class EarlyStop:
    """The stopping rule, fed one validation accuracy per evaluation: `update` returns ``"solved"``,
    ``"no_improvement"`` or None (train on)."""

    patience: int
    num_pairs: int
    best: float = -1.0
    ref: float = -1.0  # the accuracy of the last real gain (at least MIN_GAIN)
    since_gain: int = 0

    def update(self, val_accuracy: float) -> str | None:
        self.best = max(self.best, val_accuracy)
        if val_accuracy >= self.ref + MIN_GAIN:
            self.ref, self.since_gain = val_accuracy, 0
        else:
            self.since_gain += 1
        if val_accuracy >= SOLVED:
            return "solved"
        if self.since_gain >= self.patience and left_plateau(self.best, self.num_pairs):
            return "no_improvement"  # a run still on the plateau trains on: its plateau may end suddenly
        return None


def held_out(cfg: SweepConfig, seq_len: int, num_pairs: int, which: str) -> Batch:
    """The validation or test set of a setting: fixed data, disjoint from every training batch's seed stream."""
    stream = {"val": _VAL_STREAM, "test": _TEST_STREAM}[which]
    n = cfg.val_examples if which == "val" else cfg.test_examples
    seed = int(np.random.SeedSequence([stream, seq_len, num_pairs]).generate_state(1)[0])
    return generate(n, vocab_size=cfg.vocab_size, seq_len=seq_len, num_pairs=num_pairs, seed=seed)


@torch.no_grad()
def score(model: torch.nn.Module, batch: Batch, chunk: int = 64) -> tuple[float, float]:
    """(mean cross-entropy, exact-match accuracy) over the query positions of ``batch``."""
    total, hits, count = 0.0, 0, 0
    for i in range(0, batch.inputs.shape[0], chunk):
        try:
            logits, _ = model(torch.from_numpy(batch.inputs[i:i + chunk]))
        except ValueError:  # a diverged run's gated layers refuse the NaN gates its weights make: it recalls nothing
            if finite_weights(model):
                raise
            return math.nan, 0.0
        t = torch.from_numpy(batch.targets[i:i + chunk])
        mask = t != IGNORE
        sel = logits[mask].double()
        total += torch.nn.functional.cross_entropy(sel, t[mask], reduction="sum").item()
        hits += int((sel.argmax(-1) == t[mask]).sum())
        count += int(mask.sum())
    return total / count, hits / count


def train_config(cfg: SweepConfig, job: Job) -> TrainConfig:
    steps, batch = steps_and_batch(cfg, job.seq_len, job.num_pairs)
    steps = cfg.plateau_steps if job.extended else steps
    return TrainConfig(vocab_size=cfg.vocab_size, seq_len=job.seq_len, train_pairs=(job.num_pairs,),
                       hidden_size=job.d_model, num_layers=cfg.num_layers, num_heads=cfg.num_heads,
                       head_dim=job.d_model // cfg.num_heads, intermediate_size=cfg.intermediate_size,
                       attention_positions=cfg.attention_positions, attention_conv_size=cfg.attention_conv_size,
                       batch_size=batch, steps=steps, lr=job.lr, seed=job.seed)


def mixed_config(cfg: SweepConfig, tc: TrainConfig) -> TrainConfig | None:
    """The training config of the mixed-in batches of a run (``cfg.mixed_in``), or None: no mixture, or the run's
    sequences are no longer than the mixed-in ones."""
    if not cfg.mixed_in or tc.seq_len <= cfg.mixed_in[0]:
        return None
    T, P, batch = cfg.mixed_in
    return dataclasses.replace(tc, seq_len=T, train_pairs=(P,), batch_size=batch)


def run_inputs(cfg: SweepConfig, job: Job) -> dict[str, Any]:
    """Everything that decides the record of ``job`` under ``cfg`` (with the code): two configs that give a job the
    same inputs give it the same run, so a sweep of a changed config carries that run over."""
    tc = train_config(cfg, job)
    mixed = mixed_config(cfg, tc)
    return {"train": model_inputs(job.mixer, tc), "mixed": None if mixed is None else model_inputs(job.mixer, mixed),
            "held_out": (cfg.vocab_size, cfg.val_examples, cfg.test_examples), "evals": cfg.evals_per_run,
            "patience": cfg.patience, "rules": (SOLVED, MIN_GAIN, PLATEAU_FACTOR)}


def train_run(cfg: SweepConfig, job: Job) -> dict[str, Any]:
    """Train one model with early stopping; returns its ``runs`` record (schema ``mqar_sweep``)."""
    torch.set_num_threads(1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    tc = train_config(cfg, job)
    model = build_model(job.mixer, tc)
    opt = torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=tc.weight_decay, betas=(0.9, 0.98))
    val = held_out(cfg, job.seq_len, job.num_pairs, "val")
    every = max(1, tc.steps // cfg.evals_per_run)
    best = {"acc": -1.0, "loss": math.inf, "step": 0, "state": None}
    stopper, reason, step, losses, curve = EarlyStop(cfg.patience, job.num_pairs), "steps", 0, [], []
    model.train()
    mixed = mixed_config(cfg, tc)
    while step < tc.steps:
        batch = train_batch(tc if mixed is None or step % 2 else mixed, step)
        for group in opt.param_groups:
            group["lr"] = lr_at(tc, step)
        got = step_loss(model, batch.inputs, batch.targets)
        if got is None:  # a non-finite loss, or weights gone non-finite (the forward refused their NaN gate)
            reason = "diverged"
            break
        loss = got[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(loss.item())
        if step % every and step != tc.steps:
            continue
        model.eval()
        v_loss, v_acc = score(model, val)
        model.train()
        curve.append([step, round(float(np.mean(losses[-every:])), 5), round(v_loss, 5), round(v_acc, 5)])
        if v_acc > best["acc"]:
            best.update(acc=v_acc, loss=v_loss, step=step, state=copy.deepcopy(model.state_dict()))
        stop = stopper.update(v_acc)
        if stop is not None:
            reason = stop
            break
    if best["state"] is not None:
        model.load_state_dict(best["state"])
    model.eval()
    val_loss, val_acc = (best["loss"], best["acc"]) if best["state"] is not None else score(model, val)
    test_loss, test_acc = score(model, held_out(cfg, job.seq_len, job.num_pairs, "test"))
    final = float(np.mean(losses[-every:])) if losses else None
    return {**asdict(job), "max_steps": tc.steps, "steps": step, "best_step": best["step"], "stop_reason": reason,
            "wall_s": round(time.perf_counter() - wall0, 2), "cpu_s": round(time.process_time() - cpu0, 2),
            "final_loss": None if final is None or not math.isfinite(final) else round(final, 5),
            "val_loss": round(val_loss, 5) if math.isfinite(val_loss) else None, "val_accuracy": round(val_acc, 5),
            "test_loss": round(test_loss, 5) if math.isfinite(test_loss) else None,
            "test_accuracy": round(test_acc, 5), "left_plateau": left_plateau(val_acc, job.num_pairs),
            "params": sum(p.numel() for p in model.parameters()), "state_floats": state_floats(model),
            "curve": curve}


def _rank(run: dict[str, Any]) -> tuple:
    """Runs off the plateau first, then higher validation accuracy, then lower validation loss, then lower lr."""
    loss = run["val_loss"] if run["val_loss"] is not None else math.inf
    return (not run["left_plateau"], -run["val_accuracy"], loss, run["lr"])


def select_best(cfg: SweepConfig, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``best`` entry per group whose learning-rate runs are all finished: the winning lr (chosen on validation
    accuracy among the runs that left the plateau; if none did, the entry says ``plateau: true``), its test
    accuracy, and the test accuracy over the seeds finished at that lr (mean, min, max). A group that needs the
    plateau extension says ``extension: "pending"`` until those runs are in; then the winner is chosen among both
    stages (``extended``: it comes from the longer one)."""
    by_job = {Job.of(r): r for r in runs}
    out = []
    for job in lr_jobs(cfg):
        if job.lr != cfg.lrs[0]:
            continue
        tried = [by_job.get(Job(*job.group, lr, cfg.seeds[0])) for lr in cfg.lrs]
        if any(r is None for r in tried):
            continue
        extension, longer = "none", []
        if cfg.plateau_steps and not any(r["left_plateau"] for r in tried):
            longer = [by_job.get(j) for j in extension_jobs(cfg, job.group)]
            extension = "pending" if any(r is None for r in longer) else "done"
        win = min(tried + (longer if extension == "done" else []), key=_rank)
        ext = win.get("extended", False)
        seeded = [by_job[j] for j in (Job(*job.group, win["lr"], s, ext) for s in cfg.seeds) if j in by_job]
        accs = [r["test_accuracy"] for r in seeded]
        out.append({"mixer": job.mixer, "d_model": job.d_model, "seq_len": job.seq_len,
                    "num_pairs": job.num_pairs, "lr": win["lr"], "val_accuracy": win["val_accuracy"],
                    "test_accuracy": win["test_accuracy"], "stop_reason": win["stop_reason"],
                    "plateau": not win["left_plateau"], "state_floats": win["state_floats"],
                    "lr_accuracy": {f"{r['lr']:g}": r["val_accuracy"] for r in tried},
                    "extension": extension, "extended": ext,
                    "extended_lr_accuracy": {f"{r['lr']:g}": r["val_accuracy"] for r in longer if r is not None},
                    "seeds": [r["seed"] for r in seeded], "seeds_plateau": sum(not r["left_plateau"] for r in seeded),
                    "test_mean": round(float(np.mean(accs)), 5), "test_min": min(accs), "test_max": max(accs),
                    "complete": len(seeded) == len(cfg.seeds) and extension != "pending"})
    return out


def extension_jobs(cfg: SweepConfig, group: tuple[str, int, int, int]) -> list[Job]:
    """The plateau extension of ``group``: every learning rate, the first seed, ``plateau_steps`` steps."""
    return [Job(*group, lr, cfg.seeds[0], True) for lr in cfg.lrs]


def seed_jobs(cfg: SweepConfig, best: list[dict[str, Any]]) -> list[Job]:
    """The jobs a finished group still wants: its plateau extension while pending, else the further seeds at its
    winning learning rate (and stage)."""
    out = []
    for b in best:
        group = (b["mixer"], b["d_model"], b["seq_len"], b["num_pairs"])
        if b.get("extension") == "pending":
            out += extension_jobs(cfg, group)
        else:
            out += [Job(*group, b["lr"], s, b.get("extended", False)) for s in cfg.seeds[1:]]
    return out


def total_runs(cfg: SweepConfig, runs: list[dict[str, Any]] = ()) -> int:
    """Runs the sweep holds when complete, as far as ``runs`` tell: every finished run, every learning-rate run,
    and per group its wanted jobs (`seed_jobs`; seeds assumed for groups not finished yet, and the seeds
    after a pending extension)."""
    best = select_best(cfg, list(runs))
    wanted = {Job.of(r) for r in runs} | set(lr_jobs(cfg)) | set(seed_jobs(cfg, best))
    unknown = len(lr_jobs(cfg)) // len(cfg.lrs) - len(best) + sum(b.get("extension") == "pending" for b in best)
    return len(wanted) + unknown * (len(cfg.seeds) - 1)
