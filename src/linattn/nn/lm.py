"""A small causal language model with a choice of token mixer per layer: softmax attention, any linattn rule, or
a hybrid pattern. Pre-norm blocks (RMSNorm -> mixer -> residual, RMSNorm -> SwiGLU MLP -> residual), tied
embeddings. Small and fast on a CPU: meant for synthetic tasks (MQAR, copying) and for tests of decoding."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import linattn
from linattn import checks
from linattn.nn.checks import check_int, check_optional_int, check_packing
from linattn.nn.layers import LinearAttention, RMSNorm, SoftmaxAttention

MIXERS = ("attention", *linattn.RULES)


def hybrid_pattern(num_layers: int, rule: str = "gated_delta", attention_every: int = 4) -> list[str]:
    """``attention_every - 1`` linear layers, then one attention layer, repeated (Qwen3-Next uses 3:1):
    ``hybrid_pattern(4) == ["gated_delta", "gated_delta", "gated_delta", "attention"]``."""
    check_int("num_layers", num_layers)
    check_int("attention_every", attention_every)
    if not isinstance(rule, str) or rule not in linattn.RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; expected one of {list(linattn.RULES)}")
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
        backend: passed to every linattn call of the linear layers (see :func:`linattn.linear_attention`).
        **linear_kwargs: passed to every :class:`LinearAttention` (``num_v_heads``, ``conv_size``,
            ``feature_map``, ``chunk_size`` ...); a name it does not take is a TypeError, even with no linear layer.

    ``forward(input_ids, cache=None, cu_seqlens=None) -> (logits, cache)``; ``cache`` is a list with one entry per
    layer. Feeding the returned cache with the next tokens continues the sequences. With ``cu_seqlens`` (packed
    training batches) linear layers return one state per sequence and attention layers ``None`` (such a cache
    continues only a model without attention layers). ``input_ids`` must be integer ids in ``[0, vocab_size)``.
    """

    def __init__(self, vocab_size: int, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2,
                 head_dim: int = 32, mixers: str | Sequence[str] = "gated_delta", intermediate_size: int | None = None,
                 backend: str = "auto", **linear_kwargs):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("num_heads", num_heads), ("head_dim", head_dim)):
            check_int(name, value)
        check_optional_int("intermediate_size", intermediate_size)
        checks.check_backend(backend)
        allowed = [p.name for p in inspect.signature(LinearAttention).parameters.values()
                   if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("rule", "backend")]
        unknown = sorted(set(linear_kwargs) - set(allowed))
        if unknown:
            raise TypeError(f"linear_kwargs: LinearAttention takes no {unknown}; it takes {allowed}")
        if isinstance(mixers, str):
            names = [mixers] * num_layers
        elif isinstance(mixers, Sequence):
            names = list(mixers)
        else:
            raise TypeError(f"mixers must be a str or a sequence of str, got {type(mixers).__name__}")
        if len(names) != num_layers:
            raise ValueError(f"mixers: {len(names)} names for num_layers = {num_layers}")
        for name in names:
            if not isinstance(name, str) or name not in MIXERS:
                raise ValueError(f"mixers: unknown mixer {name!r}; expected one of {list(MIXERS)}")
        self.mixers = names
        self.vocab_size = vocab_size
        linear_kwargs["backend"] = backend
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.layers = nn.ModuleList(
            Block(
                SoftmaxAttention(hidden_size, num_heads, head_dim) if name == "attention"
                else LinearAttention(hidden_size, num_heads, head_dim, rule=name, **linear_kwargs),
                hidden_size, intermediate_size or 2 * hidden_size,
            )
            for name in names
        )
        for i, block in enumerate(self.layers):  # each layer checks its own cache; its errors say which one
            block.mixer.cache_name = f"cache[{i}]"
        self.norm = RMSNorm(hidden_size)
        nn.init.normal_(self.embed.weight, std=hidden_size**-0.5)

    def _check_ids(self, input_ids: object) -> tuple[int, int]:
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor of token ids [B, T], got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
            raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
        if input_ids.numel() == 0:
            raise ValueError(f"input_ids must hold at least one token in each of at least one row, got shape "
                             f"{tuple(input_ids.shape)}")
        if input_ids.device != self.embed.weight.device:
            raise ValueError(f"input_ids is on {input_ids.device} but the model is on {self.embed.weight.device}")
        lo, hi = (int(t) for t in torch.aminmax(input_ids))
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"input_ids must be in [0, vocab_size) = [0, {self.vocab_size}), got {lo} ... {hi}")
        return input_ids.shape[0], input_ids.shape[1]

    def _check_cache(self, cache: object) -> None:
        """One entry per layer, none missing; each layer checks its own entry (as ``cache[i]``) when it runs."""
        if not isinstance(cache, (list, tuple)):
            raise TypeError(f"cache must be a list with one entry per layer (from this model's forward) or None, got "
                            f"{type(cache).__name__}")
        if len(cache) != len(self.layers):
            raise ValueError(f"cache has {len(cache)} entries but the model has {len(self.layers)} layers")
        for i, c in enumerate(cache):
            if c is None:
                raise ValueError(
                    f"cache[{i}] is None: layer {i} ({self.mixers[i]}) has nothing to continue from (a packed "
                    "forward returns no cache for attention layers); pass cache=None to start over"
                )

    def forward(self, input_ids: torch.Tensor, cache: list | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        B, T = self._check_ids(input_ids)
        cu_seqlens = check_packing(cu_seqlens, cache, B, T, input_ids.device)
        if cache is not None:
            self._check_cache(cache)
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
        check_int("max_new_tokens", max_new_tokens, minimum=0)
        logits, cache = self(input_ids)
        out = [input_ids]
        for _ in range(max_new_tokens):
            token = logits[:, -1:].argmax(-1)
            out.append(token)
            logits, cache = self(token, cache)
        return torch.cat(out, dim=1)
