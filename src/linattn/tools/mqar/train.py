"""MQAR training and evaluation of the small LM of `linattn.nn`, one model per mixer.

Deterministic: the weights come from ``torch.manual_seed(seed)``, each step's batch from ``(seed, step)`` alone,
the learning rate from the step alone, and there is no dropout; with a fixed thread count a run stopped at any
step and resumed from its safetensors checkpoint ends with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from linattn.nn import CausalLM
from linattn.tools.harness.results import atomic_write
from linattn.tools.mqar.data import IGNORE, generate

# name -> (per-layer mixers as a function of num_layers, LinearAttention kwargs, q/k head_dim override).
# Equal state size: every linear mixer holds H x head_dim x head_dim per layer, except Taylor features, whose q/k
# width is the largest q with 1 + q + q^2 <= head_dim (head_dim 32: q = 5, 31 feature rows).
MIXER_SPECS: dict[str, dict[str, Any]] = {
    "attention": {"rule": "attention"},
    "accumulate-elu1": {"rule": "accumulate", "feature_map": "elu1"},
    "accumulate-taylor2": {"rule": "accumulate", "feature_map": "taylor2", "taylor": True},
    "gated": {"rule": "gated"},
    "delta": {"rule": "delta"},
    "gated_delta": {"rule": "gated_delta"},
    "hybrid": {"rule": "gated_delta", "hybrid": True},
}


@dataclass
class TrainConfig:
    vocab_size: int = 64
    seq_len: int = 64
    train_pairs: tuple[int, ...] = (2, 4, 8)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    head_dim: int = 32
    intermediate_size: int | None = None  # MLP width (None: 2 x hidden); 0: mixer-only blocks, as zoology
    attention_positions: bool = False  # learned absolute positions for pure-attention models, as zoology
    attention_conv_size: int = 0  # short convolution of attention layers (pure attention and the hybrid's)
    batch_size: int = 32
    steps: int = 400
    lr: float = 3e-3
    weight_decay: float = 0.1
    warmup: float = 0.05
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def taylor_qk_dim(head_dim: int) -> int:
    """The largest q/k width whose second-order Taylor features (1 + q + q^2) fit in ``head_dim`` rows."""
    q = 1
    while 1 + (q + 1) + (q + 1) ** 2 <= head_dim:
        q += 1
    return q


def build_model(mixer: str, cfg: TrainConfig) -> CausalLM:
    """The CausalLM for ``mixer`` (a key of `MIXER_SPECS`), initialized from ``cfg.seed``."""
    if mixer not in MIXER_SPECS:
        raise ValueError(f"mixer: unknown {mixer!r}; expected one of {', '.join(map(str, MIXER_SPECS))}")
    spec = MIXER_SPECS[mixer]
    torch.manual_seed(cfg.seed)
    kwargs: dict[str, Any] = {}
    head_dim = cfg.head_dim
    if spec["rule"] != "attention":
        if "feature_map" in spec:
            kwargs["feature_map"] = spec["feature_map"]
        if spec.get("taylor"):
            head_dim, kwargs["v_head_dim"] = taylor_qk_dim(cfg.head_dim), cfg.head_dim
    if spec.get("hybrid"):  # linear first, attention last (Qwen3-Next's order), 1:1 for two layers
        every = 2 if cfg.num_layers <= 4 else 4
        mixers: Any = ["attention" if (i + 1) % every == 0 else spec["rule"] for i in range(cfg.num_layers)]
    else:
        mixers = spec["rule"]
    opts = model_inputs(mixer, cfg)
    positions = cfg.seq_len if opts.get("attention_positions") else 0
    return CausalLM(cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads, head_dim, mixers=mixers,
                    intermediate_size=cfg.intermediate_size, max_position_embeddings=positions,
                    attention_conv_size=opts.get("attention_conv_size", 0), **kwargs)


def model_inputs(mixer: str, cfg: TrainConfig) -> dict[str, Any]:
    """`config_dict` without the options ``mixer``'s model ignores (attention options of a model without
    attention layers): what decides its training."""
    spec = MIXER_SPECS[mixer]
    d = config_dict(cfg)
    if spec["rule"] != "attention":
        d.pop("attention_positions", None)
        if not spec.get("hybrid"):
            d.pop("attention_conv_size", None)
    return d


def state_floats(model: CausalLM) -> int:
    """Floats of recurrent state per sequence, all linear layers (the KV cache of attention layers grows instead)."""
    total = 0
    for block in model.layers:
        m = block.mixer
        if hasattr(m, "rule"):
            width = 1 + m.head_dim + m.head_dim**2 if m.feature_map == "taylor2" else m.head_dim
            total += m.num_v_heads * width * m.v_head_dim
    return total


def _step_seed(seed: int, step: int, stream: int) -> int:
    return int(np.random.SeedSequence([seed, stream, step]).generate_state(1)[0])


def train_batch(cfg: TrainConfig, step: int):
    """The batch of ``step``: a function of (seed, step) only, so a resumed run sees the same data."""
    pairs = cfg.train_pairs[_step_seed(cfg.seed, step, 0) % len(cfg.train_pairs)]
    return generate(cfg.batch_size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len, num_pairs=pairs,
                    seed=_step_seed(cfg.seed, step, 1))


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warmup, then cosine decay to 10%."""
    warm = max(1, int(cfg.warmup * cfg.steps))
    if step < warm:
        return cfg.lr * (step + 1) / warm
    frac = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(frac, 1.0))))


