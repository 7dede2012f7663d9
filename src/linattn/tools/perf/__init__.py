"""``linattn perf``: kernel benchmark against peers and the machine's own rates.

Modules, each importing only those above it: `peers` (the implementations timed), `work` (the run's
configuration, FLOP and byte counts, case selection), `report` (ratios, thread scaling, targets, Markdown),
`cpu` (the CPU run), `cuda_report` and `cuda` (the GPU run), `cli` (the command).
"""
