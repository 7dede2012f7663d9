"""Pieces the forms of every rule share: chunked layout, log-space gates, the carry across chunks, and the division
by the normalizer (`normalized_read`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def normalized_read(num_den: torch.Tensor, eps: float, eps_mode: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """num / den with the library's one epsilon convention; the last column of ``num_den`` holds den = q^T z.

    ``"add"`` divides by den + eps, ``"clamp"`` by max(den, eps); eps = 0 divides exactly. Every torch path (the
    forms, packed sequences, sequence parallelism) divides here, so they cannot drift apart.
    """
    num, den = num_den[..., :-1], num_den[..., -1:]
    if eps_mode == "add":
        den = den + eps if eps else den
    else:
        den = den.clamp_min(eps)
    return torch.div(num, den) if out is None else torch.div(num, den, out=out)


def to_chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """``[B, H, T, ...]`` (any strides) -> contiguous ``[B*H, n, C, ...]``, zero-padded to a multiple of C.

    Padded tokens have k = v = 0, beta = 0 and log-gate 0 (a = 1), so they leave the state unchanged; their
    outputs are cut off by the caller. This is the one copy each input gets.
    """
    B, H, T = x.shape[:3]
    pad = (-T) % C
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 3) + [0, pad])
    return x.reshape(B * H, (T + pad) // C, C, *x.shape[3:]).contiguous()


def carry_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of the running state carried across chunks: float32 at least (see ``ChunkCarry``)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# Every log-gate is raised to this floor before it is summed. exp(g) is exactly 0 for any g below about -745.1 in
# float64 (-104 in float32, -17.4 in float16), so every decay product the token loop forms across such a gate is
# exactly 0 either way: the floor changes no result. It does change what the cumulative sums can hold:
# * g = -inf (a full reset, e.g. at a document boundary) would make G = -inf from there on, and the differences
#   G_i - G_j of two such positions -inf - -inf = NaN; so would -inf * 0 in a masked product and in the gradients.
# * huge finite gates (-1e12, -1e30) would make |G| so large that the float64 sum keeps none of the small gates
#   after them: at |G| = 1e30 the spacing of float64 numbers is 1e14, and every later G_i - G_j becomes 0.
# Floored, |G| <= C * 1000 inside a chunk of C tokens, where float64 resolves differences to about 1e-11.
# Its gradient is 0 below the floor, as is the true one (d exp(g) / dg = exp(g) = 0 there).
LOG_GATE_FLOOR = -1000.0


def log_cumsum(g: torch.Tensor, dim: int) -> torch.Tensor:
    """Cumulative log-gate in float64, each gate first raised to ``LOG_GATE_FLOOR`` (see there: -inf is a reset).

    In float32, after a strong decay |G| is large while a later difference G_i - G_j is small, and the
    subtraction cancels catastrophically. Exponents are cast back to the working dtype just before ``exp``.
    Every form that takes differences or sums of log-gates must form them here, never from raw ``g``.
    """
    return g.to(torch.float64).clamp(min=LOG_GATE_FLOOR).cumsum(dim=dim)


def exp_in(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).exp()


# Within this many nats of log-decay from a chunk's start, exp(G) and exp(-G) are both normal float32 numbers.
SAFE_LOG_DECAY = 60.0


def gate_factors(G: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(exp(G), exp(-G)) in ``dtype`` when every chunk-local G is within ``SAFE_LOG_DECAY``, else None.

    Then exp(G_i - G_j) = exp(G_i) * exp(-G_j) factors into the queries and keys, and the decayed scores are one
    plain matmul with no [C, C] decay matrix: no subtraction, so no cancellation; each factor is rounded once
    from float64. Stronger decays (gates near 0) take the exact masked path instead. float16 always does.
    """
    if dtype == torch.float16 or bool(G.min() < -SAFE_LOG_DECAY):
        return None
    return G.exp().to(dtype), (-G).exp().to(dtype)


def masked_exp_diff(G: torch.Tensor, dtype: torch.dtype, inclusive: bool = True) -> torch.Tensor:
    """exp(G_i - G_j) for j <= i (j < i if not inclusive), 0 elsewhere; G [..., T] -> [..., T, T] in ``dtype``.

    The mask goes in before the exp, so the positive differences above the diagonal never overflow.
    """
    T = G.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=G.device).tril(0 if inclusive else -1)
    diff = G[..., :, None] - G[..., None, :]
    return exp_in(torch.where(mask, diff, torch.full_like(diff, float("-inf"))), dtype)


