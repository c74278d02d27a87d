"""Pairing functions with model profiles (CremeBrulee §VI-A, "Model Association")."""

from __future__ import annotations

import numpy as np

from cachepolicies.workloads.errors import WorkloadError

ASSOCIATIONS = ("uniform", "round-robin", "quantiles", "quantiles-r")


def associate(popularity: np.ndarray, load_seconds: np.ndarray, method: str,
              rng: np.random.Generator) -> np.ndarray:
    """For each function (by ``popularity``, its invocation count), the index of its profile.

    - ``uniform``: a uniformly random profile.
    - ``round-robin``: profiles in order of decreasing ``load_seconds``, cycled over the
      functions in their given order.
    - ``quantiles``: the function's popularity quantile picks the profile's quantile of
      load time: more popular functions get slower-loading models (correlation ≈ +1).
    - ``quantiles-r``: the reverse (more popular → faster-loading; correlation ≈ −1).

    For the quantile methods, functions are ranked by popularity with ties broken at
    random (seeded), and the ranks are cut into as many equal buckets as there are
    profiles, so every profile serves about the same number of functions.
    """
    popularity = np.asarray(popularity)
    load_seconds = np.asarray(load_seconds, dtype=float)
    n_functions, n_profiles = len(popularity), len(load_seconds)
    if method not in ASSOCIATIONS:
        raise WorkloadError(f"unknown association {method!r}: expected one of "
                            f"{', '.join(ASSOCIATIONS)}")
    if n_profiles == 0:
        raise WorkloadError("no model profiles to associate functions with")
    slowest_first = np.argsort(-load_seconds, kind="stable")
    if method == "uniform":
        return rng.integers(0, n_profiles, n_functions)
    if method == "round-robin":
        return slowest_first[np.arange(n_functions) % n_profiles]
    least_popular_first = np.lexsort((rng.random(n_functions), popularity))
    rank = np.empty(n_functions, dtype=np.int64)
    rank[least_popular_first] = np.arange(n_functions)
    bucket = rank * n_profiles // max(n_functions, 1)
    if method == "quantiles":
        return slowest_first[::-1][bucket]
    return slowest_first[bucket]
