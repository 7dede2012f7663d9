"""Gated linear attention, S_t = diag(a_t) S_{t-1} + k_t v_t^T with a_t = exp(g_t), in every form.

``g`` is ``[B, H, T]`` (one gate per head) or ``[B, H, T, Dk]`` (one per key channel), or ``None``: then a = 1 and
this is plain accumulating linear attention (``linattn.ops.accumulate`` reuses these kernels), with all decay
work skipped. Gates stay in log space; inside a chunk only differences G_i - G_j of cumulative sums with j <= i
are exponentiated, so nothing overflows however small the gates (see docs/mechanism.md §2). The sums are formed by
``common.log_cumsum``, which floors each gate first: g = -inf is then an exact reset (the state before it is
forgotten) in every form, and huge finite gates (-1e30) leave the later small differences intact.

`chunk_grouped` is the chunk form for one gate per head with q/k shared by groups of value heads (Mamba-2's scan),
in the public layout, each group's heads in one matrix product: what the CPU backend runs for such prefills.
"""

from __future__ import annotations

import torch

from linattn.ops.common import (
    SAFE_LOG_DECAY,
    ChunkCarry,
    exp_in,
    gate_factors,
    log_cumsum,
    masked_exp_diff,
    to_chunks,
)


def _per_channel(g: torch.Tensor | None, q: torch.Tensor) -> bool:
    return g is not None and g.dim() == q.dim()


# ---------------------------------------------------------------------------------------------- recurrent
def recurrent(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None, scale=1.0):
    """Token loop: the definition every other form must reproduce."""
    q = q * scale
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
    # per head [B, H] -> [B, H, 1, 1]; per channel [B, H, Dk] -> [B, H, Dk, 1]
    decay = None if g is None else (g.exp()[..., None] if g.dim() == 3 else g.exp()[..., None, None])
    if inplace:
        if decay is not None:
            state.mul_(decay)
        # S += k v^T without materializing the outer product: one read and one write of the state.
        state.view(B * H, Dk, Dv).baddbmm_(k.reshape(B * H, Dk, 1), v.reshape(B * H, 1, Dv))
        S = state
    else:
        S = state if decay is None else state * decay
        S = S + k[..., :, None] * v[..., None, :]
    o = torch.matmul(q.unsqueeze(-2), S).squeeze(-2)
    return o, S


# ---------------------------------------------------------------------------------------------- parallel
def parallel(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None, scale=1.0):
    """Dense masked T x T form: O = [(Q K^T) * decay * M] V + (Q * exp(G)) S0. Memory O(T^2) (O(T^2 Dk) per channel)."""
    T = q.shape[2]
    q = q * scale
    S0 = initial_state
    if g is None:
        A = torch.matmul(q, k.transpose(-1, -2)).tril()
        return torch.matmul(A, v) + torch.matmul(q, S0), S0 + torch.matmul(k.transpose(-1, -2), v)
    G = log_cumsum(g, dim=2)
    dt = q.dtype
    if _per_channel(g, q):
        # A_ij = sum_c q_ic k_jc exp(G_ic - G_jc): the decay differs per channel, so no single matmul computes it.
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        diff = G[:, :, :, None, :] - G[:, :, None, :, :]
        decay = exp_in(torch.where(mask[..., None], diff, torch.full_like(diff, float("-inf"))), dt)
        A = torch.einsum("bhic,bhjc,bhijc->bhij", q, k, decay)
        G_last = G[:, :, -1:, :]
        S = exp_in(G_last, dt).transpose(-1, -2) * S0 + torch.matmul((k * exp_in(G_last - G, dt)).transpose(-1, -2), v)
        return torch.matmul(A, v) + torch.matmul(q * exp_in(G, dt), S0), S
    A = torch.matmul(q, k.transpose(-1, -2)) * masked_exp_diff(G, dt)
    G_last = G[:, :, -1:]
    S = exp_in(G_last, dt)[..., None] * S0 + torch.matmul((k * exp_in(G_last - G, dt)[..., None]).transpose(-1, -2), v)
    return torch.matmul(A, v) + torch.matmul(q * exp_in(G, dt)[..., None], S0), S


