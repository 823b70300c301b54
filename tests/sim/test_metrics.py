"""The summary's percentiles are numpy's, value for value."""

import math

import numpy as np

from rollflow.sim.metrics import percentiles

POINTS = (0, 1, 25, 33.3, 50, 66.7, 90, 99, 99.9, 100)


def test_percentiles_equal_numpy_exactly():
    rng = np.random.default_rng(0)
    for trial in range(2000):
        n = int(rng.integers(1, 300))
        values = (
            rng.random(n),
            rng.lognormal(0, 3, n),
            rng.integers(0, 5, n).astype(float),  # ties
            rng.normal(0, 1e6, n),
        )[trial % 4]
        assert percentiles(values, POINTS) == np.percentile(values, POINTS).tolist()


def test_percentiles_of_values_with_nan_are_nan():
    got = percentiles(np.array([1.0, np.nan, 3.0]), (50, 90))
    assert all(math.isnan(v) for v in got)
    assert np.isnan(np.percentile(np.array([1.0, np.nan, 3.0]), (50, 90))).all()
