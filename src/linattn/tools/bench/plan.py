"""What a ``linattn bench`` run is, what it keeps in memory, and whether this machine can run it.

`Plan` holds every parameter of a run (recorded as ``workload`` in the result file). The byte counts come
from `linattn.tools.memory`, the project's one home for the state and KV-cache formulas; `preflight` is the
dry run's check of device, dtypes and free memory; `hardware_info` is the result file's ``hardware``.
"""

from __future__ import annotations

import contextlib
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

import linattn
from linattn.tools import memory
from linattn.tools.harness.machine import device_name, processor_name

BASELINE = "explicit_kv_history"
CANDIDATE_PATHS = {
    "accumulate": "fixed_recurrent_state",
    "gated": "fixed_recurrent_state_gated",
    "delta": "fixed_recurrent_state_delta",
    "gated_delta": "fixed_recurrent_state_gated_delta",
}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_LENGTHS = (512, 2048, 8192)
MIB = 2**20


# Per rule: (feature-map name, map for linattn, map for the reference): the library's built-in maps, which the
# reference knows by name. Normalized rules need positive features; the delta rules write with unit keys (the
# "l2" map, as flash-linear-attention's use_qk_l2norm_in_kernel) so that beta in (0, 1) keeps the write stable
# (docs/mechanism.md §3).
FEATURES: dict[str, tuple[str, Any, Any]] = {
    "accumulate": ("relu1", "relu1", "relu1"),
    "gated": ("relu1", "relu1", "relu1"),
    "delta": ("l2", "l2", "l2"),
    "gated_delta": ("l2", "l2", "l2"),
}


def normalizes(rule: str) -> bool:
    """Whether the rule keeps the normalizer z next to S (the library's default for that rule)."""
    return rule in ("accumulate", "gated")


def rule_extras(rule: str, g: Any, beta: Any) -> dict[str, Any]:
    """The ``g``/``beta`` keywords of a call for ``rule``: the gate for gated rules, the write strength for
    delta rules, None otherwise (the API and the reference take the same names)."""
    return {
        "g": g if rule in ("gated", "gated_delta") else None,
        "beta": beta if rule in ("delta", "gated_delta") else None,
    }


