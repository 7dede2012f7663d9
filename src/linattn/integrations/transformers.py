"""HF transformers' Qwen3-Next (and its relatives) on linattn: CPU, no Triton, same cache.

``patch_qwen3_next()`` is the one call. Qwen3-Next's ``Qwen3NextGatedDeltaNet.forward`` calls two module-level
functions, ``torch_chunk_gated_delta_rule`` (prefill) and ``torch_recurrent_gated_delta_rule`` (one-token decode);
at import, transformers points them at flash-linear-attention's Triton kernels when fla is installed (which then
fails on a CPU-only machine: "0 active drivers") and at its own slow torch loops otherwise. The patch points both
at linattn (chunk form for prefill, a :class:`linattn.Decoder` for decode), with the same signature, the same state
layout ``[B, HV, Dk, Dv]`` (so HF's cache holds linattn's state unchanged) and packed sequences (``cu_seqlens``).
A decode step outside autograd updates the cache's state tensor in place, as HF's cache does with the state it is
given, through a decoder prepared once per state tensor.
The short convolution runs HF's own torch implementation, which runs everywhere; a packed call
(``layer(x, cu_seq_lens_q=cu)``) runs :func:`linattn.nn.causal_conv` instead, which restarts the convolution at every
sequence boundary, so that each packed sequence gives what it gives alone.

Patches nest: each one is in force until undone, the latest on top, and undoing them in any order restores HF's
functions once the last is gone (undoing one twice does nothing).

``gated_deltanet_from_qwen3_next(hf_layer)`` builds a :class:`linattn.nn.LinearAttention` with the state dict of an
HF ``Qwen3NextGatedDeltaNet`` (its fused, per-key-head-interleaved projections split into q/k/v/z/a/b).

transformers itself is imported only by ``patch_qwen3_next`` (it is an optional extra).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Mapping

import torch
from torch.utils.weak import WeakTensorKeyDictionary

import linattn
from linattn import checks
from linattn.checks import check_cu_seqlens
from linattn.nn import LinearAttention, causal_conv
from linattn.state import State

# Models whose modeling file defines the same two functions (checked against transformers 5.24).
MODELS = ("qwen3_next", "qwen3_5", "qwen3_5_moe", "olmo_hybrid")
_RULE_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
_CONV_FUNCTIONS = ("causal_conv1d_fn", "causal_conv1d_update")


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's/fla's ``chunk_gated_delta_rule`` signature on :func:`linattn.linear_attention`.

    query, key ``[B, T, H, Dk]``; value ``[B, T, HV, Dv]``; g, beta ``[B, T, HV]``; initial_state
    ``[B, HV, Dk, Dv]`` (N entries with ``cu_seqlens``). Returns (output in query's dtype, final state or None).
    ``backend`` as in :func:`linattn.linear_attention`. Other keyword arguments HF passes along (position ids,
    masks) do not concern the rule and are ignored.
    """
    o, state = linattn.linear_attention(
        query, key, value, rule="gated_delta", g=g.to(torch.float32) if g.dtype != torch.float64 else g,
        beta=beta, feature_map="l2" if use_qk_l2norm_in_kernel else None, scale=scale,
        initial_state=None if initial_state is None else State(initial_state), output_final_state=output_final_state,
        chunk_size=chunk_size, cu_seqlens=cu_seqlens, backend=backend,
    )
    return o.to(query.dtype), None if state is None else state.S


# The prepared decode loop of each state tensor that a decode step updated in place (HF's cache holds one per layer):
# (what it was built for, the Decoder). Weak: an entry goes with its tensor; the Decoder holds a detached alias of
# it (same memory, another tensor object), so that it does not keep the key alive.
_DECODERS = WeakTensorKeyDictionary()


