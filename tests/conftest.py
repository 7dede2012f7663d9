"""Test-wide settings: hypothesis without per-example deadlines (the machines are shared and timing varies).

``HYPOTHESIS_PROFILE=thorough pytest`` runs ten times more random cases (see ``helpers.n_examples``).
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("quick", deadline=None, print_blob=True)
settings.register_profile("thorough", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))


@pytest.fixture(scope="module")
def torch_forms():
    """Make ``backend="auto"`` run the torch forms, for modules that test those forms themselves (the compiled
    kernels have tests/test_kernels_cpu.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("linattn.kernels.AUTO_FORMS", ())
        yield
