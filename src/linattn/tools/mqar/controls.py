"""The controlled experiments of ``linattn mqar``, run on a trained model (nothing here trains).

* **evidence moved** (forgetting vs layout): fillers placed before the writes or between writes and queries at a
  fixed total length.
* **write-rule capacity**: (a) *overwritten keys* -- half the pairs written again with new values, the queries ask
  for the latest one; (b) *near-duplicate keys* -- the input embeddings of the key tokens pulled towards their
  common direction until every key's cosine with it is ``sqrt(rho)``, so two keys share ``rho`` of their
  embedding (`near_duplicate_table`); the sequences are ordinary MQAR.
* **precision**: the model as trained (float32), the model in bfloat16 with the recurrent state accumulating in
  float32 (linattn's default ``state_dtype``), and the whole model in bfloat16 including the state. Both bfloat16
  copies run their linear layers token by token (``form="recurrent"``) so that the state really is carried from
  token to token in its dtype, never only inside one chunk's matmuls.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from linattn.nn import CausalLM
from linattn.tools.mqar.data import split_vocab
from linattn.tools.mqar.train import TrainConfig, evaluate

NEAR_DUPLICATE_LEVELS = (0.5, 0.8, 0.9, 0.95)
PRECISIONS = ("float32", "bfloat16_state_float32", "bfloat16")


def control_pairs(cfg: TrainConfig) -> int:
    """The most trained pairs that still fit with half of them overwritten: 2 (n + n // 2) + 2 n <= seq_len."""
    fits = [n for n in cfg.train_pairs if 2 * (n + n // 2) + 2 * n <= cfg.seq_len]
    return max(fits) if fits else min(cfg.train_pairs)


def near_duplicate_table(weight: torch.Tensor, rows: slice, rho: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A copy of the embedding table ``weight [V, h]`` whose ``rows`` share ``rho`` of their direction.

    With ``c`` the unit mean of those rows and ``u_j`` the unit part of row ``j`` perpendicular to ``c``, row ``j``
    becomes ``|e_j| (sqrt(rho) c + sqrt(1 - rho) u_j)``: same norm, same perpendicular direction, cosine
    ``sqrt(rho)`` with ``c``, so two rows have cosine ``rho + (1 - rho) u_i . u_j``. Other rows are untouched.
    Returns (table, c)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must be in [0, 1), got {rho}")
    table = weight.detach().clone()
    e = table[rows].double()
    c = e.mean(0)
    c = c / c.norm()
    perp = e - (e @ c)[:, None] * c
    u = perp / perp.norm(dim=1, keepdim=True)
    new = e.norm(dim=1, keepdim=True) * (math.sqrt(rho) * c + math.sqrt(1.0 - rho) * u)
    table[rows] = new.to(table.dtype)
    return table, c.to(table.dtype)


class InputEmbedding(nn.Embedding):
    """Looks tokens up in ``table`` but keeps ``weight`` (the tied output projection) as trained, so that only
    what the model reads changes, not how its logits are scored."""

    def __init__(self, weight: torch.Tensor, table: torch.Tensor):
        super().__init__(*weight.shape, _weight=weight.detach().clone())
        self.register_buffer("table", table)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.table)


def with_near_duplicate_keys(model: CausalLM, cfg: TrainConfig, rho: float) -> CausalLM:
    """A copy of ``model`` whose key tokens ``[1, 1 + num_keys)`` are read through `near_duplicate_table`."""
    num_keys, _ = split_vocab(cfg.vocab_size)
    out = copy.deepcopy(model)
    table, _ = near_duplicate_table(model.embed.weight, slice(1, 1 + num_keys), rho)
    out.embed = InputEmbedding(model.embed.weight, table)
    return out


def mean_pairwise_cosine(x: torch.Tensor) -> float:
    """Mean cosine similarity over all pairs of distinct rows of ``x``."""
    u = F.normalize(x.detach().double(), dim=1)
    gram = u @ u.T
    n = x.shape[0]
    return float((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))


def with_precision(model: CausalLM, precision: str) -> CausalLM:
    """A copy of ``model`` for one of `PRECISIONS`: ``"float32"`` is the model as trained;
    ``"bfloat16_state_float32"``: weights and activations bfloat16, every linear layer's state float32, token by
    token; ``"bfloat16"``: the same with the state in bfloat16 as well."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown {precision!r}; expected one of {', '.join(map(str, PRECISIONS))}")
    out = copy.deepcopy(model)
    if precision == "float32":
        return out
    out = out.to(torch.bfloat16)
    for block in out.layers:
        if hasattr(block.mixer, "rule"):  # a LinearAttention layer (softmax attention has no recurrent state)
            block.mixer.form = "recurrent"
            block.mixer.state_dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    return out


def controls(model: CausalLM, cfg: TrainConfig, *, n: int, examples: int) -> dict[str, Any]:
    """Every control at ``n`` pairs; each entry is the accuracy over all queries of ``examples`` sequences."""
    out: dict[str, Any] = {"num_pairs": n, "moved": [], "overwrites": None}
    filler = cfg.seq_len
    for gap in (0, filler // 2, filler):
        rows = evaluate(model, cfg, pairs=(n,), examples=examples, seq_len=cfg.seq_len + filler,
                        lead=filler - gap, gap=gap, seed_offset=20_000)
        out["moved"].append({"gap": gap, "total_len": cfg.seq_len + filler, "accuracy": rows[0]["accuracy"]})
    try:
        rows = evaluate(model, cfg, pairs=(n,), examples=examples, overwrites=n // 2, seed_offset=30_000)
        out["overwrites"] = {"overwritten": n // 2, "accuracy": rows[0]["accuracy"]}
    except ValueError:  # no room in seq_len for the rewritten pairs
        out["overwrites"] = None
    num_keys, _ = split_vocab(cfg.vocab_size)
    keys = slice(1, 1 + num_keys)
    # rho None: the embeddings as trained (the transform at rho = 0 would still change them: it removes c).
    out["near_duplicate"] = [{"rho": None, "mean_cosine": mean_pairwise_cosine(model.embed.weight[keys]),
                              "accuracy": evaluate(model, cfg, pairs=(n,), examples=examples)[0]["accuracy"]}]
    for rho in NEAR_DUPLICATE_LEVELS:
        dup = with_near_duplicate_keys(model, cfg, rho)
        out["near_duplicate"].append({"rho": rho, "mean_cosine": mean_pairwise_cosine(dup.embed.table[keys]),
                                      "accuracy": evaluate(dup, cfg, pairs=(n,), examples=examples)[0]["accuracy"]})
    # Precision at the trained length and at twice it (the extra fillers between writes and queries, which the
    # moved-evidence control shows every model handles): more tokens for a low-precision state to accumulate over.
    out["precision"] = []
    copies = {p: with_precision(model, p) for p in PRECISIONS}
    for total, gap in ((cfg.seq_len, 0), (cfg.seq_len + filler, filler)):
        row: dict[str, Any] = {"total_len": total, "gap": gap}
        for p, m in copies.items():
            row[p] = evaluate(m, cfg, pairs=(n,), examples=examples, seq_len=total, gap=gap,
                              seed_offset=40_000)[0]["accuracy"]
        out["precision"].append(row)
    return out
