"""``linattn perf``: kernel benchmark against peers and the machine's own rates.

Modules, each importing only those above it: :mod:`~.peers` (the implementations timed), :mod:`~.work` (the run's
configuration, FLOP and byte counts, case selection), :mod:`~.report` (ratios, thread scaling, targets, Markdown),
:mod:`~.cpu` (the CPU run), :mod:`~.cuda_report` and :mod:`~.cuda` (the GPU run), :mod:`~.cli` (the command).
"""
