"""Faro's water-fill with its models in a heap takes exactly the steps of the scan it
replaced (every model scored every step), on random value tables full of ties, models
that need no CPU or no memory, and capacities that stop it early."""

import numpy as np

from agent.coordinator.faro import allocator


def reference_water_fill(x, values, offsets, length, cpu, mem, cap_c, cap_m):
    """The water-fill as it was: each step scans every model for the first (by index)
    at the lowest value that has an improving step within the room left (the room
    worked out by the allocator's own ``_afford``, which did not change)."""
    _afford = allocator._afford
    n = len(x)
    v = [values[offsets[i] + min(x[i], length[i]) - 1] for i in range(n)]
    tol_c, tol_m = 1e-9 * max(1.0, cap_c), 1e-9 * max(1.0, cap_m)
    used_c, used_m = float(np.dot(cpu, x.astype(float))), float(np.dot(mem, x.astype(float)))
    while True:
        low, moved = min(v), False
        for i in range(n):
            if v[i] > low:
                continue
            room = min(_afford(used_c, cap_c, cpu[i], tol_c),
                       _afford(used_m, cap_m, mem[i], tol_m))
            for xn in range(x[i] + 1, min(length[i], x[i] + room) + 1):
                nv = values[offsets[i] + xn - 1]
                if nv > v[i]:
                    used_c += cpu[i] * (xn - x[i])
                    used_m += mem[i] * (xn - x[i])
                    x[i], v[i], moved = xn, nv, True
                    break
            if moved:
                break
        if not moved:
            return


def test_the_heap_takes_the_steps_of_the_scan():
    rng = np.random.default_rng(16)
    differed_from_start = 0
    for trial in range(400):
        n = int(rng.integers(1, 30))
        length = rng.integers(1, 12, n).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        values = np.concatenate([  # rounded: many ties; some tables not increasing
            np.round(np.sort(rng.random(k)) if rng.random() < 0.7 else rng.random(k), 1)
            for k in length])
        cpu = rng.choice([0.0, 0.5, 1.0, 2.0], n)
        mem = rng.choice([0.0, 1e9, 3e9], n)
        cap_c, cap_m = float(rng.integers(1, 60)), float(rng.integers(1, 80)) * 1e9
        start = rng.integers(1, 3, n).astype(np.int64)
        got, want = start.copy(), start.copy()
        allocator.water_fill(got, values, offsets, length, cpu, mem, cap_c, cap_m)
        reference_water_fill(want, values, offsets, length, cpu, mem, cap_c, cap_m)
        assert got.tolist() == want.tolist(), trial
        differed_from_start += got.tolist() != start.tolist()
    assert differed_from_start > 150  # many instances rose: their steps were compared
