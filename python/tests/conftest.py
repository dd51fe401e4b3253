"""Shared fixtures: fresh random seeds, printed so that a failure can be replayed."""

import os

import numpy as np
import pytest


@pytest.fixture
def rng():
    """A generator with a fresh seed each run (QGEMM_TEST_SEED replays one); the seed is printed,
    and pytest shows it with a failure's captured output."""
    seed = int(os.environ.get("QGEMM_TEST_SEED", np.random.SeedSequence().entropy % 2**63))
    print(f"seed {seed} (QGEMM_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)