def _decoder(S: torch.Tensor, query, key, value, g, beta, feature_map, scale, backend) -> linattn.Decoder | None:
    """The decoder that updates ``S`` in place for this step, or None where the step must not write S: autograd
    records (grad enabled and an input or S requiring grad), S is not in the accumulation dtype (float32; S's own
    for float64 inputs, as the functional path), S holds inference tensors outside inference mode, or an in-place
    step refuses S's memory."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, g, beta, S)):
        return None
    if (query.dtype != torch.float64 and S.dtype != torch.float32) or (
            S.is_inference() and not torch.is_inference_mode_enabled()):
        return None
    made_for = (feature_map, scale, backend)
    held = _DECODERS.get(S)
    if held is not None and held[0] == made_for:
        mine = held[1].state.S  # the same memory, unless S was re-pointed in place (set_, resize_)
        if mine.data_ptr() == S.data_ptr() and mine.shape == S.shape and mine.stride() == S.stride():
            return held[1]
    try:
        dec = linattn.Decoder(State(S.detach()), rule="gated_delta", feature_map=feature_map, scale=scale,
                              backend=backend)
    except ValueError:  # memory or inference tensors an in-place step refuses: the functional path
        return None
    _DECODERS[S] = (made_for, dec)
    return dec


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    scale: float | None = None,
    backend: str = "auto",
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's ``torch_recurrent_gated_delta_rule`` signature: one token through linattn's decode step (longer inputs
    take the chunk form, the same function).

    With ``initial_state`` and ``output_final_state=True`` (HF's decode step with a cache), outside autograd and
    with the state in float32 (or float64 inputs), the step updates ``initial_state`` in place through a
    :class:`linattn.Decoder` kept for that tensor, and returns it as the final state: HF's cache then copies it onto
    itself. Otherwise (autograd records, another state dtype, no state, or the final state not asked for) it runs
    :func:`linattn.step` and leaves ``initial_state`` as it was, as HF's own function does."""
    if query.shape[1] != 1 or cu_seqlens is not None:
        return chunk_gated_delta_rule(query, key, value, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state,
                                      use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, cu_seqlens=cu_seqlens,
                                      scale=scale, backend=backend)
    feature_map = "l2" if use_qk_l2norm_in_kernel else None
    q, k, v, g, beta = query[:, 0], key[:, 0], value[:, 0], g[:, 0], beta[:, 0]
    dec = None
    if initial_state is not None and output_final_state:
        dec = _decoder(initial_state, q, k, v, g, beta, feature_map, scale, backend)
    if dec is not None:  # contiguous rows: the layout of the one-call kernel at batch > 1
        o = dec(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous())
        return o[:, None].to(query.dtype), initial_state
    o, state = linattn.step(
        q, k, v, None if initial_state is None else State(initial_state), rule="gated_delta", g=g, beta=beta,
        feature_map=feature_map, scale=scale, state_dtype=torch.float32 if query.dtype != torch.float64 else None,
        backend=backend,
    )
    return o[:, None].to(query.dtype), state.S if output_final_state else None


def causal_conv1d_fn(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    fallback,
    cu_seq_lens_q: torch.Tensor | None = None,
    **kwargs,
) -> torch.Tensor:
    """HF's ``causal_conv1d_fn`` (depthwise causal convolution, ``hidden_states [B, C, L]``, ``weight [C, K]``) that
    keeps packed sequences apart: with ``cu_seq_lens_q`` no tap reaches into the previous sequence
    (:func:`linattn.nn.causal_conv`, SiLU, no bias, as every model in ``MODELS``). Inputs before ``cu_seq_lens_q``'s
    end (what HF's cache puts in front of the call's own tokens) are the first sequence's past. Without it, the call
    goes to ``fallback`` (HF's own torch code). Returns ``[B, C, L]`` in ``hidden_states``' dtype."""
    if cu_seq_lens_q is None:
        return fallback(hidden_states, weight, bias, activation=activation, **kwargs)
    B, C, L = hidden_states.shape
    cu = cu_seq_lens_q
    readable = isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.numel() and not (cu.is_meta or cu.is_complex())
    end = int(cu[-1]) if readable else L
    try:  # the API's rule, under the name HF passes it by
        cu = check_cu_seqlens(cu, end if 0 <= end <= L else L, B, hidden_states.device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"cu_seq_lens_q: {exc}") from None
    if activation not in ("silu", "swish") or bias is not None:
        raise ValueError(f"activation={activation!r}, bias {'set' if bias is not None else 'None'}: packed sequences "
                         "(cu_seq_lens_q) run linattn's short convolution, which is SiLU without bias")
    if L > int(cu[-1]):  # the cached inputs in front join the first sequence
        cu = torch.cat([cu[:1], cu[1:] + (L - int(cu[-1]))])
    y, _ = causal_conv(hidden_states.transpose(1, 2).to(weight.dtype), weight, cu_seqlens=cu)
    return y.transpose(1, 2).to(hidden_states.dtype)


