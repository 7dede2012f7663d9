"""Block sizes, constants and the chunk gate helper the Triton kernels share (importing this module needs triton)."""

from __future__ import annotations

import triton
import triton.language as tl

from linattn.ops.common import LOG_GATE_FLOOR

GATE_NONE, GATE_HEAD, GATE_CHANNEL, GATE_VALUE = 0, 1, 2, 3  # GATE_VALUE: per value column (backward only)
# The kernels hold a whole [Dk, BV] state block in registers: the key width is one block.
MAX_DK = 256

__all__ = [
    "GATE_NONE", "GATE_HEAD", "GATE_CHANNEL", "GATE_VALUE", "MAX_DK", "LOG_GATE_FLOOR", "CHUNK_SIZES", "block_k",
    "block_v", "block_t", "check_chunk_size", "gates",
]


def block_k(Dk: int) -> int:
    """The whole key width, a power of two >= 16 (tl.dot's smallest tile)."""
    return max(16, triton.next_power_of_2(Dk))


def block_v(Dv: int) -> int:
    """Value columns per program: independent columns, so the value width is split across programs."""
    return max(16, min(64, triton.next_power_of_2(Dv)))


# Tokens per chunk the kernels take: tl.dot's smallest tile is 16, and a [64, 64] tile of scores (plus the delta
# rules' [64, 64] inverse) is the most a program keeps in registers.
CHUNK_SIZES = (16, 32, 64)


def check_chunk_size(chunk_size: int) -> str | None:
    """Why the Triton chunk kernels cannot take ``chunk_size``; None if they can."""
    if isinstance(chunk_size, bool) or chunk_size not in CHUNK_SIZES:
        sizes = ", ".join(map(str, CHUNK_SIZES))
        return f"chunk_size: the Triton chunk kernels take {sizes} tokens, got {chunk_size!r}"
    return None


def block_t(chunk_size: int) -> int:
    """Tokens per chunk: ``chunk_size`` itself, one of CHUNK_SIZES (anything else is a ValueError naming it)."""
    why = check_chunk_size(chunk_size)
    if why is not None:
        raise ValueError(why)
    return chunk_size


def gate_kind(g, x_dim: int) -> int:
    """GATE_NONE, GATE_HEAD (g has one dimension fewer than q) or GATE_CHANNEL (g shaped like q)."""
    if g is None:
        return GATE_NONE
    return GATE_CHANNEL if g.dim() == x_dim else GATE_HEAD


@triton.jit
def gates(g_base, sg_t, t, mt, causal, ACC: tl.constexpr, FLOOR: tl.constexpr):
    """(exp(G_i - G_j) masked to j <= i, exp(G), exp(G_last - G), exp(G_last)) of one chunk, G in float64."""
    g = tl.load(g_base + t * sg_t, mask=mt, other=0.0).to(tl.float64)  # padded tokens: g = 0, a = 1
    g = tl.maximum(g, FLOOR)
    G = tl.cumsum(g, axis=0)
    G_last = tl.sum(g, axis=0)
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")).to(ACC))
    return decay, tl.exp(G.to(ACC)), tl.exp((G_last - G).to(ACC)), tl.exp(G_last.to(ACC))
