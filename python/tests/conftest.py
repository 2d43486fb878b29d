"""Shared fixtures: a seeded generator per test (MLAKIT_TEST_SEED repeats a run)."""

import os
import secrets
import zlib

import numpy as np
import pytest

SEED = int(os.environ.get("MLAKIT_TEST_SEED", secrets.randbits(32)))


def pytest_report_header(config):
    return f"mlakit test seed {SEED} (set MLAKIT_TEST_SEED to repeat)"


@pytest.fixture
def rng(request):
    """A generator seeded from the run's seed and the test's name (tests stay independent)."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.nodeid.encode())])