# ---------------------------------------------------------------------------------------------- scan
def scan(q, k, v, *, g=None, beta=None, initial_state, chunk_size=None, scale=1.0):
    """Associative scan over per-token affine maps S -> a S + k v^T, combined in log2(T) doubling rounds.

    (a2, B2) o (a1, B1) = (a2 a1, a2 B1 + B2): after round r each position holds the composition of the last 2^r
    maps ending there (Hillis-Steele). Memory O(T Dk Dv) per head: a reference form for the composition rule that
    sequence parallelism uses, not the fast path.
    """
    T = q.shape[2]
    q = q * scale
    Bm = k[..., :, None] * v[..., None, :]  # [B, H, T, Dk, Dv]
    # Raw log-gates suffice here (no floor, unlike the cumulative forms): the scan only adds them, never subtracts,
    # so -inf + x = -inf and -1e30 + x stay exact decays of exactly 0, and exp(-inf) = 0 has gradient 0.
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
def _sub_block(C: int, limit: int = 8) -> int:
    """Largest divisor of C that is at most ``limit``: the exact-decay diagonal block of the per-channel form."""
    return max(d for d in range(1, min(C, limit) + 1) if C % d == 0)


def intra_per_channel(q, k, G):
    """A_ij = sum_c q_ic k_jc exp(G_ic - G_jc) for j <= i inside each chunk, without overflow.

    Split the chunk into m sub-blocks of s tokens. For a key j before query sub-block I, factor the decay through
    r_I, the cumulative gate just before I: exp(G_i - r_I) * exp(r_I - G_j), both factors <= 1, so one matmul per
    sub-block. Inside a sub-block the decay is taken exactly from an [s, s, Dk] tensor.
    q, k: [N, n, C, Dk], G: same in float64 -> A [N, n, C, C].
    """
    *lead, C, Dk = q.shape
    s = _sub_block(C)
    m = C // s
    Gs = G.reshape(*lead, m, s, Dk)
    # r_I: cumulative gate before sub-block I (0 before the first one).
    r = torch.cat([torch.zeros_like(Gs[..., :1, 0, :]), Gs[..., :-1, -1, :]], dim=-2)  # [..., m, Dk]
    q_scaled = q.reshape(*lead, m, s, Dk) * exp_in(Gs - r[..., None, :], q.dtype)
    before = torch.arange(C, device=q.device)[None, :] < (torch.arange(m, device=q.device) * s)[:, None]  # [m, C]
    expo = r[..., :, None, :] - G[..., None, :, :]  # [..., m, C, Dk]
    keys_before = torch.where(before[..., None], expo, torch.full_like(expo, -torch.inf))
    k_scaled = k[..., None, :, :] * exp_in(keys_before, k.dtype)
    A = torch.matmul(q_scaled, k_scaled.transpose(-1, -2))  # [..., m, s, C]: keys before each sub-block
    # Diagonal sub-blocks, exact, added in place on the block diagonal.
    inner = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    diff = Gs[..., :, None, :] - Gs[..., None, :, :]
    decay = exp_in(torch.where(inner[..., None], diff, torch.full_like(diff, -torch.inf)), q.dtype)
    qs, ks = q.reshape(*lead, m, s, Dk), k.reshape(*lead, m, s, Dk)
    A_diag = (qs[..., :, None, :] * ks[..., None, :, :] * decay).sum(-1)  # [..., m, s, s]
    A.view(*lead, m, s, m, s).diagonal(dim1=-4, dim2=-2).add_(A_diag.movedim(-3, -1))
    return A.reshape(*lead, C, C)


