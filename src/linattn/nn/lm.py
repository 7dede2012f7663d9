"""A small causal language model with a choice of token mixer per layer: softmax attention, any linattn rule, or
a hybrid pattern. Pre-norm blocks (RMSNorm -> mixer -> residual, RMSNorm -> SwiGLU MLP -> residual; no MLP with
``intermediate_size=0``, as zoology's MQAR models), tied embeddings. Small and fast on a CPU: meant for
synthetic tasks (MQAR, copying) and for tests of decoding."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

import linattn
from linattn import checks
from linattn.nn.checks import check_int, check_optional_int, check_packing
from linattn.nn.conv import sequence_offsets
from linattn.nn.linear_attention import LinearAttention, RMSNorm
from linattn.nn.softmax_attention import KVCache, SoftmaxAttention

MIXERS = ("attention", *linattn.RULES)


def hybrid_pattern(num_layers: int, rule: str = "gated_delta", attention_every: int = 4) -> list[str]:
    """``attention_every - 1`` linear layers, then one attention layer, repeated (Qwen3-Next uses 3:1):
    ``hybrid_pattern(4) == ["gated_delta", "gated_delta", "gated_delta", "attention"]``."""
    check_int("num_layers", num_layers)
    check_int("attention_every", attention_every)
    if not isinstance(rule, str) or rule not in linattn.RULES:
        raise ValueError(f"rule: unknown rule {rule!r}; expected one of {', '.join(linattn.RULES)}")
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
        self.mlp_norm = RMSNorm(hidden_size) if intermediate_size else None  # 0: a mixer-only block
        self.mlp = MLP(hidden_size, intermediate_size) if intermediate_size else None

    def forward(self, x, cache=None, cu_seqlens=None):
        y, cache = self.mixer(self.mixer_norm(x), cache=cache, cu_seqlens=cu_seqlens)
        x = x + y
        return (x if self.mlp is None else x + self.mlp(self.mlp_norm(x))), cache


class CausalLM(nn.Module):
    """Token ids ``[B, T]`` -> logits ``[B, T, vocab]``, with a cache per layer for decoding.

    Args:
        vocab_size: number of token ids.
        hidden_size: model width.
        num_layers: number of blocks (a token mixer, then an MLP).
        num_heads: query/key heads of every mixer.
        head_dim: width of each head.
        mixers: one name for every layer (``"attention"`` or a rule of `linattn.RULES`) or one per layer,
            e.g. [`hybrid_pattern`][linattn.nn.hybrid_pattern].
        intermediate_size: MLP width (default ``2 * hidden_size``); 0 for blocks without an MLP.
        max_position_embeddings: learned absolute position embeddings added to the token embeddings, for
            positions ``< max_position_embeddings`` (zoology gives its attention baselines these); 0 (default) for
            none. Decoding with them needs an attention layer, whose cache counts the positions seen.
        attention_conv_size: the short convolution of every attention layer (`SoftmaxAttention`'s
            ``conv_size``); 0 (default) for none.
        backend: passed to every linattn call of the linear layers (see `linattn.linear_attention`).
        **linear_kwargs: passed to every `LinearAttention` (``num_v_heads``, ``conv_size``,
            ``feature_map``, ``chunk_size`` ...); a name it does not take is a TypeError, even with no linear layer.

    ``forward(input_ids, cache=None, cu_seqlens=None) -> (logits, cache)``; ``cache`` is a list with one entry per
    layer. `hidden_states` takes the same arguments and stops before the output head ``[B, T, hidden]``, for
    losses that need the logits of a few positions only (``model.logits(h[mask])``). Feeding the returned cache
    with the next tokens continues the sequences. With ``cu_seqlens`` (packed training batches) linear layers
    return one state per sequence and attention layers ``None`` (such a cache continues only a model without
    attention layers). ``input_ids`` must be integer ids in ``[0, vocab_size)``.
    """

    def __init__(self, vocab_size: int, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2,
                 head_dim: int = 32, mixers: str | Sequence[str] = "gated_delta", intermediate_size: int | None = None,
                 max_position_embeddings: int = 0, attention_conv_size: int = 0, backend: str = "auto",
                 **linear_kwargs):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size), ("num_layers", num_layers),
                            ("num_heads", num_heads), ("head_dim", head_dim)):
            check_int(name, value)
        check_optional_int("intermediate_size", intermediate_size, minimum=0)
        check_int("max_position_embeddings", max_position_embeddings, minimum=0)
        check_int("attention_conv_size", attention_conv_size, minimum=0)
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
                raise ValueError(f"mixers: unknown mixer {name!r}; expected one of {', '.join(MIXERS)}")
        self.mixers = names
        self.vocab_size = vocab_size
        linear_kwargs["backend"] = backend
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.max_position_embeddings = max_position_embeddings
        if max_position_embeddings:
            self.position = nn.Embedding(max_position_embeddings, hidden_size)
            nn.init.normal_(self.position.weight, std=hidden_size**-0.5)
        self.layers = nn.ModuleList(
            Block(
                SoftmaxAttention(hidden_size, num_heads, head_dim, conv_size=attention_conv_size)
                if name == "attention"
                else LinearAttention(hidden_size, num_heads, head_dim, rule=name, **linear_kwargs),
                hidden_size, 2 * hidden_size if intermediate_size is None else intermediate_size,
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

    def _positions(self, T: int, cache: list | None, cu_seqlens: torch.Tensor | None, device) -> torch.Tensor:
        """Absolute positions of this call's tokens: from 0 (each packed sequence from its start), or after the
        tokens an attention layer's cache has seen."""
        if cu_seqlens is not None:
            positions = sequence_offsets(cu_seqlens, T)
        else:
            past = 0
            if cache is not None:
                seen = [c.length for c in cache if isinstance(c, KVCache)]
                if not seen:
                    raise ValueError("cache: a model with max_position_embeddings decodes through an attention "
                                     "layer's cache (it counts the positions seen); this model has none")
                past = seen[0]
            positions = torch.arange(past, past + T, device=device)
        if int(positions.max()) >= self.max_position_embeddings:
            raise ValueError(f"input_ids: position {int(positions.max())} is past max_position_embeddings = "
                             f"{self.max_position_embeddings}")
        return positions

    def forward(self, input_ids: torch.Tensor, cache: list | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        h, new = self.hidden_states(input_ids, cache, cu_seqlens)
        return self.logits(h), new

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output head (tied embeddings): final hidden states ``[..., hidden]`` -> logits ``[..., vocab]``."""
        return F.linear(h, self.embed.weight)

    def hidden_states(self, input_ids: torch.Tensor, cache: list | None = None,
                      cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, list]:
        """`forward` without the head: (final-normed hidden states ``[B, T, hidden]``, cache)."""
        B, T = self._check_ids(input_ids)
        cu_seqlens = check_packing(cu_seqlens, cache, B, T, input_ids.device)
        if cache is not None:
            self._check_cache(cache)
        x = self.embed(input_ids)
        if self.max_position_embeddings:
            x = x + self.position(self._positions(T, cache, cu_seqlens, input_ids.device))
        caches = [None] * len(self.layers) if cache is None else cache
        new = []
        for layer, layer_cache in zip(self.layers, caches, strict=True):
            x, c = layer(x, layer_cache, cu_seqlens)
            new.append(c)
        return self.norm(x), new

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