# The patches in force, per (module, function name): HF's original and a stack of (patch, replacement), latest last.
_ACTIVE: dict[tuple[object, str], tuple[object, list[tuple[Patch, object]]]] = {}


class Patch:
    """Functions that :func:`patch_qwen3_next` (or :func:`use_hf_torch_fallback`) replaced. ``undo()`` (or leaving
    the ``with`` block) withdraws this patch's replacements: a function returns to the latest patch still in force,
    or to HF's original when none is, whatever order patches are undone in. A second ``undo()`` does nothing."""

    def __init__(self, replacements: list[tuple[object, str, object]]):
        self.replacements = replacements  # (module, name, replacement)
        self.active = True
        for module, name, value in replacements:
            _, stack = _ACTIVE.setdefault((module, name), (getattr(module, name), []))
            stack.append((self, value))
            setattr(module, name, value)

    def undo(self) -> None:
        if not self.active:
            return
        self.active = False
        for module, name, _ in self.replacements:
            key = (module, name)
            if key not in _ACTIVE:  # a repeated entry of this patch already restored it
                continue
            base, stack = _ACTIVE[key]
            stack[:] = [entry for entry in stack if entry[0] is not self]
            setattr(module, name, stack[-1][1] if stack else base)
            if not stack:
                del _ACTIVE[key]

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def original(module, name: str):
    """``module.name`` as transformers left it, beneath any patch in force."""
    entry = _ACTIVE.get((module, name))
    return getattr(module, name) if entry is None else entry[0]


def _modeling(name: str):
    """The model's modeling module, after checking that its layers look the rule up at call time (transformers 5
    does; older versions bound it per instance in ``__init__``, which a module-level patch would not reach)."""
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    layers = [obj for obj in vars(module).values() if isinstance(obj, type) and obj.__name__.endswith("GatedDeltaNet")]
    if not layers or not all(_RULE_FUNCTIONS[0] in inspect.unwrap(obj.forward).__code__.co_names for obj in layers):
        import transformers

        raise RuntimeError(
            f"transformers {transformers.__version__}: {name}'s Gated DeltaNet does not call the module-level "
            f"{_RULE_FUNCTIONS[0]}, so it cannot be routed to linattn (tested with transformers 5.24)"
        )
    return module


def patch_qwen3_next(models: tuple[str, ...] = ("qwen3_next",), *, backend: str = "auto") -> Patch:
    """Route the gated delta rule of these transformers models (``MODELS`` lists those known to share it) to
    linattn, and their short convolution to HF's own torch code (:func:`causal_conv1d_fn`: linattn's for packed
    sequences). Affects every instance, existing and future; returns a :class:`Patch` (``undo()``, or use it as a
    context manager; patches nest and may be undone in any order). ``backend`` is passed to every linattn
    call (``"auto"``, ``"torch"``, ``"cpu"``, ``"triton"``; see :func:`linattn.linear_attention`)."""
    checks.check_backend(backend)
    if not isinstance(models, (tuple, list)) or not all(isinstance(name, str) for name in models):
        raise TypeError(f"models must be a tuple of model names, some of {list(MODELS)}; got {models!r}")
    for name in models:  # every name checked before anything is patched
        if name not in MODELS:
            raise ValueError(f"models: unknown model {name!r}; expected some of {list(MODELS)}")
    replacements = []
    for name in models:
        module = _modeling(name)
        conv_fn, conv_update = (hf_torch_fallback(original(module, fn)) for fn in _CONV_FUNCTIONS)
        replacements += [  # a CUDA-only causal_conv1d package would fail on CPU too: HF's torch convolution
            (module, _RULE_FUNCTIONS[0], functools.partial(chunk_gated_delta_rule, backend=backend)),
            (module, _RULE_FUNCTIONS[1], functools.partial(recurrent_gated_delta_rule, backend=backend)),
            (module, _CONV_FUNCTIONS[0], functools.partial(causal_conv1d_fn, fallback=conv_fn)),
            (module, _CONV_FUNCTIONS[1], conv_update),
        ]
    return Patch(replacements)


