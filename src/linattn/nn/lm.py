"""A small causal language model with a choice of token mixer per layer: softmax attention, any linattn rule, or
a hybrid pattern. Pre-norm blocks (RMSNorm -> mixer -> residual, RMSNorm -> SwiGLU MLP -> residual), tied
embeddings. Small and fast on a CPU: meant for synthetic tasks (MQAR, copying) and for tests of decoding."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import linattn
from linattn.nn.layers import LinearAttention, RMSNorm, SoftmaxAttention

MIXERS = ("attention", *linattn.RULES)


def hybrid_pattern(num_layers: int, rule: str = "gated_delta", attention_every: int = 4) -> list[str]:
    """``attention_every - 1`` linear layers, then one attention layer, repeated (Qwen3-Next uses 3:1):
    ``hybrid_pattern(4) == ["gated_delta", "gated_delta", "gated_delta", "attention"]``."""
    return ["attention" if (i + 1) % attention_every == 0 else rule for i in range(num_layers)]


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, mixer: nn.Module, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.mixer_norm = RMSNorm(hidden_size)
        self.mixer = mixer
        self.mlp_norm = RMSNorm(hidden_size)
        self.mlp = MLP(hidden_size, intermediate_size)

    def forward(self, x, cache=None, cu_seqlens=None):
        y, cache = self.mixer(self.mixer_norm(x), cache=cache, cu_seqlens=cu_seqlens)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache


class CausalLM(nn.Module):
    """Token ids ``[B, T]`` -> logits ``[B, T, vocab]``, with a cache per layer for decoding.

    Args:
        vocab_size, hidden_size, num_layers, num_heads, head_dim: the usual sizes.
        mixers: one name for every layer (``"attention"`` or a rule of :data:`linattn.RULES`) or one per layer,
            e.g. :func:`hybrid_pattern`.
        intermediate_size: MLP width (default ``2 * hidden_size``).
        **linear_kwargs: passed to every :class:`LinearAttention` (``num_v_heads``, ``conv_size``,
            ``feature_map``, ``chunk_size`` ...).

    ``forward(input_ids, cache=None, cu_seqlens=None) -> (logits, cache)``; ``cache`` is a list with one entry per
    layer. Feeding the returned cache with the next tokens continues the sequences. With ``cu_seqlens`` (packed
    training batches) linear layers return one state per sequence and attention layers ``None``.
    """

    def __init__(self, vocab_size: int, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2,
                 head_dim: int = 32, mixers: str | Sequence[str] = "gated_delta", intermediate_size: int | None = None,
                 **linear_kwargs):
        super().__init__()
        names = [mixers] * num_layers if isinstance(mixers, str) else list(mixers)
        if len(names) != num_layers:
            raise ValueError(f"mixers: {len(names)} names for num_layers = {num_layers}")
        for name in names:
            if name not in MIXERS:
                raise ValueError(f"mixers: unknown mixer {name!r}; expected one of {list(MIXERS)}")
        self.mixers = names
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            Block(
                SoftmaxAttention(hidden_size, num_heads, head_dim) if name == "attention"
                else LinearAttention(hidden_size, num_heads, head_dim, rule=name, **linear_kwargs),
                hidden_size, intermediate_size or 2 * hidden_size,
            )
            for name in names
        )
        self.norm = RMSNorm(hidden_size)
        nn.init.normal_(self.embed.weight, std=hidden_size**-0.5)

    def forward(self, input_ids: torch.Tensor, cache: list | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        x = self.embed(input_ids)
        caches = [None] * len(self.layers) if cache is None else cache
        new = []
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x, c = layer(x, layer_cache, cu_seqlens)
            new.append(c)
        return F.linear(self.norm(x), self.embed.weight), new

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding: prefill ``input_ids [B, T]`` once, then one token at a time through the cache."""
        logits, cache = self(input_ids)
        out = [input_ids]
        for _ in range(max_new_tokens):
            token = logits[:, -1:].argmax(-1)
            out.append(token)
            logits, cache = self(token, cache)
        return torch.cat(out, dim=1)
