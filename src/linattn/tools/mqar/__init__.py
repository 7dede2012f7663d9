"""``linattn mqar``: multi-query associative recall, trained on a CPU, next to the decode latency of each mixer.

For each mixer (softmax attention, accumulate with elu+1 and with Taylor features, gated, delta, gated delta, a
gated-delta/attention hybrid) a two-layer [`linattn.nn.CausalLM`][linattn.nn.CausalLM] is trained on MQAR
(`data`, `train`) within a step count and a time budget, then
evaluated: exact-match recall by number of pairs and by write-to-query distance, and the controls of
`controls` -- the evidence moved at fixed total length (forgetting), overwritten and
near-duplicate keys (write-rule capacity), and bfloat16 weights with a float32 or a bfloat16 state (precision).
Finally the decode latency per token at histories of 2K/8K/32K tokens is timed side by side for every mixer: the KV
cache of attention layers holds that many random keys and values (contents do not change the time), the linear
layers hold their fixed state (`experiment`, `report`).

``--sweep`` runs the learning-rate sweep of `sweep` (`sweep_runner`,
`sweep_report`); ``--summarize`` pools runs over seeds (`seeds`).
The command line is `cli`.
"""
