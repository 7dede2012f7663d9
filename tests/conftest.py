"""Test-wide settings: hypothesis without per-example deadlines (the machines are shared and timing varies).

``HYPOTHESIS_PROFILE=thorough pytest`` runs ten times more random cases (see ``helpers.n_examples``).

Without a CUDA device the Triton kernels (tests/test_kernels_triton.py) run under Triton's interpreter, which must
be chosen before triton is first imported (Triton's own library functions are decorated then): set it here, first.
Nothing else changes: linattn picks Triton only for CUDA tensors unless asked, and peers' Triton kernels are never
launched on a CPU.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import settings  # noqa: E402

settings.register_profile("quick", deadline=None, print_blob=True)
settings.register_profile("thorough", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(scope="module")
def torch_forms():
    """Make ``backend="auto"`` run the torch forms, for modules that test those forms themselves (the compiled
    kernels have tests/test_kernels_cpu.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("linattn.backends.policy.AUTO_FORMS", ())
        yield


@pytest.fixture
def calls(monkeypatch):
    """Calls of the compiled batch-1 decode entries, recorded (they still run): proof that the fast path ran. A
    float32 call's arguments as `decode` takes them; a bfloat16 one's as `decode_bf16` does (``dtypes`` at 18); a
    Mamba-2 step's as `linattn.kernels.cpu_ssm.step` takes them (the state's address at 27)."""
    from linattn.kernels import cpu_decode, cpu_ssm

    seen = []

    def spy(real):
        def call(*args):
            seen.append(args)
            return real(*args)

        return call

    monkeypatch.setattr(cpu_decode, "decode", spy(cpu_decode.decode))
    monkeypatch.setattr(cpu_decode, "decode_bf16", spy(cpu_decode.decode_bf16))
    monkeypatch.setattr(cpu_ssm, "step", spy(cpu_ssm.step))
    return seen
