"""The recurrent state that replaces the KV cache: ``S`` (key x value memory) and, for normalized rules, ``z``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class State:
    """Fixed-size state of one linear-attention layer.

    Attributes:
        S: ``[B, H, Dk, Dv]`` memory; ``Dk`` is the feature width (after the feature map).
        z: ``[B, H, Dk]`` running sum of key features (the normalizer), or ``None`` for rules without one
            (delta, gated delta, or ``normalize=False``).
    """

    S: torch.Tensor
    z: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.S, torch.Tensor):
            raise TypeError(f"State.S must be a torch.Tensor, got {type(self.S).__name__}")
        if self.S.dim() != 4:
            raise ValueError(f"State.S must be [B, H, Dk, Dv], got shape {tuple(self.S.shape)}")
        if self.z is not None:
            if not isinstance(self.z, torch.Tensor):
                raise TypeError(f"State.z must be a torch.Tensor or None, got {type(self.z).__name__}")
            if tuple(self.z.shape) != tuple(self.S.shape[:3]):
                raise ValueError(
                    f"State.z must be [B, H, Dk] = {tuple(self.S.shape[:3])} to match S, got {tuple(self.z.shape)}"
                )
            if self.z.device != self.S.device or self.z.dtype != self.S.dtype:
                raise ValueError(
                    f"State.z ({self.z.dtype}, {self.z.device}) must match S ({self.S.dtype}, {self.S.device})"
                )

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
        """An empty state (no history yet)."""
        S = torch.zeros(batch, heads, key_dim, value_dim, dtype=dtype, device=device)
        z = torch.zeros(batch, heads, key_dim, dtype=dtype, device=device) if normalizer else None
        return cls(S, z)

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

    def to(self, *args, **kwargs) -> State:
        """Same as ``Tensor.to`` applied to S and z, e.g. ``state.to("cuda")`` or ``state.to(torch.float64)``."""
        return State(self.S.to(*args, **kwargs), None if self.z is None else self.z.to(*args, **kwargs))

    def clone(self) -> State:
        return State(self.S.clone(), None if self.z is None else self.z.clone())

    def detach(self) -> State:
        """Cut the autograd graph, e.g. between training segments (truncated backprop through time)."""
        return State(self.S.detach(), None if self.z is None else self.z.detach())