def hf_torch_fallback(fn):
    """HF's own torch implementation behind a function transformers may have pointed at another package."""
    return getattr(fn, "__wrapped__", fn)


def use_hf_torch_fallback(models: tuple[str, ...] = ("qwen3_next",)) -> Patch:
    """Route the same functions to transformers' own torch fallbacks (the slow reference; what HF runs without
    fla), e.g. to compare against. Returns a :class:`Patch`."""
    modules = [_modeling(name) for name in models]
    return Patch([(module, fn, hf_torch_fallback(original(module, fn)))
                  for module in modules for fn in _RULE_FUNCTIONS + _CONV_FUNCTIONS])


# ------------------------------------------------------------------------------------------------ weights
def gated_deltanet_from_qwen3_next(hf_layer: torch.nn.Module, *, chunk_size: int = 64,
                                   backend: str = "auto") -> LinearAttention:
    """A :class:`LinearAttention` (rule ``"gated_delta"``) equal to an HF ``Qwen3NextGatedDeltaNet``, weights
    loaded from its state dict (same dtype and device); ``chunk_size`` and ``backend`` go to the layer."""
    layer = LinearAttention(
        hf_layer.hidden_size, hf_layer.num_k_heads, hf_layer.head_k_dim, rule="gated_delta", feature_map="l2",
        num_v_heads=hf_layer.num_v_heads, v_head_dim=hf_layer.head_v_dim, conv_size=hf_layer.conv_kernel_size,
        per_channel_gate=False, output_gate=True, norm_eps=hf_layer.layer_norm_epsilon, chunk_size=chunk_size,
        backend=backend,
    )
    if hf_layer.activation != "silu":
        raise ValueError(f"hf_layer: its convolution uses {hf_layer.activation!r}; linattn's short convolution is SiLU")
    ref = next(hf_layer.parameters())
    layer.to(device=ref.device, dtype=ref.dtype)
    layer.load_state_dict(convert_qwen3_next_state_dict(hf_layer.state_dict(), num_k_heads=hf_layer.num_k_heads,
                                                        head_k_dim=hf_layer.head_k_dim,
                                                        num_v_heads=hf_layer.num_v_heads,
                                                        head_v_dim=hf_layer.head_v_dim))
    return layer


def convert_qwen3_next_state_dict(sd: Mapping[str, torch.Tensor], *, num_k_heads: int, head_k_dim: int,
                                  num_v_heads: int, head_v_dim: int) -> dict[str, torch.Tensor]:
    """HF ``Qwen3NextGatedDeltaNet`` parameter names and layout -> :class:`LinearAttention`'s.

    HF fuses q, k, v, z into ``in_proj_qkvz`` grouped per key head: rows ``[H, (Dk, Dk, G*Dv, G*Dv)]`` with
    G = HV/H, and b, a into ``in_proj_ba`` as ``[H, (G, G)]``; its depthwise conv runs over [q | k | v] channels.
    """
    H, Dk, HV, Dv = num_k_heads, head_k_dim, num_v_heads, head_v_dim
    G = HV // H
    hidden = sd["in_proj_qkvz.weight"].shape[-1]
    qkvz = sd["in_proj_qkvz.weight"].view(H, 2 * Dk + 2 * G * Dv, hidden)
    q, k, v, z = qkvz.split([Dk, Dk, G * Dv, G * Dv], dim=1)
    ba = sd["in_proj_ba.weight"].view(H, 2 * G, hidden)
    b, a = ba.split([G, G], dim=1)
    return {
        "q_proj.weight": q.reshape(H * Dk, hidden),
        "k_proj.weight": k.reshape(H * Dk, hidden),
        "v_proj.weight": v.reshape(HV * Dv, hidden),
        "z_proj.weight": z.reshape(HV * Dv, hidden),
        "b_proj.weight": b.reshape(HV, hidden),
        "g_proj.weight": a.reshape(HV, hidden),
        "conv_weight": sd["conv1d.weight"][:, 0, :],
        "A_log": sd["A_log"],
        "dt_bias": sd["dt_bias"],
        "o_norm.weight": sd["norm.weight"],
        "o_proj.weight": sd["out_proj.weight"],
    }