def loss_and_accuracy(model: CausalLM, inputs: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, float]:
    """Mean cross-entropy over the query positions of ``inputs``/``targets`` ``[B, T]`` (a graph, for backward)
    and the exact-match accuracy there."""
    h, _ = model.hidden_states(torch.from_numpy(inputs))
    t = torch.from_numpy(targets)
    mask = t != IGNORE
    sel = model.logits(h[mask])  # the head at the query positions only
    loss = F.cross_entropy(sel, t[mask])
    return loss, (sel.argmax(-1) == t[mask]).float().mean().item()


def save_checkpoint(path: Path, model: CausalLM, opt: torch.optim.Optimizer, step: int, log: list,
                    config: dict[str, Any], train_s: float = 0.0) -> None:
    """Weights, AdamW moments, the step and the training seconds so far in one safetensors file (written
    atomically)."""
    tensors = {f"model.{k}": v.detach().contiguous() for k, v in model.state_dict().items()}
    for idx, st in opt.state_dict()["state"].items():
        for key, val in st.items():
            tensors[f"opt.{idx}.{key}"] = torch.as_tensor(val).contiguous()
    meta = {"step": str(step), "log": json.dumps(log), "config": json.dumps(config), "train_s": f"{train_s:.2f}"}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), overwrite=True)


def load_checkpoint(path: Path, model: CausalLM, opt: torch.optim.Optimizer,
                    config: dict[str, Any]) -> tuple[int, list, float]:
    """Restore ``model`` and ``opt`` from ``path``; returns (step, log, training seconds before the checkpoint).
    A checkpoint of another configuration is refused (ValueError)."""
    from safetensors import safe_open

    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    saved = json.loads(meta.get("config", "null"))
    if saved != config:
        raise ValueError(f"resume: checkpoint {path} was trained with another configuration ({saved}); "
                         f"this run has {config}")
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    state: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in tensors.items():
        if k.startswith("opt."):
            _, idx, key = k.split(".", 2)
            state.setdefault(int(idx), {})[key] = v
    opt.load_state_dict({"state": state, "param_groups": opt.state_dict()["param_groups"]})
    return int(meta["step"]), json.loads(meta["log"]), float(meta.get("train_s", 0.0))


