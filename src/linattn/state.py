"""The recurrent state that replaces the KV cache: ``S`` (key x value memory) and, for normalized rules, ``z``."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch


def is_joint(S: torch.Tensor, z: torch.Tensor | None) -> bool:
    """Whether S and z are the columns of one ``[B, H, Dk, Dv+1]`` buffer ``[S | z]`` (the layout of every state
    linattn makes, so that decode can update S and z together in place).

    Found through the memory layout (strides and addresses), which also holds under ``torch.inference_mode``.
    """
    if z is None or z.dtype != S.dtype:
        return False
    st = S.stride()
    Dv = S.shape[-1]
    return (
        st[-1] == 1
        and st[-2] == Dv + 1
        and z.stride() == st[:-1]
        and z.data_ptr() == S.data_ptr() + Dv * S.element_size()
    )


def joint_view(S: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor | None:
    """``[S | z]`` as one ``[B, H, Dk, Dv+1]`` view when `is_joint`, else None."""
    if not is_joint(S, z):
        return None
    return S.as_strided((*S.shape[:-1], S.shape[-1] + 1), S.stride(), S.storage_offset())


def record_mismatch(state: State, rule: str | None, feature_map: str | None,
                    normalized: bool | None = None) -> str | None:
    """The first field of ``state``'s record that disagrees with a call's, ``"rule"``, ``"feature_map"`` or
    ``"normalized"``; None when they agree. ``feature_map`` is the call's map by name (``feature_map_name``). A
    field the state does not record, or the caller does not give (None), is not compared: a hand-built state may
    record a map and no rule. The one place this is decided; each caller words its own error."""
    if state.rule is not None and rule is not None and state.rule != rule:
        return "rule"
    if state.feature_map is not None and feature_map is not None and state.feature_map != feature_map:
        return "feature_map"
    if state.normalized is not None and normalized is not None and state.normalized is not normalized:
        return "normalized"
    return None


@dataclass(eq=False, repr=False)
class State:
    """Fixed-size state of one linear-attention layer.

    Attributes:
        S: ``[B, H, Dk, Dv]`` memory; ``Dk`` is the feature width (after the feature map).
        z: ``[B, H, Dk]`` running sum of key features (the normalizer), or ``None`` for rules without one
            (delta, gated delta, or ``normalize=False``).
        rule: the rule that made the state, recorded when linattn makes it (``None`` for a state built by hand:
            then nothing is checked). ``step`` and ``linear_attention`` refuse a recorded state made by another
            rule or feature map; to carry one over on purpose, rebuild it as ``State(state.S, state.z)``.
        feature_map: the map's name (``"identity"`` for ``feature_map=None``, the same function) or, for a
            callable, its qualified name; ``None`` when built by hand.
        normalized: whether the state carries the normalizer z; ``None`` when built by hand.

    Equality is identity (``==`` on tensors has no single truth value); compare ``S`` and ``z`` to compare contents.
    """

    S: torch.Tensor
    z: torch.Tensor | None = None
    rule: str | None = field(default=None, kw_only=True)
    feature_map: str | None = field(default=None, kw_only=True)
    normalized: bool | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        S, z = self.S, self.z
        if not isinstance(S, torch.Tensor):
            raise TypeError(f"State.S must be a torch.Tensor, got {type(S).__name__}")
        if S.dim() != 4:
            raise ValueError(f"State.S must be [B, H, Dk, Dv], got shape {tuple(S.shape)}")
        if not S.is_floating_point():
            raise TypeError(f"State.S must be a real floating-point tensor, got {S.dtype}")
        if z is not None:
            if not isinstance(z, torch.Tensor):
                raise TypeError(f"State.z must be a torch.Tensor or None, got {type(z).__name__}")
            if z.shape != S.shape[:3]:
                raise ValueError(f"State.z must be [B, H, Dk] = {tuple(S.shape[:3])} to match S, got {tuple(z.shape)}")
            if z.device != S.device or z.dtype != S.dtype:
                raise ValueError(f"State.z ({z.dtype}, {z.device}) must match S ({S.dtype}, {S.device})")
        if not (self.rule is None or isinstance(self.rule, str)):
            raise TypeError(f"State.rule must be a str or None, got {type(self.rule).__name__}")
        if not (self.feature_map is None or isinstance(self.feature_map, str)):
            raise TypeError(f"State.feature_map must be a str or None, got {type(self.feature_map).__name__}")
        if not (self.normalized is None or isinstance(self.normalized, bool)):
            raise TypeError(f"State.normalized must be a bool or None, got {type(self.normalized).__name__}")

    @classmethod
    def zeros(
        cls,
        batch: int,
        heads: int,
        key_dim: int,
        value_dim: int,
        *,
        normalizer: bool = True,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> State:
        """An empty state (no history yet). Sizes are ints >= 0; with ``normalizer``, S and z share one buffer
        (the layout ``step(inplace=True)`` updates in place)."""
        sizes = []
        for name, n in (("batch", batch), ("heads", heads), ("key_dim", key_dim), ("value_dim", value_dim)):
            try:  # ints, numpy and torch integers; not bools, floats or anything else
                size = None if isinstance(n, bool) else operator.index(n)
            except TypeError:
                size = None
            if size is None:
                raise TypeError(f"State.zeros: {name} must be an int, got {type(n).__name__}")
            if size < 0:
                raise ValueError(f"State.zeros: {name} must be >= 0, got {size}")
            sizes.append(size)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"State.zeros: dtype must be a floating torch.dtype, got {dtype!r}")
        if not isinstance(normalizer, bool):
            raise TypeError(f"State.zeros: normalizer must be a bool, got {type(normalizer).__name__}")
        B, H, Dk, Dv = sizes
        if not normalizer:
            return cls(torch.zeros(B, H, Dk, Dv, dtype=dtype, device=device))
        buf = torch.zeros(B, H, Dk, Dv + 1, dtype=dtype, device=device)
        return cls(buf[..., :Dv], buf[..., Dv])

    @property
    def nbytes(self) -> int:
        """Bytes kept between steps: S plus z. Independent of history length."""
        n = self.S.numel() * self.S.element_size()
        if self.z is not None:
            n += self.z.numel() * self.z.element_size()
        return n

    @property
    def dtype(self) -> torch.dtype:
        return self.S.dtype

    @property
    def device(self) -> torch.device:
        return self.S.device

    def _map(self, fn) -> State:
        """``fn`` applied to S and z, keeping the record, and keeping them one buffer when they were one."""
        S, z = self.S, self.z
        joint = None if S.requires_grad or (z is not None and z.requires_grad) else joint_view(S, z)
        if joint is not None:  # one call on [S | z]: the result is again one buffer
            out = fn(joint)
            S, z = out[..., :-1], out[..., -1]
        else:
            S, z = fn(S), None if z is None else fn(z)
        return State(S, z, rule=self.rule, feature_map=self.feature_map, normalized=self.normalized)

    def to(self, *args, **kwargs) -> State:
        """Same as ``Tensor.to`` applied to S and z, e.g. ``state.to("cuda")`` or ``state.to(torch.float64)``."""
        return self._map(lambda x: x.to(*args, **kwargs))

    def clone(self) -> State:
        """A copy with its own memory (S and z still one buffer if they were): updating one never changes the other."""
        return self._map(lambda x: x.clone(memory_format=torch.contiguous_format))

    def detach(self) -> State:
        """Cut the autograd graph, e.g. between training segments (truncated backprop through time)."""
        return self._map(torch.Tensor.detach)

    def __repr__(self) -> str:
        def desc(x: torch.Tensor | None) -> str:
            return "None" if x is None else f"[{', '.join(map(str, x.shape))}] {str(x.dtype).removeprefix('torch.')}"

        parts = [f"S={desc(self.S)}", f"z={desc(self.z)}", f"device={self.device}", f"nbytes={self.nbytes:,}"]
        if self.S.requires_grad or (self.z is not None and self.z.requires_grad):
            parts.append("requires_grad=True")
        for name in ("rule", "feature_map", "normalized"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        return f"State({', '.join(parts)})"
