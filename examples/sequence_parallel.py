"""One sequence split across processes: Gated DeltaNet prefill and backward with linattn.distributed.

Run on a laptop CPU (4 processes, gloo over loopback):

    torchrun --nproc-per-node 4 examples/sequence_parallel.py

Each rank holds a quarter of one 4,003-token sequence (the last rank a little less), computes its outputs and
gradients, and exchanges only state-sized maps. Rank 0 then checks the outputs, the gradients and the final state
against one process running the whole sequence, and prints the relative differences (float32 rounding).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import linattn
from linattn.distributed import linear_attention


def whole_sequence(T: int, B: int = 1, H: int = 4, D: int = 32) -> dict[str, torch.Tensor]:
    """The same inputs on every rank (same seed); each rank then keeps its own slice."""
    gen = torch.Generator().manual_seed(0)
    return {
        "q": torch.randn(B, T, H, D, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, D, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, D, generator=gen),
        "g": F.logsigmoid(torch.randn(B, T, H, generator=gen) + 3),  # log-gates <= 0
        "beta": torch.rand(B, T, H, generator=gen),
    }


def main() -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # torchrun sets MASTER_ADDR, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    T = 4003
    full = whole_sequence(T)
    per_rank = -(-T // world)
    seg = slice(rank * per_rank, min(T, (rank + 1) * per_rank))
    mine = {n: x[:, seg].clone().requires_grad_(True) for n, x in full.items()}

    o, final = linear_attention(mine["q"], mine["k"], mine["v"], rule="gated_delta", g=mine["g"],
                                beta=mine["beta"], output_final_state=True)
    o.square().sum().backward()  # every rank runs the backward (it is collective)
    print(f"rank {rank}: tokens {seg.start}..{seg.stop - 1}, output {tuple(o.shape)}, "
          f"final state {tuple(final.S.shape)} (same on every rank)")

    # Gather this rank's outputs and gradients on rank 0 to compare with one process (for the demo only:
    # sequence parallelism itself never moves tokens).
    pieces = [o.detach()] + [mine[n].grad for n in full]
    gathered = [[None] * world for _ in pieces]
    for i, p in enumerate(pieces):
        dist.all_gather_object(gathered[i], p)
    if rank == 0:
        ref = {n: x.clone().requires_grad_(True) for n, x in full.items()}
        o_ref, final_ref = linattn.linear_attention(ref["q"], ref["k"], ref["v"], rule="gated_delta", g=ref["g"],
                                                    beta=ref["beta"], output_final_state=True)
        o_ref.square().sum().backward()
        def rel(a, b):  # max |a - b| / max |b|
            return f"{((a - b).abs().max() / b.abs().max()).item():.1e}"

        print("relative difference from one process:")
        print(f"  outputs     {rel(torch.cat(gathered[0], 1), o_ref)}")
        for i, n in enumerate(full, start=1):
            print(f"  grad {n:6} {rel(torch.cat(gathered[i], 1), ref[n].grad)}")
        print(f"  final state {rel(final.S, final_ref.S)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
