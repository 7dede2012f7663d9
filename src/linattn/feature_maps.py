"""Feature maps phi applied to queries and keys before the recurrence.

A map takes ``[..., D]`` and returns ``[..., r]``; ``r`` (the feature width) is the state's key dimension.
Normalized linear attention needs non-negative features so that the denominator phi(q)^T z stays positive.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


def relu1(x: torch.Tensor) -> torch.Tensor:
    """relu(x) + 1: strictly positive, the map of the float64 reference."""
    return F.relu(x) + 1


def elu1(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1: strictly positive (Katharopoulos et al., 2020).

    Written as exp(min(x, 0)) + relu(x), i.e. x + 1 for x > 0 and exp(x) otherwise: the same function, but
    ``elu(x) + 1`` rounds to exactly 0 for very negative x (e.g. -20 in float32), which would zero the token's key
    instead of shrinking it. Two passes fewer than a ``torch.where`` of both branches (3x faster on a CPU); the
    derivative at 0 is 1 (relu's is 0 there). Without autograd, two of its temporaries are reused in place (on a
    CPU each fresh full-size tensor costs its page faults).
    """
    if torch.is_grad_enabled():
        return torch.exp(x.clamp_max(0)) + torch.relu(x)
    return x.clamp_max(0).exp_().add_(torch.relu(x))


def identity(x: torch.Tensor) -> torch.Tensor:
    """No map: q and k are used as given (the usual choice for delta rules, with L2-normalized keys)."""
    return x


def l2(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6): the L2 normalization flash-linear-attention and HF Qwen3-Next apply to q and k
    inside their delta-rule kernels (``use_qk_l2norm_in_kernel``), with their epsilon inside the root."""
    n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)  # one read of x (x * x then sum: three passes, 3x slower)
    # expand_as: torch's CPU loop for a size-1 last dimension broadcast ran 4-5x slower than over the expanded view
    return x * torch.rsqrt(n * n + 1e-6).expand_as(x)


def taylor2(x: torch.Tensor) -> torch.Tensor:
    """Second-order Taylor map of Based (Arora et al., 2024): width 1 + D + D^2.

    phi(q).phi(k) = 1 + (q.k)/sqrt(D) + (q.k)^2 / (2 D), the expansion of exp(q.k / sqrt(D)) to second order.
    Its values can be negative but the dot product 1 + s + s^2/2 is always > 0.
    """
    d = x.shape[-1]
    x = x / d**0.25  # so that first-order term is q.k / sqrt(D)
    ones = torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)
    outer = (x.unsqueeze(-1) * x.unsqueeze(-2)).flatten(-2) / math.sqrt(2)
    return torch.cat([ones, x, outer], dim=-1)


FEATURE_MAPS: dict[str, FeatureMap] = {
    "relu1": relu1, "elu1": elu1, "identity": identity, "taylor2": taylor2, "l2": l2,
}


def resolve_feature_map(feature_map: str | FeatureMap | None) -> FeatureMap | None:
    """Turn the ``feature_map`` argument into a callable (``None`` stays ``None``: inputs are features already)."""
    if feature_map is None or callable(feature_map):
        return feature_map
    if isinstance(feature_map, str):
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map: unknown name {feature_map!r}; expected one of "
                             f"{', '.join(sorted(FEATURE_MAPS))}")
        return FEATURE_MAPS[feature_map]
    raise TypeError(f"feature_map must be None, a name or a callable, got {type(feature_map).__name__}")


_BUILTIN_IDS = frozenset(map(id, FEATURE_MAPS.values()))


def feature_map_name(feature_map: str | FeatureMap | None) -> str:
    """The name a [`State`][linattn.State] records for the map that made it.

    ``None`` is ``"identity"`` (the same function); a built-in map is its name however it is passed; any other
    callable is its module and qualified name (``functools.partial`` names its function). Two callables are
    told apart only by that name, so a lambda rebuilt at every decode step still matches its own state.
    """
    if feature_map is None:
        return "identity"
    if isinstance(feature_map, str):
        return feature_map
    if id(feature_map) in _BUILTIN_IDS:
        return next(name for name, f in FEATURE_MAPS.items() if f is feature_map)
    if isinstance(feature_map, functools.partial):
        return f"partial({feature_map_name(feature_map.func)})"
    named = feature_map if hasattr(feature_map, "__qualname__") else type(feature_map)
    return f"{getattr(named, '__module__', None) or '?'}.{named.__qualname__}"


def check_features(x: torch.Tensor, phi: object, feature_map: FeatureMap) -> None:
    """What a callable ``feature_map`` returned for ``x [..., D]`` must be: a ``[..., r]`` tensor (r >= 1), token by
    token, in x's dtype and on x's device. Built-in maps are not checked (they are, by the tests)."""
    if id(feature_map) in _BUILTIN_IDS:
        return
    name = feature_map_name(feature_map)
    if not isinstance(phi, torch.Tensor):
        raise TypeError(f"feature_map {name!r} must return a torch.Tensor, got {type(phi).__name__}")
    if phi.dim() != x.dim() or phi.shape[:-1] != x.shape[:-1]:
        raise ValueError(
            f"feature_map {name!r} must map [..., D] to [..., r] token by token, but for input {tuple(x.shape)} it "
            f"returned {tuple(phi.shape)}"
        )
    if phi.shape[-1] == 0:
        raise ValueError(f"feature_map {name!r} returned features of width 0 (shape {tuple(phi.shape)}); need r >= 1")
    if phi.dtype != x.dtype:
        raise TypeError(
            f"feature_map {name!r} returned {phi.dtype} features for {x.dtype} input; it must keep the dtype "
            "(linattn hands it inputs already in the accumulation dtype)"
        )
    if phi.device != x.device:
        raise ValueError(f"feature_map {name!r} returned features on {phi.device} for input on {x.device}")