def load_weights(path: Path, model: CausalLM, mixer: str, cfg: TrainConfig) -> int:
    """Load only the weights of a checkpoint written by `train` for ``mixer`` and ``cfg`` (another
    configuration is a ValueError); returns the step it was saved at."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
        saved = json.loads(meta.get("config", "null"))
        ident = {"mixer": mixer, **config_dict(cfg)}
        if saved != ident:
            raise ValueError(f"checkpoint {path} was trained with another configuration ({saved}); expected {ident}")
        model.load_state_dict({k[6:]: fh.get_tensor(k) for k in fh.keys() if k.startswith("model.")})
    return int(meta["step"])


class Diverged(ValueError):
    """Training went non-finite (the loss, or the weights after a step): told apart from the errors that a
    non-finite weight would raise further on (a NaN gate, say)."""


def finite_weights(model: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def step_loss(model: CausalLM, inputs: np.ndarray, targets: np.ndarray) -> tuple[torch.Tensor, float] | None:
    """`loss_and_accuracy` for one training step, or None when training has diverged: the loss is not
    finite, or the forward raised on non-finite weights (a linattn layer refuses the NaN gate they make)."""
    try:
        loss, acc = loss_and_accuracy(model, inputs, targets)
    except ValueError:
        if finite_weights(model):
            raise
        return None
    return (loss, acc) if bool(torch.isfinite(loss)) else None


def train(mixer: str, cfg: TrainConfig, *, checkpoint: Path | None = None, resume: bool = False,
          budget_s: float | None = None, stop_at: int | None = None, checkpoint_every: int = 100,
          progress: bool = True) -> tuple[CausalLM, dict[str, Any]]:
    """Train one model for ``cfg.steps`` steps (fewer if ``budget_s`` seconds run out, or at ``stop_at``: a
    simulated interruption). With ``resume`` and an existing ``checkpoint`` training continues from it.
    Returns (model, info) with info: steps done, stop reason, wall seconds, the loss/accuracy log. A run whose loss
    or weights go non-finite raises `Diverged`, naming the mixer, the step and the learning rate."""
    model = build_model(mixer, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))
    step, log, before_s = 0, [], 0.0
    ident = {"mixer": mixer, **config_dict(cfg)}
    if resume and checkpoint is not None and Path(checkpoint).exists():
        step, log, before_s = load_checkpoint(Path(checkpoint), model, opt, ident)
    resumed_at = step
    start = time.perf_counter()
    end = cfg.steps if stop_at is None else min(stop_at, cfg.steps)
    reason = "steps"
    model.train()
    with tqdm(total=cfg.steps, initial=step, desc=f"{mixer:>18}", disable=not progress, unit="step",
              leave=True) as bar:
        while step < end:
            if budget_s is not None and time.perf_counter() - start > budget_s:
                reason = "budget"
                break
            batch = train_batch(cfg, step)
            for group in opt.param_groups:
                group["lr"] = lr_at(cfg, step)
            got = step_loss(model, batch.inputs, batch.targets)
            if got is None:
                raise Diverged(f"training diverged: mixer {mixer!r} reached a non-finite loss or non-finite weights "
                               f"at step {step + 1} with lr {cfg.lr:g}; try a smaller --lr")
            loss, acc = got
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            log.append([step, round(loss.item(), 5), round(acc, 4)])
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc:.2f}")
            if checkpoint is not None and step % checkpoint_every == 0:
                save_checkpoint(Path(checkpoint), model, opt, step, log, ident,
                                before_s + time.perf_counter() - start)
    if not finite_weights(model):  # the last step's update: the evaluation would meet it
        raise Diverged(f"training diverged: mixer {mixer!r} has non-finite weights after step {step} with lr "
                       f"{cfg.lr:g}; try a smaller --lr")
    if stop_at is not None and step >= stop_at and step < cfg.steps:
        reason = "stopped"
    train_s = before_s + time.perf_counter() - start
    if checkpoint is not None:
        save_checkpoint(Path(checkpoint), model, opt, step, log, ident, train_s)
    model.eval()
    # train_s counts every session's training time (a resumed run adds the time saved in its checkpoint).
    return model, {"steps_done": step, "stop_reason": reason, "train_s": round(train_s, 2),
                   "resumed_at_step": resumed_at, "log": log}


@torch.no_grad()
def evaluate(model: CausalLM, cfg: TrainConfig, *, pairs: tuple[int, ...], examples: int, seq_len: int | None = None,
             distance_bins: tuple[int, ...] = (0, 8, 16, 32, 64, 128, 256, 512, 1 << 30), lead: int = 0,
             gap: int = 0, overwrites: int = 0, seed_offset: int = 10_000) -> list[dict[str, Any]]:
    """Exact-match recall (argmax == the value) over ``examples`` held-out sequences per number of pairs; one row
    per (pairs, distance bin) plus ``"all"``, ``"short"`` (distance <= seq_len / 4) and ``"long"``
    (> seq_len / 2) rows per pairs."""
    rows = []
    seq_len = seq_len or cfg.seq_len
    for n in pairs:
        b = generate(examples, vocab_size=cfg.vocab_size, seq_len=seq_len, num_pairs=n, lead=lead, gap=gap,
                     overwrites=overwrites, seed=cfg.seed + seed_offset + n)
        hits, dists = [], []
        for i in range(0, examples, 64):  # bounded memory
            logits, _ = model(torch.from_numpy(b.inputs[i:i + 64]))
            t = torch.from_numpy(b.targets[i:i + 64])
            mask = t != IGNORE
            hits.append((logits[mask].argmax(-1) == t[mask]).numpy())
            dists.append(b.distance[i:i + 64][mask.numpy()])
        hit, dist = np.concatenate(hits), np.concatenate(dists)
        rows.append({"num_pairs": n, "distance": "all", "queries": int(hit.size), "accuracy": float(hit.mean())})
        for label, sel in (("short", dist <= seq_len // 4), ("long", dist > seq_len // 2)):
            if sel.any():
                rows.append({"num_pairs": n, "distance": label, "queries": int(sel.sum()),
                             "accuracy": float(hit[sel].mean())})
        for lo, hi in zip(distance_bins[:-1], distance_bins[1:], strict=True):
            sel = (dist > lo) & (dist <= hi)
            if sel.any():
                rows.append({"num_pairs": n, "distance": f"{lo + 1}-{hi}" if hi < 1 << 30 else f">{lo}",
                             "queries": int(sel.sum()), "accuracy": float(hit[sel].mean())})
    return rows


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["train_pairs"] = list(cfg.train_pairs)
    for key, default in (("intermediate_size", None), ("attention_positions", False), ("attention_conv_size", 0)):
        if d[key] == default:  # defaults are recorded as the files and checkpoints made before these options
            del d[key]
    return d
