"""Multi-query associative recall (MQAR, Arora et al. 2023, the zoology benchmark): the task generator.

One sequence of length ``seq_len``::

    [lead fillers] k1 v1 k2 v2 ... kn vn [gap fillers] ... kj vj ... ki vi ...
                   \\------ writes ----/                \\---- queries ----/

Keys come from ``[1, 1 + num_keys)``, values from the rest of the vocabulary; token 0 is the filler. Every pair
is queried once, in a random order, at a random even-aligned slot of the query region (the part after the writes
and the gap): the query key sits at position ``p`` and the model must predict its value at ``p``, the next input
token (``targets[p]``; every other target is ``IGNORE``). ``distance = p - (position of the key's write)``.
Fixed ``lead + gap`` with ``gap`` moved is the "evidence moved at fixed total length" control.

Keys within a sequence are distinct unless ``overwrites > 0``: then the last ``overwrites`` writes reuse the
keys of the first ones with new values, and queries of those keys ask for the *latest* value (their distance is
measured from that latest write). A fixed seed gives the same data (NumPy's PCG64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

IGNORE = -100
FILLER = 0


@dataclass(frozen=True)
class Batch:
    """``inputs``, ``targets`` ``[B, T]`` int64 (targets ``IGNORE`` except at queries); ``distance`` ``[B, T]``
    (write-to-query distance at query positions, 0 elsewhere); ``num_pairs``: pairs per sequence."""

    inputs: np.ndarray
    targets: np.ndarray
    distance: np.ndarray
    num_pairs: int


def split_vocab(vocab_size: int) -> tuple[int, int]:
    """(number of key tokens, number of value tokens): token 0 is the filler, then half keys, half values."""
    if vocab_size < 5:
        raise ValueError(f"vocab_size must be at least 5 (filler, keys, values), got {vocab_size}")
    num_keys = (vocab_size - 1) // 2
    return num_keys, vocab_size - 1 - num_keys


def generate(num_examples: int, *, vocab_size: int, seq_len: int, num_pairs: int, seed: int,
             lead: int = 0, gap: int = 0, overwrites: int = 0) -> Batch:
    """``num_examples`` MQAR sequences (see the module docstring). Raises ValueError naming the argument when the
    pairs, the fillers and the queries do not fit in ``seq_len`` or the vocabulary."""
    for name, value, low in (("num_examples", num_examples, 1), ("num_pairs", num_pairs, 1), ("lead", lead, 0),
                             ("gap", gap, 0), ("overwrites", overwrites, 0), ("seed", seed, 0)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    num_keys, num_values = split_vocab(vocab_size)
    if num_pairs > num_keys or num_pairs + overwrites > num_values:
        raise ValueError(f"num_pairs: {num_pairs} pairs (+{overwrites} overwrites) need more than the "
                         f"{num_keys} keys / {num_values} values of vocab_size {vocab_size}")
    if overwrites > num_pairs:
        raise ValueError(f"overwrites ({overwrites}) must not exceed num_pairs ({num_pairs})")
    writes = num_pairs + overwrites
    start_q = lead + 2 * writes + gap
    slots = (seq_len - start_q) // 2
    if slots < num_pairs:
        raise ValueError(f"seq_len: {seq_len} tokens leave room for {max(slots, 0)} queries after {lead} + "
                         f"{2 * writes} + {gap} tokens; {num_pairs} are needed")
    rng = np.random.default_rng(seed)
    B, T = num_examples, seq_len
    inputs = np.full((B, T), FILLER, dtype=np.int64)
    targets = np.full((B, T), IGNORE, dtype=np.int64)
    distance = np.zeros((B, T), dtype=np.int64)
    rows = np.arange(B)[:, None]
    keys = 1 + rng.permuted(np.tile(np.arange(num_keys), (B, 1)), axis=1)[:, :num_pairs]  # distinct per row
    values = 1 + num_keys + rng.permuted(np.tile(np.arange(num_values), (B, 1)), axis=1)[:, :writes]
    write_keys = np.concatenate([keys, keys[:, :overwrites]], axis=1)  # overwrites reuse the first keys
    write_pos = lead + 2 * np.arange(writes)
    inputs[:, write_pos] = write_keys
    inputs[:, write_pos + 1] = values
    # The answer of key i is the value of its last write; distance is measured from that write.
    last = np.arange(num_pairs).copy()
    last[:overwrites] = num_pairs + np.arange(overwrites)
    answer = values[:, last]  # [B, n]
    chosen = np.sort(rng.permuted(np.tile(np.arange(slots), (B, 1)), axis=1)[:, :num_pairs], axis=1)
    order = rng.permuted(np.tile(np.arange(num_pairs), (B, 1)), axis=1)  # which pair each slot asks for
    q_pos = start_q + 2 * chosen
    inputs[rows, q_pos] = keys[rows, order]
    inputs[rows, q_pos + 1] = answer[rows, order]
    targets[rows, q_pos] = answer[rows, order]
    distance[rows, q_pos] = q_pos - write_pos[last[order]]
    return Batch(inputs, targets, distance, num_pairs)
