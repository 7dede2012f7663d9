"""linattn: causal linear attention with a recurrent state.

Public API (everything a user needs is here):

    o, state = linattn.linear_attention(q, k, v, rule="accumulate", form="chunk", ...)   # whole sequence
    o, state = linattn.step(q_t, k_t, v_t, state, rule="accumulate", ...)                 # one-token decode
    dec = linattn.Decoder(state, rule="accumulate", ...); o = dec(q_t, k_t, v_t)          # a decode loop
    print(linattn.plan(linattn.linear_attention, q, k, v, ...))                      # which backend runs, why

Kernels live in ``linattn.ops.<rule>`` and load on first use; the float64 ground truth is ``linattn.reference``;
the tools (bench, memory, stability, recall, lab, the explainer; the `linattn[tools]` extra) are in ``linattn.tools``.
"""

from linattn.api import RULES, linear_attention, plan, step, supported_forms
from linattn.decode import Decoder
from linattn.feature_maps import FEATURE_MAPS
from linattn.state import State

__version__ = "0.1.0"
__all__ = ["FEATURE_MAPS", "RULES", "Decoder", "State", "linear_attention", "plan", "step", "supported_forms",
           "__version__"]
