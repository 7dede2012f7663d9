"""Argument checks the `linattn.nn` modules share, so that a bad argument is a ``ValueError``/``TypeError``
naming it, raised before any work, never a traceback from inside torch.

Rules the public API already has are reused from `linattn.checks` (``check_cu_seqlens``, ``check_form``,
``check_flag``, ``check_backend``); what only a module knows (its width, its
parameters' dtype and device, what its cache must hold) is checked here.
"""

from __future__ import annotations

import math
import sys

import torch

from linattn.checks import check_cu_seqlens


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """An int (not a bool) from ``minimum`` to 2**63 - 1, the largest size torch takes."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= {minimum}, got {type(value).__name__} {value!r}")
    if not minimum <= value <= sys.maxsize:
        raise ValueError(f"{name} must be an int from {minimum} to 2**63 - 1, got {value}")
    return value


def check_optional_int(name: str, value: object, minimum: int = 1) -> int | None:
    return None if value is None else check_int(name, value, minimum)


def check_positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    """A finite real number > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def check_range(name: str, value: object) -> tuple[float, float]:
    """A (low, high) pair of finite numbers with 0 < low <= high."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise TypeError(f"{name} must be a (low, high) pair of numbers, got {type(value).__name__} {value!r}")
    lo, hi = (check_positive_number(name, v) for v in value)
    if lo > hi:
        raise ValueError(f"{name} must have low <= high, got ({', '.join(map(str, value))})")
    return lo, hi


def check_optional_bool(name: str, value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool or None, got {type(value).__name__}")
    return value


def check_x(x: object, hidden_size: int, weight: torch.Tensor) -> tuple[int, int]:
    """``x [B, T, hidden_size]``, floating, in the dtype and on the device of the module's ``weight``; (B, T)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [B, T, hidden_size], got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != hidden_size:
        raise ValueError(f"x must be [B, T, hidden_size] = [B, T, {hidden_size}], got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"x must hold at least one token in each of at least one row, got shape {tuple(x.shape)}")
    if x.dtype != weight.dtype:
        raise TypeError(
            f"x is {x.dtype} but the module's parameters are {weight.dtype}; convert one of them (module.to(dtype) "
            "or x.to(dtype))"
        )
    if x.device != weight.device:
        raise ValueError(f"x is on {x.device} but the module's parameters are on {weight.device}")
    return x.shape[0], x.shape[1]


def check_packing(cu_seqlens: object, cache: object, B: int, T: int, device) -> torch.Tensor | None:
    """``cu_seqlens`` checked by the API's own rule (int tensor 0 ... T, nondecreasing, B = 1) on ``device``."""
    if cu_seqlens is None:
        return None
    cu = check_cu_seqlens(cu_seqlens, T, B, device)
    if cache is not None:
        raise ValueError("cache: packed sequences (cu_seqlens) start from empty caches; pass cache=None")
    return cu


def check_cache_tensor(name: str, x: object, shape: tuple[int, ...], layout: str, like: torch.Tensor) -> None:
    """A cache tensor of exactly ``shape`` on the device of ``like``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(
            f"{name} must be {layout} = [{', '.join(map(str, shape))}] for this input and module, got "
            f"[{', '.join(map(str, x.shape))}] (a cache from another module or batch?)"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if x.device != like.device:
        raise ValueError(f"{name} is on {x.device} but x is on {like.device}")