class ChunkCarry(torch.autograd.Function):
    """The state entering each chunk: S_0 = initial, S_{c+1} = a_c * S_c + dS_c.

    Inputs: dS ``[N, n, Dk, Dv]`` (each chunk's own writes, already decayed to its end), decay ``None`` or
    ``[N, n, 1 or Dk, 1]`` (the chunk's total gate), S0 ``[N, Dk, Dv]``. Returns (S_before ``[N, n, Dk, Dv]`` in
    dS's dtype, S_final ``[N, Dk, Dv]`` in ``carry_dtype``, and S_before in ``carry_dtype`` when that differs from
    dS's dtype, else an empty tensor: for the backward only).

    A hand-written backward because autograd through a Python loop of n slices would keep n graph nodes and
    copy the whole buffer at each; here both directions are one fused multiply-add per chunk into one buffer.
    Backward: with T_c the total gradient reaching S_c, T_n = dS_final, T_c = dS_before_c + a_c T_{c+1};
    then d(dS_c) = T_{c+1}, d(a_c) = sum(T_{c+1} * S_c), d(S0) = T_0.
    """

    @staticmethod
    def forward(dS, decay, S0):
        # The running sum is kept in float32 even for a half-precision state: adding many small chunk writes to
        # a large bfloat16 state rounds them away. The states the chunks read are stored in dS's dtype.
        acc = carry_dtype(dS.dtype)
        out_dtype = dS.dtype
        dS, S0 = dS.to(acc), S0.to(acc)
        decay = None if decay is None else decay.to(acc)
        n = dS.shape[1]
        S_before = torch.empty_like(dS)
        S_before[:, 0] = S0
        for c in range(1, n):
            if decay is None:
                torch.add(S_before[:, c - 1], dS[:, c - 1], out=S_before[:, c])
            else:
                torch.addcmul(dS[:, c - 1], decay[:, c - 1], S_before[:, c - 1], out=S_before[:, c])
        last = S_before[:, -1] if decay is None else decay[:, -1] * S_before[:, -1]
        S_final = last + dS[:, -1]
        # The third output is the carry at full precision for the backward, where it differs from the first (an
        # output, since torch.func transforms save only inputs and outputs); else empty: the first is saved.
        before = S_before.to(out_dtype)
        return before, S_final, S_before if before is not S_before else S_before.new_empty(0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        dS, decay, S0 = inputs
        ctx.dtypes = (dS.dtype, None if decay is None else decay.dtype, S0.dtype)
        ctx.mark_non_differentiable(output[2])
        S_before = output[2] if output[2].numel() else output[0]
        ctx.save_for_backward(None if decay is None else decay.to(S_before.dtype), S_before)

    @staticmethod
    def backward(ctx, grad_before, grad_final, _grad_carry):
        decay, S_before = ctx.saved_tensors
        n = S_before.shape[1]
        grad_before = torch.zeros_like(S_before) if grad_before is None else grad_before.to(S_before.dtype)
        grad_final = torch.zeros_like(S_before[:, 0]) if grad_final is None else grad_final.to(S_before.dtype)
        if torch.is_grad_enabled():  # create_graph or a torch.func transform differentiates this backward:
            rows = [grad_final]  # no out= and no writes into a buffer whose slices the graph saved
            for c in range(n - 1, 0, -1):
                rows.append(grad_before[:, c] + (rows[-1] if decay is None else decay[:, c] * rows[-1]))
            grad_dS = torch.stack(rows[::-1], dim=1)
        else:
            grad_dS = torch.empty_like(S_before)
            grad_dS[:, -1] = grad_final
            for c in range(n - 1, 0, -1):
                if decay is None:
                    torch.add(grad_before[:, c], grad_dS[:, c], out=grad_dS[:, c - 1])
                else:
                    torch.addcmul(grad_before[:, c], decay[:, c], grad_dS[:, c], out=grad_dS[:, c - 1])
        grad_S0 = grad_before[:, 0] + (grad_dS[:, 0] if decay is None else decay[:, 0] * grad_dS[:, 0])
        grad_decay = None
        if decay is not None and ctx.needs_input_grad[1]:
            sum_dims = [d for d in (-2, -1) if decay.shape[d] == 1]
            grad_decay = (grad_dS * S_before).sum(dim=sum_dims, keepdim=True).to(ctx.dtypes[1])
        return grad_dS.to(ctx.dtypes[0]), grad_decay, grad_S0.to(ctx.dtypes[2])
