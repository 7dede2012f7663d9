"""The tools side of linattn: the `linattn` command, its measurements, the memory planner and the explainer page.

Everything here imports the core (`linattn`, `linattn.nn`, ...) and is never imported by it, so that
`pip install linattn` needs no plotting or command-line package; `pip install 'linattn[tools]'` brings them.
Each tool is a package or module over one harness (`linattn.tools.harness`): timer, machine facts, result files.
"""