def chunk(q, k, v, *, g=None, beta=None, initial_state, chunk_size=64, scale=1.0):
    """Chunkwise form: exact attention inside chunks of C tokens, the state carried across chunks.

    All chunks' inner products are batched matmuls over [B*H*n] small matrices; only the carry
    S_{c+1} = a_c S_c + dS_c is a loop over chunks (``ChunkCarry``). Then every chunk reads its incoming state
    in one batched matmul. ``scale`` rides on the matmuls' alpha/beta, costing no pass of its own.
    """
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    C = min(chunk_size, T)
    qc, kc, vc = to_chunks(q, C), to_chunks(k, C), to_chunks(v, C)  # [N, n, C, D], N = B*H
    N, n = qc.shape[:2]
    q2, k2, v2 = qc.view(-1, C, Dk), kc.view(-1, C, Dk), vc.view(-1, C, Dv)
    if g is None:
        A = torch.bmm(q2, k2.transpose(1, 2)).tril_()
        q_in, k_out, decay = q2, k2, None
    else:
        Gc = log_cumsum(to_chunks(g, C), dim=2)  # cumulative log-gate inside each chunk, float64
        G_last = Gc[:, :, -1:]  # [N, n, 1] or [N, n, 1, Dk]
        dt = q.dtype
        if not _per_channel(g, q):  # one gate per head: broadcast over the feature dimension
            Gc, G_last = Gc[..., None], G_last[..., None]
        factors = gate_factors(Gc, dt)
        if factors is not None:  # exp(G_i - G_j) = exp(G_i) exp(-G_j): the decay rides on q and k
            e_pos, e_neg = factors
            q_in = (qc * e_pos).view(-1, C, Dk)
            A = torch.bmm(q_in, (kc * e_neg).view(-1, C, Dk).transpose(1, 2)).tril_()
        else:
            q_in = (qc * exp_in(Gc, dt)).view(-1, C, Dk)
            if _per_channel(g, q):
                A = intra_per_channel(qc, kc, Gc).view(-1, C, C)
            else:
                A = torch.bmm(q2, k2.transpose(1, 2)) * masked_exp_diff(Gc[..., 0], dt).view(-1, C, C)
        k_out = (kc * exp_in(G_last - Gc, dt)).view(-1, C, Dk)
        decay = exp_in(G_last, dt).transpose(-1, -2)  # [N, n, Dk or 1, 1]
    dS = torch.bmm(k_out.transpose(1, 2), v2).view(N, n, Dk, Dv)
    # A loop over chunks, not a weighted sum of all of them: a NaN in chunk c then cannot reach earlier chunks.
    S_before, S_final, _ = ChunkCarry.apply(dS, decay, initial_state.reshape(N, Dk, Dv))
    # o = scale * (Q_in S_before + A V): the second product accumulates in place into the first.
    o = torch.bmm(q_in, S_before.view(-1, Dk, Dv)).baddbmm_(A, v2, beta=scale, alpha=scale)
    return o.view(B, H, n * C, Dv)[:, :, :T], S_final.view(B, H, Dk, Dv)


