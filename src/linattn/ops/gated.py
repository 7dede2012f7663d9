"""Gated linear attention, S_t = diag(a_t) S_{t-1} + k_t v_t^T with a_t = exp(g_t), in every form.

``g`` is ``[B, H, T]`` (one gate per head) or ``[B, H, T, Dk]`` (one per key channel), or ``None``: then a = 1 and
this is plain accumulating linear attention (``linattn.ops.accumulate`` reuses these kernels), with all decay
work skipped. Gates stay in log space; inside a chunk only differences G_i - G_j of cumulative sums with j <= i
are exponentiated, so nothing overflows however small the gates (see NOTES.md section 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _per_channel(g: torch.Tensor | None, q: torch.Tensor) -> bool:
    return g is not None and g.dim() == q.dim()


# ---------------------------------------------------------------------------------------------- recurrent
def recurrent(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None):
    """Token loop: the definition every other form must reproduce."""
    S = initial_state
    outputs = []
    for t in range(q.shape[2]):
        if g is not None:
            S = S * (g[:, :, t, :, None] if _per_channel(g, q) else g[:, :, t, None, None]).exp()
        S = S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(outputs, dim=2), S


# ---------------------------------------------------------------------------------------------- step
def step(q, k, v, *, g=None, beta=None, state, inplace=False):
    """One token: q, k [B, H, Dk], v [B, H, Dv], g [B, H] or [B, H, Dk], state [B, H, Dk, Dv]."""
    B, H, Dk = k.shape
    Dv = v.shape[-1]
    if inplace:
        if g is not None:
            state.mul_(g.exp()[..., None] if g.dim() == 3 else g.exp()[..., None, None])
        # S += k v^T without materializing the outer product: one read and one write of the state.
        state.view(B * H, Dk, Dv).baddbmm_(k.reshape(B * H, Dk, 1), v.reshape(B * H, 1, Dv))
        S = state
    else:
        S = state if g is None else state * (g.exp()[..., None] if g.dim() == 3 else g.exp()[..., None, None])
        S = S + k[..., :, None] * v[..., None, :]
    o = torch.matmul(q.unsqueeze(-2), S).squeeze(-2)
    return o, S


# ---------------------------------------------------------------------------------------------- parallel
def _log_cumsum(g: torch.Tensor, dim: int) -> torch.Tensor:
    """Cumulative log-gate in float64: later differences G_i - G_j would otherwise cancel catastrophically
    (after a strong decay |G| is large while G_i - G_j is small). Exponents are cast back just before exp."""
    return g.to(torch.float64).cumsum(dim=dim)


def _exp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).exp()


def _masked_exp_diff(G: torch.Tensor, dtype: torch.dtype, inclusive: bool = True) -> torch.Tensor:
    """exp(G_i - G_j) for j <= i (j < i if not inclusive), 0 elsewhere; G [..., T] -> [..., T, T] in ``dtype``.

    The mask goes in before the exp, so the positive differences above the diagonal never overflow.
    """
    T = G.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=G.device).tril(0 if inclusive else -1)
    diff = G[..., :, None] - G[..., None, :]
    return _exp(torch.where(mask, diff, torch.full_like(diff, float("-inf"))), dtype)


def parallel(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None):
    """Dense masked T x T form: O = [(Q K^T) * decay * M] V + (Q * exp(G)) S0. Memory O(T^2) (O(T^2 Dk) per channel)."""
    T = q.shape[2]
    S0 = initial_state
    if g is None:
        A = torch.matmul(q, k.transpose(-1, -2)).tril()
        return torch.matmul(A, v) + torch.matmul(q, S0), S0 + torch.matmul(k.transpose(-1, -2), v)
    G = _log_cumsum(g, dim=2)
    dt = q.dtype
    if _per_channel(g, q):
        # A_ij = sum_c q_ic k_jc exp(G_ic - G_jc): the decay differs per channel, so no single matmul computes it.
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]
        decay = _exp(torch.where(mask[..., None], diff, torch.full_like(diff, float("-inf"))), dt)
        A = torch.einsum("bhic,bhjc,bhijc->bhij", q, k, decay)
        G_last = G[:, :, -1:, :]
        S = _exp(G_last, dt).transpose(-1, -2) * S0 + torch.matmul((k * _exp(G_last - G, dt)).transpose(-1, -2), v)
        return torch.matmul(A, v) + torch.matmul(q * _exp(G, dt), S0), S
    A = torch.matmul(q, k.transpose(-1, -2)) * _masked_exp_diff(G, dt)
    G_last = G[:, :, -1:]
    S = _exp(G_last, dt)[..., None] * S0 + torch.matmul((k * _exp(G_last - G, dt)[..., None]).transpose(-1, -2), v)
    return torch.matmul(A, v) + torch.matmul(q * _exp(G, dt)[..., None], S0), S


# ---------------------------------------------------------------------------------------------- scan
def scan(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None):
    """Associative scan over per-token affine maps S -> a S + k v^T, combined in log2(T) doubling rounds.

    (a2, B2) o (a1, B1) = (a2 a1, a2 B1 + B2): after round r each position holds the composition of the last 2^r
    maps ending there (Hillis-Steele). Memory O(T Dk Dv) per head: a reference form for the composition rule that
    sequence parallelism uses, not the fast path.
    """
    T = q.shape[2]
    Bm = k[..., :, None] * v[..., None, :]  # [B, H, T, Dk, Dv]
    if g is None:
        log_a = None
    elif _per_channel(g, q):
        log_a = g[..., None]  # [B, H, T, Dk, 1]
    else:
        log_a = g[..., None, None]  # [B, H, T, 1, 1]
    shift = 1
    while shift < T:
        later, earlier = Bm[:, :, shift:], Bm[:, :, :-shift]
        if log_a is None:
            Bm = torch.cat([Bm[:, :, :shift], later + earlier], dim=2)
        else:
            Bm = torch.cat([Bm[:, :, :shift], log_a[:, :, shift:].exp() * earlier + later], dim=2)
            log_a = torch.cat([log_a[:, :, :shift], log_a[:, :, shift:] + log_a[:, :, :-shift]], dim=2)
        shift *= 2
    S_all = Bm + initial_state[:, :, None] if log_a is None else Bm + log_a.exp() * initial_state[:, :, None]
    o = torch.einsum("bhtk,bhtkv->bhtv", q, S_all)
    return o, S_all[:, :, -1].clone()  # a copy, so the state does not keep all T prefix states alive


# ---------------------------------------------------------------------------------------------- chunk
def _to_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """[B, H, T, ...] zero-padded to a multiple of C and viewed as [B, H, n, C, ...].

    Padded tokens have k = v = 0 and log-gate 0 (a = 1), so they leave the state unchanged.
    """
    T = x.shape[2]
    pad = (-T) % C
    if pad:
        widths = [0, 0] * (x.dim() - 3) + [0, pad]
        x = F.pad(x, widths)
    return x.reshape(*x.shape[:2], -1, C, *x.shape[3:])


def _sub_block(C: int, limit: int = 16) -> int:
    """Largest divisor of C that is at most ``limit``: the exact-decay diagonal block of the per-channel form."""
    return max(d for d in range(1, min(C, limit) + 1) if C % d == 0)


def _intra_per_channel(q, k, G):
    """A_ij = sum_c q_ic k_jc exp(G_ic - G_jc) for j <= i inside each chunk, without overflow.

    Split the chunk into sub-blocks of s tokens. For a key j before query sub-block I, factor the decay through
    r_I, the cumulative gate just before I: exp(G_i - r_I) * exp(r_I - G_j), both factors <= 1, so one matmul per
    sub-block. Inside a sub-block the decay is taken exactly from an [s, s, Dk] tensor.
    q, k, G: [B, H, n, C, Dk] -> A [B, H, n, C, C].
    """
    *lead, C, Dk = q.shape
    s = _sub_block(C)
    m = C // s
    Gs = G.reshape(*lead, m, s, Dk)
    # r_I: cumulative gate before sub-block I (0 before the first one).
    r = torch.cat([torch.zeros_like(Gs[..., :1, 0, :]), Gs[..., :-1, -1, :]], dim=-2)  # [..., m, Dk]
    q_scaled = q.reshape(*lead, m, s, Dk) * _exp(Gs - r[..., None, :], q.dtype)
    before = torch.arange(C, device=q.device)[None, :] < (torch.arange(m, device=q.device) * s)[:, None]  # [m, C]
    expo = r[..., :, None, :] - G[..., None, :, :]  # [..., m, C, Dk]
    k_scaled = k[..., None, :, :] * _exp(
        torch.where(before[..., None], expo, torch.full_like(expo, float("-inf"))), k.dtype
    )
    A = torch.matmul(q_scaled, k_scaled.transpose(-1, -2))  # [..., m, s, C]
    # Diagonal sub-blocks, exact.
    ks = k.reshape(*lead, m, s, Dk)
    inner = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    diff = Gs[..., :, None, :] - Gs[..., None, :, :]
    decay = _exp(torch.where(inner[..., None], diff, torch.full_like(diff, float("-inf"))), q.dtype)
    A_diag = torch.einsum("...ic,...jc,...ijc->...ij", q.reshape(*lead, m, s, Dk), ks, decay)  # [..., m, s, s]
    A = A.reshape(*lead, m, s, m, s)
    idx = torch.arange(m, device=q.device)
    A[..., idx, :, idx, :] = A[..., idx, :, idx, :] + A_diag.movedim(-3, 0)
    return A.reshape(*lead, C, C)


def chunk(q, k, v, *, g=None, beta=None, initial_state, chunk_size=64):
    """Chunkwise form: exact attention inside chunks of C tokens, the state carried across chunks.

    All chunks' inner products are batched matmuls; only the carry S_{c+1} = a_c S_c + dS_c is a loop over chunks
    (a cumulative sum when ungated). Then every chunk reads its incoming state in one batched matmul.
    """
    B, H, T, Dk = q.shape
    C = min(chunk_size, T)
    qc, kc, vc = _to_chunks(q, C), _to_chunks(k, C), _to_chunks(v, C)
    n, Dv = qc.shape[2], vc.shape[-1]
    S0 = initial_state
    if g is None:
        A = torch.matmul(qc, kc.transpose(-1, -2)).tril_()
        dS = torch.matmul(kc.transpose(-1, -2), vc)  # [B, H, n, Dk, Dv]
        # Exclusive prefix sum: the state entering chunk c is S0 plus the writes of chunks 0..c-1.
        S_before = torch.cat([S0[:, :, None], dS[:, :, :-1]], dim=2).cumsum(dim=2)
        S_final = S_before[:, :, -1] + dS[:, :, -1]
        q_in = qc
    else:
        Gc = _log_cumsum(_to_chunks(g, C), dim=3)  # cumulative log-gate inside each chunk, float64
        dt = q.dtype
        if _per_channel(g, q):
            G_last = Gc[:, :, :, -1:, :]  # [B, H, n, 1, Dk]
            A = _intra_per_channel(qc, kc, Gc)
            q_in = qc * _exp(Gc, dt)
            k_out = kc * _exp(G_last - Gc, dt)
            chunk_decay = _exp(G_last, dt).transpose(-1, -2)  # [B, H, n, Dk, 1]
        else:
            G_last = Gc[:, :, :, -1:]  # [B, H, n, 1]
            A = torch.matmul(qc, kc.transpose(-1, -2)) * _masked_exp_diff(Gc, dt)
            q_in = qc * _exp(Gc, dt)[..., None]
            k_out = kc * _exp(G_last - Gc, dt)[..., None]
            chunk_decay = _exp(G_last, dt)[..., None]  # [B, H, n, 1, 1]
        dS = torch.matmul(k_out.transpose(-1, -2), vc)
        states = [S0]
        for c in range(n):
            states.append(torch.addcmul(dS[:, :, c], chunk_decay[:, :, c], states[-1]))
        S_before = torch.stack(states[:-1], dim=2)
        S_final = states[-1]
    # o = A V + Q_in S_before, the add fused into the second product.
    o = torch.baddbmm(
        torch.matmul(A, vc).view(-1, C, Dv), q_in.reshape(-1, C, Dk), S_before.reshape(-1, Dk, Dv)
    ).view(B, H, n * C, Dv)
    return o[:, :, :T], S_final


FORMS = {"recurrent": recurrent, "chunk": chunk, "parallel": parallel, "scan": scan}
