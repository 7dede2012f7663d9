"""The linear-attention token mixer built on the public API: `LinearAttention` (every rule) and its cache.

It takes ``x [B, T, hidden]`` and returns ``(y [B, T, hidden], cache)``. The cache is what decoding needs next: the
recurrent state and the short convolution's last inputs. Passing it back continues the sequence: a full forward
equals a prefill at any split point followed by token-by-token decode, to rounding. A decode step outside autograd
updates its cache in place and returns the same object (as HF's and fla's caches); ``LinearAttentionCache.clone()``
branches a generation. The softmax mixer with the same call signature is in `linattn.nn.softmax_attention`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import linattn
from linattn import checks, decode
from linattn.feature_maps import feature_map_name, resolve_feature_map
from linattn.nn.checks import (
    check_cache_tensor,
    check_int,
    check_optional_bool,
    check_optional_int,
    check_packing,
    check_positive_number,
    check_range,
    check_x,
)
from linattn.nn.conv import causal_conv
from linattn.ops import DELTA_RULES, GATED_RULES
from linattn.state import State, record_mismatch

# Feature map and normalizer per rule when not given: Katharopoulos et al. for accumulate, GLA (no map, no
# normalizer, the output norm keeps the scale) for gated, L2-normalized q and k for the delta rules (DeltaNet,
# Gated DeltaNet, KDA; the normalization fla and Qwen3-Next apply in the kernel).
DEFAULT_FEATURE_MAP = {"accumulate": "elu1", "gated": None, "delta": "l2", "gated_delta": "l2"}


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension, computed in float32 (as HF and fla)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = F.rms_norm(x32, (x32.shape[-1],), eps=self.eps)  # x / sqrt(mean x^2 + eps); 1.7x faster on CPU
        return self.weight * y.to(x.dtype)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Gates in float32 at least (a half-precision gate rounds exp(g) coarsely); float64 stays float64, so that
    a float64 model's prefill and decode agree to float64 rounding."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@dataclass
class LinearAttentionCache:
    """Decode state of one `LinearAttention` layer: ``state`` (S, z) and ``conv`` ``[B, K-1, C]``, the last
    K-1 inputs of the short convolution (``None`` without one).

    Updated in place: a decode step (one token) outside autograd overwrites ``state`` and ``conv`` and returns this
    same object, so an earlier reference to the cache, or to its tensors, follows the generation. To continue one
    prefix in two ways (beam search, sampling several answers), decode each branch from its own `clone`.
    Under autograd a decode step leaves the cache as it is and returns a new one (the gradient needs the old state).
    """

    state: State
    conv: torch.Tensor | None = None
    # The conv tensor that decoding made this cache's own (a contiguous copy, written in place); never copied (see
    # __getstate__). The prepared Decoder is kept by linattn.decode.decoder_for, keyed by this cache.
    _conv_own: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def clone(self) -> LinearAttentionCache:
        """A deep copy (its own state and convolution history, no prepared decoder): decoding one never changes the
        other."""
        conv = None if self.conv is None else self.conv.clone(memory_format=torch.contiguous_format)
        return LinearAttentionCache(self.state.clone(), conv)

    def __getstate__(self) -> dict:
        # copy.deepcopy and pickle take the state and history only: the decoder is rebuilt on the next step.
        return {**self.__dict__, "_conv_own": None}


class LinearAttention(nn.Module):
    """A linear-attention token mixer for any rule, with the published parameterizations.

    Args:
        hidden_size: model width: ``x`` is ``[B, T, hidden_size]``, and so is the output.
        num_heads: query/key heads.
        head_dim: width of each query/key head (before the feature map).
        rule: ``"accumulate"``, ``"gated"`` (GLA), ``"delta"`` (DeltaNet) or ``"gated_delta"`` (Gated DeltaNet;
            with ``per_channel_gate=True`` Kimi Delta Attention).
        feature_map: passed to `linattn.linear_attention`; default per rule (``DEFAULT_FEATURE_MAP``: elu1
            for accumulate, none for gated, l2 for the delta rules).
        normalize: passed to `linattn.linear_attention`; ``None`` is the rule's own definition, except gated,
            which runs unnormalized as GLA does.
        num_v_heads: value heads, a multiple of ``num_heads`` (grouped value heads); default ``num_heads``.
        v_head_dim: width of each value head; default ``head_dim``.
        conv_size: short causal depthwise convolution (with SiLU) over q, k, v, as in fla and Qwen3-Next; 0 for none.
        per_channel_gate: gated rules: one gate per key channel from a low-rank projection (GLA:
            ``logsigmoid(W2 W1 x) / 16``; KDA: ``-exp(A) softplus(W2 W1 x + dt_bias)``) instead of one per head
            (Gated DeltaNet: ``g = -exp(A) softplus(a(x) + dt_bias)``). Default: True for gated, False for gated_delta.
        gate_rank: rank of the low-rank gate projection (GLA uses 16).
        A_init_range: gated_delta: the decay's initialization, Mamba-2's (and fla's): A uniform in this range and
            dt log-uniform in ``dt_init_range``, so a head starts keeping ``exp(-A dt)`` of its state per token (0.2
            to 0.999 by default). A model with few heads may want slower starts, e.g. ``(1, 1)``.
        dt_init_range: gated_delta: the range of dt's log-uniform initialization (see ``A_init_range``), e.g.
            ``(0.01, 0.01)`` for slower starts.
        output_gate: ``o = RMSNorm(o) * silu(W_z x)`` per value head (Gated DeltaNet, GLA); else ``RMSNorm(o)``.
        chunk_size: passed to `linattn.linear_attention` for sequences longer than one token.
        form: passed to [`linattn.linear_attention`][linattn.linear_attention] for sequences longer than one token.
        backend: passed to every linattn call (``"auto"``, ``"torch"``, ``"cpu"`` or ``"triton"``; see
            [`linattn.linear_attention`][linattn.linear_attention]).
        state_dtype: the recurrent state's accumulation dtype, passed to `linattn.linear_attention` and
            [`linattn.step`][linattn.step]; ``None`` (default) is linattn's own (float32, also under bfloat16 weights).

    ``forward(x, cache=None, cu_seqlens=None) -> (y, cache)``. One token with a cache decodes through a
    `linattn.Decoder` kept on the cache (built on its first decode step), which updates the cache in place and
    returns the same object; while autograd records (grad enabled and an input, parameter or the state requiring
    grad) it decodes through `linattn.step` instead and returns a new cache, leaving the old one as it was.
    Longer inputs run ``form`` with the cache's state as initial state and return a new cache. With ``cu_seqlens``
    (batch 1, packed sequences) the cache returned holds one entry per sequence. Every argument is checked up front:
    ``x`` must be ``[B, T, hidden_size]`` in the parameters' dtype and device, ``cu_seqlens`` as in the API, and a
    cache must come from a layer of the same rule, feature map, heads and widths, for the same batch.
    """

    cache_name = "cache"  # what an error calls a bad cache (CausalLM sets "cache[i]" on its layer i)

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        rule: str = "gated_delta",
        feature_map: str | None | object = "default",
        normalize: bool | None = None,
        num_v_heads: int | None = None,
        v_head_dim: int | None = None,
        conv_size: int = 4,
        per_channel_gate: bool | None = None,
        gate_rank: int = 16,
        A_init_range: tuple[float, float] = (1.0, 16.0),
        dt_init_range: tuple[float, float] = (1e-3, 0.1),
        output_gate: bool = True,
        norm_eps: float = 1e-6,
        chunk_size: int = 64,
        form: str = "chunk",
        backend: str = "auto",
        state_dtype: torch.dtype | None = None,
    ):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_heads", num_heads), ("head_dim", head_dim),
                            ("gate_rank", gate_rank)):
            check_int(name, value)
        check_int("conv_size", conv_size, minimum=0)
        check_optional_int("num_v_heads", num_v_heads)
        check_optional_int("v_head_dim", v_head_dim)
        # The API's own checks, up front: a bad value fails here, not at the first forward.
        checks.check_form(checks.rule_module(rule), rule, form)
        checks.check_chunk_size(chunk_size)
        checks.check_backend(backend)
        checks.compute_dtype(torch.float32, state_dtype)  # the API's check: None or a floating torch.dtype
        checks.check_flag("output_gate", output_gate)
        check_optional_bool("per_channel_gate", per_channel_gate)
        if per_channel_gate and rule not in GATED_RULES:
            raise ValueError(f"per_channel_gate=True: rule {rule!r} has no gate; use rule='gated' or 'gated_delta'")
        check_positive_number("norm_eps", norm_eps, allow_zero=True)
        (a_lo, a_hi), (dt_lo, dt_hi) = check_range("A_init_range", A_init_range), check_range("dt_init_range",
                                                                                           dt_init_range)
        default_map = isinstance(feature_map, str) and feature_map == "default"
        self.feature_map = DEFAULT_FEATURE_MAP[rule] if default_map else feature_map
        fmap = resolve_feature_map(self.feature_map)
        # The state's key width, for the cache check: known for None and the named maps; a callable's is checked
        # by the API at the call.
        self._key_width = None
        if fmap is None:
            self._key_width = head_dim
        elif isinstance(self.feature_map, str):
            self._key_width = fmap(torch.zeros(1, head_dim)).shape[-1]
        self.normalize = (False if rule == "gated" else None) if normalize is None else normalize
        self._normalized = checks.resolve_normalize(rule, self.normalize)  # True is refused for the delta rules
        self.rule, self.form, self.chunk_size, self.backend = rule, form, chunk_size, backend
        self.state_dtype = state_dtype
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, head_dim
        self.num_v_heads = num_heads if num_v_heads is None else num_v_heads
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        if self.num_v_heads % num_heads:
            raise ValueError(f"num_v_heads ({self.num_v_heads}) must be a multiple of num_heads ({num_heads})")
        key_dim, value_dim = num_heads * head_dim, self.num_v_heads * self.v_head_dim
        self.q_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, value_dim, bias=False)
        self.o_proj = nn.Linear(value_dim, hidden_size, bias=False)
        self.conv_size = conv_size
        if conv_size:
            # One depthwise kernel over the concatenated [q | k | v] channels (Qwen3-Next's layout).
            self.conv_weight = nn.Parameter(torch.randn(2 * key_dim + value_dim, conv_size) / math.sqrt(conv_size))
        self.per_channel_gate = (rule == "gated") if per_channel_gate is None else per_channel_gate
        HV = self.num_v_heads
        if rule in GATED_RULES:
            gate_width = HV * head_dim if self.per_channel_gate else HV
            if self.per_channel_gate:
                self.g_proj = nn.Sequential(nn.Linear(hidden_size, gate_rank, bias=False),
                                            nn.Linear(gate_rank, gate_width, bias=rule == "gated"))
            else:
                self.g_proj = nn.Linear(hidden_size, gate_width, bias=False)
            if rule == "gated_delta":  # Mamba-2 style discretization: A uniform, dt log-uniform in their ranges
                self.A_log = nn.Parameter(torch.empty(HV).uniform_(a_lo, a_hi).log())
                dt = torch.exp(torch.rand(gate_width) * (math.log(dt_hi) - math.log(dt_lo)) + math.log(dt_lo))
                self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        if rule in DELTA_RULES:
            self.b_proj = nn.Linear(hidden_size, HV, bias=False)
        self.o_norm = RMSNorm(self.v_head_dim, eps=norm_eps)
        self.z_proj = nn.Linear(hidden_size, value_dim, bias=False) if output_gate else None

    def _gate(self, x: torch.Tensor) -> torch.Tensor | None:
        if self.rule not in GATED_RULES:
            return None
        B, T, _ = x.shape
        raw = _wide(self.g_proj(x))
        if self.rule == "gated":
            g = F.logsigmoid(raw) / 16  # GLA's gate_logit_normalizer
        else:
            g = -_wide(self.A_log).exp().repeat_interleave(raw.shape[-1] // self.num_v_heads) * F.softplus(
                raw + self.dt_bias)
        return g.view(B, T, self.num_v_heads, -1) if self.per_channel_gate else g

    def check_cache(self, cache: object, B: int, x: torch.Tensor, name: str | None = None) -> None:
        """``cache`` continues this layer for a batch of B rows like ``x``: a `LinearAttentionCache` whose
        state this rule and feature map made, with this layer's heads and widths, and a convolution history that
        matches ``conv_size``. A ValueError/TypeError calls it ``name`` (default ``self.cache_name``: ``"cache"``,
        or ``"cache[i]"`` in layer i of a [`CausalLM`][linattn.nn.CausalLM])."""
        name = name or self.cache_name
        if not isinstance(cache, LinearAttentionCache):
            raise TypeError(f"{name} must be a LinearAttentionCache (from this layer's forward) or None, got "
                            f"{type(cache).__name__}")
        state = cache.state
        if not isinstance(state, State):
            raise TypeError(f"{name}.state must be a linattn.State, got {type(state).__name__}")
        mismatch = record_mismatch(state, self.rule, feature_map_name(self.feature_map))
        if mismatch == "rule":
            raise ValueError(f"{name} was made by a layer with rule {state.rule!r}; this layer runs rule "
                             f"{self.rule!r} (a cache from another layer?)")
        if mismatch == "feature_map":
            raise ValueError(f"{name} was made with feature_map {state.feature_map!r}; this layer uses "
                             f"{feature_map_name(self.feature_map)!r} (a cache from another layer?)")
        if state.S.dim() != 4 or state.S.shape[0] != B:
            raise ValueError(f"{name} holds a state for batch {tuple(state.S.shape)[:1]} ([B, HV, r, Dv] = "
                             f"{tuple(state.S.shape)}) but x has batch B = {B}")
        r = state.S.shape[2] if self._key_width is None else self._key_width
        check_cache_tensor(f"{name}.state.S", state.S, (B, self.num_v_heads, r, self.v_head_dim),
                           "[B, num_v_heads, feature width, v_head_dim]", x)
        if self._normalized != (state.z is not None):
            raise ValueError(f"{name}.state.z is {'None' if state.z is None else 'set'} but this layer "
                             f"{'normalizes' if self._normalized else 'keeps no normalizer'} (a cache from another "
                             "layer?)")
        K = self.conv_size
        if K and cache.conv is None:
            raise ValueError(f"{name}.conv is None but this layer has a short convolution (conv_size={K}) whose last "
                             f"{K - 1} inputs the cache must hold (a cache from another layer?)")
        if not K and cache.conv is not None:
            raise ValueError(f"{name}.conv is set but this layer has no short convolution (conv_size=0)")
        if K:
            C = 2 * self.num_heads * self.head_dim + self.num_v_heads * self.v_head_dim
            check_cache_tensor(f"{name}.conv", cache.conv, (B, K - 1, C), "[B, conv_size - 1, channels]", x)

    def forward(self, x: torch.Tensor, cache: LinearAttentionCache | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, LinearAttentionCache]:
        B, T = check_x(x, self.hidden_size, self.q_proj.weight)
        cu_seqlens = check_packing(cu_seqlens, cache, B, T, x.device)
        if cache is not None:
            self.check_cache(cache, B, x)
        H, HV, Dk, Dv = self.num_heads, self.num_v_heads, self.head_dim, self.v_head_dim
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        conv_tail = None
        if self.conv_size:
            pre = qkv
            qkv, conv_tail = causal_conv(qkv, self.conv_weight, None if cache is None else cache.conv, cu_seqlens,
                                         backend=self.backend)
            if cu_seqlens is not None:  # each sequence's own last K-1 inputs (zeros before its start)
                conv_tail = _packed_tails(pre[0], self.conv_size, cu_seqlens)
        q, k, v = qkv.split([H * Dk, H * Dk, HV * Dv], dim=-1)
        q, k, v = q.reshape(B, T, H, Dk), k.reshape(B, T, H, Dk), v.reshape(B, T, HV, Dv)
        g = self._gate(x)
        beta = _wide(self.b_proj(x)).sigmoid() if self.rule in DELTA_RULES else None
        kwargs = dict(rule=self.rule, feature_map=self.feature_map, normalize=self.normalize, backend=self.backend,
                      state_dtype=self.state_dtype)
        if T == 1 and cache is not None and not _records(q, k, v, g, beta, cache.state):
            dec = self._decoder(cache, x.dtype)
            o = dec(q[:, 0].contiguous(), k[:, 0].contiguous(), v[:, 0].contiguous(),  # B > 1: the one-call layout
                    None if g is None else g[:, 0].contiguous(), None if beta is None else beta[:, 0].contiguous())
            if conv_tail is not None:
                cache.conv.copy_(conv_tail)
            cache.state = dec.state  # the same tensors (a step off the compiled path may wrap them anew)
            return self._output(o[:, None], x), cache
        if T == 1 and cache is not None:
            o, state = linattn.step(q[:, 0], k[:, 0], v[:, 0], cache.state, g=None if g is None else g[:, 0],
                                    beta=None if beta is None else beta[:, 0], **kwargs)
            o = o[:, None]
        else:
            o, state = linattn.linear_attention(
                q, k, v, g=g, beta=beta, initial_state=None if cache is None else cache.state,
                output_final_state=True, chunk_size=self.chunk_size, form=self.form, cu_seqlens=cu_seqlens, **kwargs)
        return self._output(o, x), LinearAttentionCache(state, conv_tail)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``o [B, T, HV, Dv]`` -> ``y [B, T, hidden]``: the per-head RMSNorm, the output gate, the projection."""
        B, T, HV, Dv = o.shape
        o = self.o_norm(o)
        if self.z_proj is not None:
            o = o * F.silu(self.z_proj(x).view(B, T, HV, Dv))
        return self.o_proj(o.reshape(B, T, HV * Dv))

    def _decoder(self, cache: LinearAttentionCache, dtype: torch.dtype) -> linattn.Decoder:
        """The prepared decode loop of ``cache`` for this layer's arguments, built on its first in-place step (again
        when the arguments or the cache's state object changed, or when a state made under inference mode is to be
        written outside it). The state is kept where an in-place step can update it; otherwise (not in
        ``state_dtype``, memory an in-place step refuses, inference tensors outside inference mode, a state that
        requires grad) a copy in linattn's layout replaces it, once. The conv history
        becomes the cache's own contiguous copy in ``dtype`` (x's), which no longer holds the prefill's inputs (again
        when it was replaced, or made under inference mode and written outside it)."""
        kwargs = dict(rule=self.rule, feature_map=self.feature_map, normalize=self.normalize, backend=self.backend)
        state, target = cache.state, self.state_dtype or cache.state.dtype
        dec = None
        if state.dtype == target:
            try:  # the one kept for this cache (linattn.decode.decoder_for), or a new one on this state
                dec = decode.decoder_for(cache, state, **kwargs)
            except ValueError:  # the in-place check refused this state's memory: decode a copy
                dec = None
        if dec is None:
            dec = decode.decoder_for(cache, _writable_copy(state, target), **kwargs)
        conv = cache.conv
        if conv is not None and (cache._conv_own is not conv or (
                conv.is_inference() and not torch.is_inference_mode_enabled())):
            cache.conv = cache._conv_own = conv.detach().to(dtype=dtype, memory_format=torch.contiguous_format,
                                                            copy=True)
        cache.state = dec.state
        return dec


def _records(q, k, v, g, beta, state: State) -> bool:
    """Autograd records this decode step: grad is enabled and an input of the step (x or a parameter behind q, k,
    v, g, beta; the state) requires grad."""
    return torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, g, beta, state.S, state.z))


def _writable_copy(state: State, dtype: torch.dtype) -> State:
    """``state`` in ``dtype`` in linattn's own layout (S and z one contiguous buffer), outside autograd, keeping its
    record: a state an in-place step updates where it lies."""
    S, z = state.S.detach(), None if state.z is None else state.z.detach()
    fresh = State.zeros(*S.shape, normalizer=z is not None, dtype=dtype, device=S.device)
    fresh.S.copy_(S)
    if z is not None:
        fresh.z.copy_(z)
    return State(fresh.S, fresh.z, rule=state.rule, feature_map=state.feature_map, normalized=state.normalized)


def _packed_tails(qkv: torch.Tensor, K: int, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """[N, K-1, C]: the pre-convolution inputs ``qkv [T, C]`` of each packed sequence's last K-1 tokens, zeros
    before its start."""
    cu = cu_seqlens.to(torch.int64)
    idx = cu[1:, None] - (K - 1) + torch.arange(K - 1, device=cu.device)  # [N, K-1]
    valid = idx >= cu[:-1, None]
    return qkv[idx.clamp_min(0)] * valid[..., None].to(qkv.dtype)