def _int_at_least(value: object, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


@dataclass(frozen=True)
class Plan:
    """Everything that defines a run; ``device`` and ``dtype`` are already resolved (no 'auto')."""

    sequence_lengths: tuple[int, ...] = DEFAULT_LENGTHS
    query_heads: int = 8
    head_dim: int = 64
    batch: int = 1
    dtype: str = "float32"
    state_dtype: str = "float32"
    warmup: int = 10
    repeats: int = 100
    seed: int = 0
    device: str = "cpu"
    rules: tuple[str, ...] = ("accumulate",)

    def __post_init__(self) -> None:
        for name in ("query_heads", "head_dim", "batch", "repeats"):
            if not _int_at_least(getattr(self, name), 1):
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not _int_at_least(self.warmup, 0):
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if not self.sequence_lengths or any(not _int_at_least(n, 2) for n in self.sequence_lengths):
            raise ValueError(f"sequence_lengths must be ints >= 2, got {self.sequence_lengths!r}")
        if len(set(self.sequence_lengths)) != len(self.sequence_lengths):
            raise ValueError(f"sequence_lengths must not repeat, got {self.sequence_lengths!r}")
        for name in ("dtype", "state_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"{name} must be one of {', '.join(map(str, DTYPES))}, got {getattr(self, name)!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda' once resolved, got {self.device!r}")
        if (
            not self.rules
            or any(r not in CANDIDATE_PATHS for r in self.rules)
            or len(set(self.rules)) != len(self.rules)
        ):
            raise ValueError(f"rules must be distinct names from {', '.join(CANDIDATE_PATHS)}, got "
                             f"{', '.join(map(str, self.rules)) or '(none)'}")

    @property
    def reference_check_length(self) -> int:
        return min(self.sequence_lengths)

    @property
    def candidate_paths(self) -> list[str]:
        return [CANDIDATE_PATHS[r] for r in self.rules]

    def workload(self) -> dict[str, Any]:
        return {
            "sequence_lengths": list(self.sequence_lengths),
            "query_heads": self.query_heads,
            "head_dim": self.head_dim,
            "batch": self.batch,
            "dtype": self.dtype,
            "state_dtype": self.state_dtype,
            "warmup": self.warmup,
            "repeats": self.repeats,
            "seed": self.seed,
            "device": self.device,
            "rules": list(self.rules),
            "reference_check_length": self.reference_check_length,
        }


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"512,2048,8192"`` -> ``(512, 2048, 8192)``, sorted; each must be an int >= 2, none repeated."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ValueError("sequence lengths: give at least one, e.g. 512,2048,8192")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"sequence lengths must be comma-separated integers, got {text!r}") from None
    if any(v < 2 for v in values):
        raise ValueError(f"sequence lengths must be >= 2 (history plus the decoded token), got {text!r}")
    if len(set(values)) != len(values):
        raise ValueError(f"sequence lengths must not repeat, got {text!r}")
    return tuple(sorted(values))


def resolve_device(requested: str, cuda_available: bool) -> str:
    """'auto' is cuda when available, else cpu; 'cpu'/'cuda' stay as asked (a missing GPU fails in preflight)."""
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {requested!r}")
    return requested


def resolve_dtype(requested: str, device: str) -> str:
    """'auto' is bfloat16 on CUDA (the decoding dtype there) and float32 on the CPU."""
    if requested == "auto":
        return "bfloat16" if device == "cuda" else "float32"
    if requested not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(map(str, DTYPES))}, got {requested!r}")
    return requested


# ------------------------------------------------------------------------------------------- bytes (one layer)
# Thin names for one attention layer, in the bench's argument order; the formulas live in linattn.tools.memory.
def kv_history_bytes(batch: int, heads: int, length: int, head_dim: int, dtype: str) -> int:
    """K and V for ``length`` tokens: 2 * B * H * L * D * bytes per element."""
    return memory.kv_cache_bytes(batch, 1, heads, head_dim, length, dtype)


def recurrent_state_bytes(batch: int, heads: int, key_dim: int, value_dim: int, dtype: str, normalizer: bool) -> int:
    """S plus z (B * H * Dk more elements) when the rule keeps a normalizer."""
    return memory.state_bytes(batch, 1, heads, key_dim, value_dim, dtype, normalizer=normalizer)


def state_matrix_bytes(batch: int, heads: int, key_dim: int, value_dim: int, dtype: str) -> int:
    """S alone: B * H * Dk * Dv * bytes per element."""
    return recurrent_state_bytes(batch, heads, key_dim, value_dim, dtype, normalizer=False)


def estimate_bytes(plan: Plan) -> dict[str, int]:
    """Rough upper bound of what the run holds at its largest L: host (token stream) and device (one path)."""
    B, H, D, L = plan.batch, plan.query_heads, plan.head_dim, max(plan.sequence_lengths)
    token_b, state_b = memory.dtype_bytes(plan.dtype), memory.dtype_bytes(plan.state_dtype)
    tokens = B * H * L * (3 * D + 2)
    host = tokens * (4 + token_b)  # drawn in float32, kept in --dtype
    kv = kv_history_bytes(B, H, L, D, plan.dtype)
    # Prefill of the state: inputs in --dtype, their casts to --state-dtype, and chunk-sized intermediates.
    prefill = B * H * L * (3 * D * token_b + (4 * D + 2 * 64) * state_b)
    device = max(kv + B * H * L * 4, prefill)
    return {"host": host + (device if plan.device == "cpu" else 0), "device": device}


# ------------------------------------------------------------------------------------------- preflight
def _available_host_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return None


def _dtype_smoke_test(plan: Plan) -> None:
    """A tiny baseline step, and per rule a tiny chunk-form prefill plus an in-place step, on the device in the
    plan's dtypes: exactly the calls the run makes (raises if one is unsupported there)."""
    dev, dt, sdt = plan.device, DTYPES[plan.dtype], DTYPES[plan.state_dtype]
    x = torch.randn(1, 2, 4, 8, device=dev).to(dt)
    F.scaled_dot_product_attention(x[:, :, :1], x, x)
    q = torch.randn(1, 2, 8, device=dev).to(dt)
    x3 = q.unsqueeze(1).expand(-1, 3, -1, -1)  # 3 tokens
    g, beta = torch.full((1, 2), -0.1, device=dev, dtype=dt), torch.full((1, 2), 0.5, device=dev, dtype=dt)
    for rule in plan.rules:
        fmap = FEATURES[rule][1]
        extra = rule_extras(rule, g, beta)
        seq = {n: None if t is None else t.unsqueeze(1).expand(-1, 3, -1) for n, t in extra.items()}
        try:
            _, state = linattn.linear_attention(
                x3, x3, x3, rule=rule, form="chunk", feature_map=fmap, state_dtype=sdt, output_final_state=True, **seq
            )
            linattn.step(q, q, q, state, rule=rule, feature_map=fmap, inplace=True, **extra)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise RuntimeError(f"rule {rule}: {exc}") from exc


def preflight(
    plan: Plan,
    *,
    cuda_available: bool | None = None,
    available_bytes: int | None = None,
    smoke_test: Callable[[Plan], None] = _dtype_smoke_test,
) -> tuple[list[dict[str, Any]], dict[str, str] | None]:
    """Check the device exists, the dtypes run there and the memory fits. Returns (checks, failure or None).

    ``cuda_available`` and ``available_bytes`` default to what this machine reports; tests pass them in.
    """
    checks: list[dict[str, Any]] = []
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available

    def passed(name: str, detail: str) -> None:
        checks.append({"check": name, "ok": True, "detail": detail})

    def fail(name: str, detail: str):
        checks.append({"check": name, "ok": False, "detail": detail})
        return checks, {"stage": "preflight", "message": f"{name}: {detail}"}

    if plan.device == "cuda" and not cuda_available:
        return fail(
            "device",
            f"--device cuda but torch.cuda.is_available() is False (torch {torch.__version__}, "
            f"built with CUDA {torch.version.cuda})",
        )
    passed("device", device_name(plan.device))
    try:
        smoke_test(plan)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as exc:
        return fail("dtype", f"dtype {plan.dtype} / state dtype {plan.state_dtype} failed on {plan.device}: {exc}")
    passed("dtype", f"{plan.dtype} inputs, {plan.state_dtype} state")
    need = estimate_bytes(plan)["device" if plan.device == "cuda" else "host"]
    if available_bytes is None:
        available_bytes = torch.cuda.mem_get_info()[0] if plan.device == "cuda" else _available_host_bytes()
    if available_bytes is None:
        passed("memory", f"needs ~{need / MIB:.0f} MiB; free memory unknown")
    elif need > 0.8 * available_bytes:
        return fail("memory", f"needs ~{need / MIB:.0f} MiB but only {available_bytes / MIB:.0f} MiB is free")
    else:
        passed("memory", f"needs ~{need / MIB:.0f} of {available_bytes / MIB:.0f} MiB free")
    return checks, None


# ------------------------------------------------------------------------------------------- hardware
def hardware_info(device: str) -> dict[str, Any]:
    cuda = device == "cuda" and torch.cuda.is_available()
    return {
        "device": device,
        "device_name": device_name(device),
        "cpu_model": processor_name(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
    }