# ---------------------------------------------------------------------------------------------- chunk_grouped
def chunk_grouped(q, k, v, g, *, initial_state, chunk_size=64, scale=1.0, out=None, v_scale=None, skip=None):
    """The chunk form for one gate per head and q/k heads shared by groups of value heads (Mamba-2's SSD), in the
    public layout, with the products of a group as single matrix products over all its value heads.

    Shapes: ``q, k [B, T, G, N]`` (G q/k groups), ``v [B, T, H, P]`` (H value heads, H a multiple of G; head h reads
    group ``h // (H // G)``), ``g [B, T, H]`` log-gates, ``initial_state [B, H, N, P]`` (not written); q, k, v and
    the state in one dtype, no autograd. ``out``: an optional contiguous ``[B, T, H, P]`` tensor the output is
    written into. Returns ``o [B, T, H, P]`` and the final state ``[B, H, N, P]``: the recurrence of `recurrent`,
    S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale * S_t^T q_t.

    Mamba-2's two extra terms ride along without passes of their own: ``v_scale [B, T, H]`` (default None: 1)
    multiplies each value row first (v_t -> v_scale_t v_t, its dt), and ``skip [H]`` or ``[H, P]`` (default None; any
    shape that broadcasts to one of them) adds ``skip * v_t`` (the unscaled row, its D x) to the output.

    Per chunk of C tokens and per group, the Hg = H / G heads of the group lie side by side in a state
    ``[N, Hg*P]``, so that each product below is one matrix product per group. With Gc the cumulative log-gate
    inside the chunk (per head), G_L its last value and m = G_L / 2 (the middle of the chunk's decay):

    * o_i = scale * exp(Gc_i - m) * (q_i S~ + sum_{j <= i} (q_i . k_j) exp(m - Gc_j) v_j), with S~ = exp(m) S the
      state kept scaled: [C, N] x [N, Hg*P] plus tril(Q K^T) [C, C] x [C, Hg*P], accumulated in one buffer. The
      factors exp(Gc_i - m) exp(m - Gc_j) = exp(Gc_i - Gc_j) stay within exp(+-SAFE_LOG_DECAY) when G_L >=
      -2 SAFE_LOG_DECAY;
    * the next chunk's scaled state: S~' = exp(m' + G_L / 2) (S~ + K^T (exp(m - Gc) * V)), m' the next chunk's
      middle (0 after the last chunk): [N, C] x [C, Hg*P], then one scaling pass, the only pass over the state.

    A head whose chunk decays further (a reset, strong gates) takes m = 0 in that chunk: its q_i S~ term is kept,
    its factored terms are zeroed, and its intra-chunk sum and state write are added exactly, from its masked
    decay matrix exp(Gc_i - Gc_j), j <= i (float64 differences). Nothing is exponentiated beyond exp(+-60);
    gates pass through `log_cumsum` (-inf is an exact reset).
    """
    B, T, G, N = q.shape
    H, P = v.shape[-2:]
    Hg, dt = H // G, initial_state.dtype
    if T == 0:
        return (torch.empty(B, 0, H, P, dtype=dt, device=v.device) if out is None else out), initial_state.clone()
    C = min(chunk_size, T)
    n = -(-T // C)
    # Chunk-local cumulative gates [B, n, C, H] in float64 (padded gates are 0: the last chunk's G_L is its own).
    Gc = log_cumsum(torch.nn.functional.pad(g, (0, 0, 0, n * C - T)).view(B, n, C, H), dim=2)
    G_L = Gc[:, :, -1:]  # [B, n, 1, H]
    factored = G_L >= -2 * SAFE_LOG_DECAY
    exact_any = (~factored).any(dim=-1)[:, :, 0].tolist()  # [B][n]: the one sync
    m = torch.where(factored, G_L / 2, 0.0)
    m_next = torch.nn.functional.pad(m[:, 1:], (0, 0, 0, 0, 0, 1))  # 0 after the last chunk: S~ is S there
    e_pos = exp_in(Gc - m, dt).mul_(scale)  # (the scale rides on the output's factor)
    e_neg = exp_in((m - Gc).clamp_(max=SAFE_LOG_DECAY), dt).mul_(factored)  # exact heads: 0
    if v_scale is not None:  # the value rows' own factor rides on the chunk's factor: no pass over v
        v_scale = torch.nn.functional.pad(v_scale.to(dt), (0, 0, 0, n * C - T)).view(B, n, C, H)
        e_neg.mul_(v_scale)
    if skip is not None:  # [H] or [H, P], or any shape that broadcasts to one of them
        skip = skip.to(dt)
        skip = (skip.expand(H) if skip.dim() <= 1 else skip.expand(H, P)).reshape(G, 1, Hg, -1)
    to_next = exp_in(m_next + G_L - m, dt)  # [B, n, 1, H], at most 1
    # Where that factor of a factored head would be subnormal (its exponent from -120 to -87 in float32: few bits
    # left), the pass is split in two factors, exp(G_L - m) and exp(m'), both at least exp(-SAFE_LOG_DECAY).
    split = ((m_next + G_L / 2 < -1.25 * SAFE_LOG_DECAY) & factored).any(dim=-1)[:, :, 0].tolist()
    halves = exp_in(G_L - m, dt), exp_in(m_next, dt)
    S = torch.empty(B, G, N, Hg * P, dtype=dt, device=v.device)  # ours: the caller's state is never written
    S.view(B, G, N, Hg, P).copy_(initial_state.unflatten(1, (G, Hg)).transpose(2, 3))
    S.view(B, G, N, Hg, P).mul_(exp_in(m[:, 0, 0], dt).view(B, G, 1, Hg, 1))  # S~ of the first chunk
    o = torch.empty(B, T, H, P, dtype=dt, device=v.device) if out is None else out
    bufs: dict[int, tuple] = {}  # per chunk length: reused buffers (fresh large tensors fault in their pages)
    for b in range(B):
        for c in range(n):
            t0 = c * C
            L = min(C, T - t0)
            if L not in bufs:
                bufs[L] = (*(torch.empty(G, L, Hg * P, dtype=dt, device=v.device) for _ in range(2)),
                           torch.empty(G, N, L, dtype=dt, device=v.device))
            Y, Vn, kTc = bufs[L]
            qc, kc = q[b, t0:t0 + L].transpose(0, 1), k[b, t0:t0 + L].transpose(0, 1)  # [G, L, N]
            vc = v[b, t0:t0 + L]  # [L, H, P]

            def per_head(x, b=b, c=c, L=L):  # [B, n, C, H] -> [G, L, Hg, 1]: a factor on each head's columns
                return x[b, c, :L].view(L, G, Hg, 1).transpose(0, 1)

            Sb, Y4, o4 = S[b], Y.view(G, L, Hg, P), o[b, t0:t0 + L].view(L, G, Hg, P).transpose(0, 1)
            v4 = vc.reshape(L, G, Hg, P).transpose(0, 1)  # [G, L, Hg, P]
            torch.mul(v4, per_head(e_neg), out=Vn.view(G, L, Hg, P))
            CB = torch.bmm(qc, kc.transpose(1, 2)).tril_()  # [G, L, L] q_i . k_j, j <= i: shared by the group
            torch.bmm(qc, Sb, out=Y).baddbmm_(CB, Vn)
            torch.mul(Y4, per_head(e_pos), out=o4)
            if skip is not None:
                o4.addcmul_(v4, skip)
            kTc.copy_(kc.transpose(1, 2))  # K^T with unit stride along tokens: a faster product than the view
            S4 = Sb.baddbmm_(kTc, Vn).view(G, N, Hg, P)
            for factor in (halves if split[b][c] else (to_next,)):
                S4.mul_(factor[b, c].view(G, 1, Hg, 1))
            if exact_any[b][c]:  # the exact heads' intra-chunk sums and state writes, added where they lie
                heads = (~factored[b, c, 0]).nonzero()[:, 0]
                group, within = heads // Hg, heads % Hg
                Gh = Gc[b, c, :L, heads].T  # [u, L] float64
                vh = vc[:, heads].transpose(0, 1)  # [u, L, P]
                if v_scale is not None:
                    vh = vh * v_scale[b, c, :L, heads].T[..., None]
                decays = masked_exp_diff(Gh, dt).mul_(scale).mul_(CB[group])  # [u, L, L]
                o[b, t0:t0 + L, heads] += torch.bmm(decays, vh).transpose(0, 1)
                tail = exp_in(m_next[b, c, 0, heads, None] + Gh[:, -1:] - Gh, dt)  # [u, L]: exp(m' + G_L - Gc_j)
                S.view(B, G, N, Hg, P)[b, group, :, within] += torch.bmm(kTc[group], vh * tail[..., None])
    return o, S.view(B, G, N, Hg, P).transpose(2, 3).reshape(B, H, N, P)


FORMS = {"recurrent": recurrent, "chunk": chunk, "parallel": parallel, "scan": scan}
