"""The fast allocator: greedy construction plus pairwise exchange, over value tables.

It maximises ``A Σ π_i V_i(x_i) − G (max_i V_i − min_i V_i)`` (see ``objectives``)
subject to ``Σ cpu_i x_i <= CPU``, ``Σ mem_i x_i <= MEM``, integer ``x_i >= 1``.

1. Construction. *Ratio greedy*: from the current point, repeatedly make the single
   jump ``x_i → x'`` (any ``x' > x_i``) with the best objective gain per unit of the
   model's dominant resource share; looking at whole jumps, not one replica, lets it
   climb the S-shaped utility curves of the relaxed M/D/c model (nearly flat until the
   queue is close to stable, then steep). For the fair objectives a second start first
   *water-fills* (always raises the lowest utility) and then runs the ratio greedy. A
   last start gives every model all it can use and *removes* the replica that loses
   least per unit of cost until the allocation fits. The best of the starts wins.
2. Exchange. Pairwise re-optimisation: for a pair of models, with everyone else fixed,
   try every split of the freed resources (up to ``full_pair_models`` models) or moves
   of up to ``pair_span`` replicas out of one model into another (large instances);
   apply the first strict improvement and repeat until none is left. On small
   instances (``triple_budget``) every triple of models is re-optimised exactly the same
   way, a large-neighbourhood step that escapes the optima of pairwise moves when
   replicas cost different amounts of CPU and memory. Then greedily fill any capacity
   left; repeat until nothing changes.

Every step is O(1) per candidate thanks to the four largest and four smallest values
being tracked (``bench/faro_solver.py`` times it at 1,000 models).
"""

from __future__ import annotations

import heapq

import numpy as np
from numba import njit

#: The least gain of the objective that counts as an improvement.
MIN_GAIN = 1e-12


@njit(cache=True)
def _val(values, offsets, length, i, x):
    if x > length[i]:
        x = length[i]
    return values[offsets[i] + x - 1]


@njit(cache=True)
def _extremes(v, top, bot):
    """Indices of the K largest (``top``) and K smallest (``bot``) values; -1 pads."""
    size = top.shape[0]
    for k in range(size):
        top[k] = -1
        bot[k] = -1
    for i in range(v.shape[0]):
        for k in range(size):
            if top[k] < 0 or v[i] > v[top[k]]:
                for m in range(size - 1, k, -1):
                    top[m] = top[m - 1]
                top[k] = i
                break
        for k in range(size):
            if bot[k] < 0 or v[i] < v[bot[k]]:
                for m in range(size - 1, k, -1):
                    bot[m] = bot[m - 1]
                bot[k] = i
                break


@njit(cache=True)
def _max_excl(v, top, a, b, c=-1):
    for k in range(top.shape[0]):
        idx = top[k]
        if idx >= 0 and idx != a and idx != b and idx != c:
            return v[idx]
    return -np.inf


@njit(cache=True)
def _min_excl(v, bot, a, b, c=-1):
    for k in range(bot.shape[0]):
        idx = bot[k]
        if idx >= 0 and idx != a and idx != b and idx != c:
            return v[idx]
    return np.inf


@njit(cache=True)
def _afford(used, cap, per, tol):
    """Replicas of size ``per`` that still fit; 0 when ``used`` already breaks the limit."""
    room = cap - used + tol
    if room < 0.0:
        return 0
    if per <= 0.0:
        return 1 << 40
    return int(np.floor(room / per))


@njit(cache=True)
def _objective(v, prios, A, G):
    return A * np.dot(prios, v) - G * (v.max() - v.min())


@njit(cache=True)
def ratio_greedy(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G, cost):
    """Grow ``x`` in place by best-gain-per-cost jumps until nothing improves."""
    n = x.shape[0]
    v = np.empty(n)
    for i in range(n):
        v[i] = _val(values, offsets, length, i, x[i])
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    used_c = np.dot(cpu, x.astype(np.float64))
    used_m = np.dot(mem, x.astype(np.float64))
    top = np.empty(4, np.int64)
    bot = np.empty(4, np.int64)
    while True:
        _extremes(v, top, bot)
        spread = v[top[0]] - v[bot[0]]
        best_r = 0.0
        bi = -1
        bx = 0
        for i in range(n):
            if x[i] >= length[i]:
                continue
            room = min(_afford(used_c, cap_c, cpu[i], tol_c), _afford(used_m, cap_m, mem[i], tol_m))
            hi = min(length[i], x[i] + room)
            if hi <= x[i]:
                continue
            maxo = _max_excl(v, top, i, -1)
            mino = _min_excl(v, bot, i, -1)
            for xn in range(x[i] + 1, hi + 1):
                nv = values[offsets[i] + xn - 1]
                if nv <= v[i]:
                    continue
                delta = A * prios[i] * (nv - v[i]) - G * (max(maxo, nv) - min(mino, nv) - spread)
                if delta <= MIN_GAIN:
                    continue
                r = delta / (cost[i] * (xn - x[i]))
                if r > best_r:
                    best_r = r
                    bi = i
                    bx = xn
        if bi < 0:
            break
        used_c += cpu[bi] * (bx - x[bi])
        used_m += mem[bi] * (bx - x[bi])
        x[bi] = bx
        v[bi] = values[offsets[bi] + bx - 1]


@njit(cache=True)
def water_fill(x, values, offsets, length, cpu, mem, cap_c, cap_m):
    """Raise the lowest value by its smallest improving step until it cannot rise: of
    the models at the lowest value, the first (by index) that has such a step within
    the room left; none has: done. The models wait in a heap by (value, index), so a
    step costs a pop and a push, not a scan of every model (a model that cannot rise
    now never can: the room only shrinks)."""
    n = x.shape[0]
    v = np.empty(n)
    for i in range(n):
        v[i] = _val(values, offsets, length, i, x[i])
    if n == 0:
        return
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    used_c = np.dot(cpu, x.astype(np.float64))
    used_m = np.dot(mem, x.astype(np.float64))
    heap = [(v[i], i) for i in range(n)]
    heapq.heapify(heap)
    stuck = [(v[0], 0)]  # those at the lowest value that could not rise (typed by this)
    while True:
        low = heap[0][0]
        stuck.clear()
        moved = False
        while len(heap) > 0 and heap[0][0] <= low:
            entry = heapq.heappop(heap)
            i = entry[1]
            room = min(_afford(used_c, cap_c, cpu[i], tol_c), _afford(used_m, cap_m, mem[i], tol_m))
            hi = min(length[i], x[i] + room)
            for xn in range(x[i] + 1, hi + 1):
                nv = values[offsets[i] + xn - 1]
                if nv > v[i]:
                    used_c += cpu[i] * (xn - x[i])
                    used_m += mem[i] * (xn - x[i])
                    x[i] = xn
                    v[i] = nv
                    moved = True
                    break
            if moved:
                heapq.heappush(heap, (v[i], i))
                break
            stuck.append(entry)
        for entry in stuck:
            heapq.heappush(heap, entry)
        if not moved:
            break


@njit(cache=True)
def _drop_replica(i, x, v, values, offsets):
    """Model ``i`` one replica fewer: its count, and its value at the new count."""
    x[i] -= 1
    v[i] = values[offsets[i] + x[i] - 1]


@njit(cache=True)
def _drop_ratio(i, x, v, values, offsets, prios, cpu, mem, cost, top, bot, A, G, spread,
                over_c):
    """Objective lost per unit of cost by dropping one replica of model ``i``; ``inf``
    when it cannot drop (one replica left, or none of the binding resource)."""
    if x[i] <= 1 or (over_c and cpu[i] <= 0.0) or (not over_c and mem[i] <= 0.0):
        return np.inf
    nv = values[offsets[i] + x[i] - 2]
    maxo = _max_excl(v, top, i, -1)
    mino = _min_excl(v, bot, i, -1)
    loss = A * prios[i] * (v[i] - nv) + G * (max(maxo, nv) - min(mino, nv) - spread)
    return loss / cost[i]


@njit(cache=True)
def _reverse_greedy_scan(x, v, values, offsets, prios, cpu, mem, cap_c, cap_m, A, G, cost):
    """The plain reverse greedy: every step scores every model (any value tables)."""
    n = x.shape[0]
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    used_c = np.dot(cpu, x.astype(np.float64))
    used_m = np.dot(mem, x.astype(np.float64))
    top = np.empty(4, np.int64)
    bot = np.empty(4, np.int64)
    while used_c > cap_c + tol_c or used_m > cap_m + tol_m:
        _extremes(v, top, bot)
        over_c = used_c > cap_c + tol_c
        spread = v[top[0]] - v[bot[0]]
        bi = -1
        best = np.inf
        for i in range(n):
            r = _drop_ratio(i, x, v, values, offsets, prios, cpu, mem, cost, top, bot, A, G,
                            spread, over_c)
            if r < best:
                best = r
                bi = i
        if bi < 0:
            break
        _drop_replica(bi, x, v, values, offsets)
        used_c -= cpu[bi]
        used_m -= mem[bi]


@njit(cache=True)
def _drops_lower(x, v, values, offsets):
    """Whether every replica any model could drop from ``x`` lowers or keeps its value
    (no NaN either): then the values only fall and their order can be kept step by step."""
    for i in range(x.shape[0]):
        cur = v[i]
        if cur != cur:
            return False
        for xn in range(x[i], 1, -1):
            k = offsets[i] + xn - 2
            if k < 0 or k >= values.shape[0] or not values[k] <= cur:
                return False
            cur = values[k]
    return True


@njit(cache=True)
def _ahead(v, i, j, low):
    """Whether ``i`` comes before ``j`` (-1: empty) in the order of ``_extremes``: lower
    (``low``) or higher value first, then lower index."""
    if j < 0:
        return True
    if v[i] == v[j]:
        return i < j
    return v[i] < v[j] if low else v[i] > v[j]


@njit(cache=True)
def reverse_greedy(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G, cost):
    """From an over-full ``x``, drop the replica losing least objective per cost until it
    fits (the first model on ties).

    Same steps, bit for bit, as scoring every model every step (``_reverse_greedy_scan``,
    used when some drop would raise a value), but a fleet's plan drops ~10^5 replicas
    from 10^3 models, so: the two largest and two smallest values are kept step by step
    (only the dropped model's value falls); a model's score, kept in ``ratio``, reads
    other models only through the largest and smallest values ``a``, ``b`` (the second
    ones for the models holding them), so after a step that leaves ``a``, ``b`` and the
    binding resource alone only five scores are recomputed; otherwise all of them, in
    one branch-free loop.
    """
    n = x.shape[0]
    v = np.empty(n)
    for i in range(n):
        v[i] = _val(values, offsets, length, i, x[i])
    if n == 0 or not _drops_lower(x, v, values, offsets):
        _reverse_greedy_scan(x, v, values, offsets, prios, cpu, mem, cap_c, cap_m, A, G, cost)
        return
    tol_c = 1e-9 * max(1.0, cap_c)
    tol_m = 1e-9 * max(1.0, cap_m)
    used_c = np.dot(cpu, x.astype(np.float64))
    used_m = np.dot(mem, x.astype(np.float64))
    top = np.empty(2, np.int64)  # top[:2] and bot[:2] of _extremes, the ones scores read
    bot = np.empty(2, np.int64)
    _extremes(v, top, bot)
    can = np.zeros(n, np.bool_)  # the model can drop a replica of the binding resource
    gain = np.zeros(n)  # A * prios[i] * (v[i] - nv[i]) where it can
    nv = np.zeros(n)  # its value after the drop where it can
    ratio = np.empty(n)
    over_c = used_c > cap_c + tol_c
    full = True
    bi = -1
    while used_c > cap_c + tol_c or used_m > cap_m + tol_m:
        new_over = used_c > cap_c + tol_c
        if bi < 0 or new_over != over_c:
            over_c = new_over
            full = True
            for i in range(n):
                can[i] = not (x[i] <= 1 or (over_c and cpu[i] <= 0.0)
                              or (not over_c and mem[i] <= 0.0))
                if can[i]:
                    nv[i] = values[offsets[i] + x[i] - 2]
                    gain[i] = A * prios[i] * (v[i] - nv[i])
        a = v[top[0]]
        b = v[bot[0]]
        spread = a - b
        if full:
            for i in range(n):
                r = (gain[i] + G * (max(a, nv[i]) - min(b, nv[i]) - spread)) / cost[i]
                ratio[i] = r if can[i] else np.inf
            ratio[top[0]] = _drop_ratio(top[0], x, v, values, offsets, prios, cpu, mem, cost,
                                        top, bot, A, G, spread, over_c)
            ratio[bot[0]] = _drop_ratio(bot[0], x, v, values, offsets, prios, cpu, mem, cost,
                                        top, bot, A, G, spread, over_c)
        bi = -1
        best = np.inf
        for i in range(n):
            if ratio[i] < best:
                best = ratio[i]
                bi = i
        if bi < 0:
            break
        _drop_replica(bi, x, v, values, offsets)
        used_c -= cpu[bi]
        used_m -= mem[bi]
        can[bi] = x[bi] > 1 and ((over_c and cpu[bi] > 0.0) or (not over_c and mem[bi] > 0.0))
        if can[bi]:
            nv[bi] = values[offsets[bi] + x[bi] - 2]
            gain[bi] = A * prios[bi] * (v[bi] - nv[bi])
        old_top, old_bot = top[0], bot[0]
        if bi == top[0] or bi == top[1]:  # it fell: rescan for the two largest
            top[0] = -1
            top[1] = -1
            for i in range(n):
                if _ahead(v, i, top[0], False):
                    top[1] = top[0]
                    top[0] = i
                elif _ahead(v, i, top[1], False):
                    top[1] = i
        if bi == bot[1] and _ahead(v, bi, bot[0], True):
            bot[1] = bot[0]
            bot[0] = bi
        elif bi != bot[0] and bi != bot[1]:
            if _ahead(v, bi, bot[0], True):
                bot[1] = bot[0]
                bot[0] = bi
            elif _ahead(v, bi, bot[1], True):
                bot[1] = bi
        full = v[top[0]] != a or v[bot[0]] != b or np.signbit(v[top[0]]) != np.signbit(a) \
            or np.signbit(v[bot[0]]) != np.signbit(b)
        if not full:  # only the dropped model and the holders of the extremes moved
            spread = v[top[0]] - v[bot[0]]
            for i in (bi, old_top, old_bot, top[0], bot[0]):
                ratio[i] = _drop_ratio(i, x, v, values, offsets, prios, cpu, mem, cost, top,
                                       bot, A, G, spread, over_c)


@njit(cache=True)
def _search_start(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G):
    """Where the exchange searches start from ``x``: its values, capacity tolerances,
    usage, the extremes of the values, their weighted total and the objective."""
    n = x.shape[0]
    v = np.empty(n)
    for i in range(n):
        v[i] = _val(values, offsets, length, i, x[i])
    top = np.empty(4, np.int64)
    bot = np.empty(4, np.int64)
    _extremes(v, top, bot)
    total = np.dot(prios, v)
    return (v, 1e-9 * max(1.0, cap_c), 1e-9 * max(1.0, cap_m),
            np.dot(cpu, x.astype(np.float64)), np.dot(mem, x.astype(np.float64)), top, bot,
            total, A * total - G * (v[top[0]] - v[bot[0]]))


@njit(cache=True)
def pair_search(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G, span,
                max_passes):
    """Pairwise re-optimisation in place; ``span`` < 0 means every split of the pair."""
    n = x.shape[0]
    v, tol_c, tol_m, used_c, used_m, top, bot, total, cur = _search_start(
        x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G)
    changed = False
    for _ in range(max_passes):
        improved = False
        for i in range(n):
            if span >= 0 and x[i] <= 1:
                continue
            for j in range(n):
                if j == i or (span < 0 and j < i):
                    continue
                if span >= 0 and x[j] >= length[j]:
                    continue
                base_c = used_c - cpu[i] * x[i] - cpu[j] * x[j]
                base_m = used_m - mem[i] * x[i] - mem[j] * x[j]
                rest = total - prios[i] * v[i] - prios[j] * v[j]
                maxo = _max_excl(v, top, i, j)
                mino = _min_excl(v, bot, i, j)
                if span < 0:
                    a_lo, a_hi = 1, length[i]
                else:
                    a_lo, a_hi = max(1, x[i] - span), x[i] - 1
                best = cur + MIN_GAIN
                ba = -1
                bb = -1
                for a in range(a_lo, a_hi + 1):
                    room = min(_afford(base_c + cpu[i] * a, cap_c, cpu[j], tol_c),
                               _afford(base_m + mem[i] * a, cap_m, mem[j], tol_m))
                    b_hi = min(length[j], room)
                    if span >= 0:
                        b_hi = min(b_hi, x[j] + span)
                    if b_hi < 1:
                        break
                    b_lo = 1 if span < 0 else x[j]
                    if G == 0.0:
                        b_lo = b_hi  # separable: more replicas never hurt
                    va = values[offsets[i] + a - 1]
                    for b in range(b_lo, b_hi + 1):
                        vb = values[offsets[j] + b - 1]
                        hi_v = max(maxo, max(va, vb))
                        lo_v = min(mino, min(va, vb))
                        obj = A * (rest + prios[i] * va + prios[j] * vb) - G * (hi_v - lo_v)
                        if obj > best:
                            best = obj
                            ba = a
                            bb = b
                if ba > 0 and (ba != x[i] or bb != x[j]):
                    used_c = base_c + cpu[i] * ba + cpu[j] * bb
                    used_m = base_m + mem[i] * ba + mem[j] * bb
                    x[i] = ba
                    x[j] = bb
                    v[i] = values[offsets[i] + ba - 1]
                    v[j] = values[offsets[j] + bb - 1]
                    _extremes(v, top, bot)
                    total = np.dot(prios, v)
                    cur = A * total - G * (v[top[0]] - v[bot[0]])
                    improved = True
                    changed = True
        if not improved:
            break
    return changed


@njit(cache=True)
def triple_search(x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G, max_passes):
    """Exact re-optimisation of every triple of models (others fixed), in place."""
    n = x.shape[0]
    v, tol_c, tol_m, used_c, used_m, top, bot, total, cur = _search_start(
        x, values, offsets, length, prios, cpu, mem, cap_c, cap_m, A, G)
    changed = False
    for _ in range(max_passes):
        improved = False
        for i in range(n):
            for j in range(i + 1, n):
                for k in range(j + 1, n):
                    base_c = used_c - cpu[i] * x[i] - cpu[j] * x[j] - cpu[k] * x[k]
                    base_m = used_m - mem[i] * x[i] - mem[j] * x[j] - mem[k] * x[k]
                    rest = total - prios[i] * v[i] - prios[j] * v[j] - prios[k] * v[k]
                    maxo = _max_excl(v, top, i, j, k)
                    mino = _min_excl(v, bot, i, j, k)
                    best = cur + MIN_GAIN
                    ba = -1
                    bb = -1
                    bc = -1
                    for a in range(1, length[i] + 1):
                        ca = base_c + cpu[i] * a
                        ma = base_m + mem[i] * a
                        va = values[offsets[i] + a - 1]
                        for b in range(1, length[j] + 1):
                            room = min(_afford(ca + cpu[j] * b, cap_c, cpu[k], tol_c),
                                       _afford(ma + mem[j] * b, cap_m, mem[k], tol_m))
                            c_hi = min(length[k], room)
                            if c_hi < 1:
                                break
                            vb = values[offsets[j] + b - 1]
                            c_lo = c_hi if G == 0.0 else 1
                            for c in range(c_lo, c_hi + 1):
                                vc = values[offsets[k] + c - 1]
                                hi_v = max(maxo, max(va, max(vb, vc)))
                                lo_v = min(mino, min(va, min(vb, vc)))
                                obj = A * (rest + prios[i] * va + prios[j] * vb + prios[k] * vc)
                                obj -= G * (hi_v - lo_v)
                                if obj > best:
                                    best = obj
                                    ba = a
                                    bb = b
                                    bc = c
                    if ba > 0 and (ba != x[i] or bb != x[j] or bc != x[k]):
                        used_c = base_c + cpu[i] * ba + cpu[j] * bb + cpu[k] * bc
                        used_m = base_m + mem[i] * ba + mem[j] * bb + mem[k] * bc
                        x[i] = ba
                        x[j] = bb
                        x[k] = bc
                        v[i] = values[offsets[i] + ba - 1]
                        v[j] = values[offsets[j] + bb - 1]
                        v[k] = values[offsets[k] + bc - 1]
                        _extremes(v, top, bot)
                        total = np.dot(prios, v)
                        cur = A * total - G * (v[top[0]] - v[bot[0]])
                        improved = True
                        changed = True
        if not improved:
            break
    return changed


def _triple_work(length: np.ndarray, separable: bool) -> float:
    """Candidates one triple pass would score (to decide whether it is affordable)."""
    n = len(length)
    if n < 3:
        return 0.0
    lens = length.astype(float)
    e1, e2, e3 = lens.sum(), (lens**2).sum(), (lens**3).sum()
    if separable:
        return (e1**2 - e2) / 2 * n / 3  # pairs times the triple's third member
    return (e1**3 - 3 * e1 * e2 + 2 * e3) / 6


def _improve(x, tables, prios, cpu, mem, cap_c, cap_m, A, G, cost, span, triples, max_rounds):
    args = (tables.values, tables.offsets, tables.length)
    for _ in range(max_rounds):
        before = x.copy()
        ratio_greedy(x, *args, prios, cpu, mem, cap_c, cap_m, A, G, cost)
        pair_search(x, *args, prios, cpu, mem, cap_c, cap_m, A, G, span, 1000)
        if triples:
            triple_search(x, *args, prios, cpu, mem, cap_c, cap_m, A, G, 1000)
        ratio_greedy(x, *args, prios, cpu, mem, cap_c, cap_m, A, G, cost)
        if np.array_equal(before, x):
            break
    return x


def fast_allocate(tables, prios, cpu, mem, cap_cpu, cap_mem, A, G,
                  full_pair_models: int = 40, pair_span: int = 2, max_rounds: int = 20,
                  triple_budget: float = 2e6):
    """Best integer replica vector found by the construction + exchange heuristics.

    Pair moves try every split when there are at most ``full_pair_models`` models,
    otherwise moves of up to ``pair_span`` replicas between two models. Triples are
    re-optimised exactly when one pass scores at most ``triple_budget`` candidates
    (small instances: a few models and tens of replicas).
    """
    n = len(prios)
    prios = np.asarray(prios, dtype=float)
    cpu = np.asarray(cpu, dtype=float)
    mem = np.asarray(mem, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = np.maximum(cpu / cap_cpu, np.where(cap_mem > 0, mem / max(cap_mem, 1e-300), 0.0))
    cost = np.maximum(cost, 1e-12)
    span = -1 if n <= full_pair_models else int(pair_span)
    triples = 3 <= n and _triple_work(tables.length, G == 0) <= triple_budget
    starts = [np.ones(n, dtype=np.int64)]
    if G > 0:
        filled = np.ones(n, dtype=np.int64)
        water_fill(filled, tables.values, tables.offsets, tables.length, cpu, mem,
                   float(cap_cpu), float(cap_mem))
        starts.append(filled)
    top = tables.length.copy()
    reverse_greedy(top, tables.values, tables.offsets, tables.length, prios, cpu, mem,
                   float(cap_cpu), float(cap_mem), float(A), float(G), cost)
    starts.append(top)
    best_x, best_obj = None, -np.inf
    for x in starts:
        x = _improve(x, tables, prios, cpu, mem, float(cap_cpu), float(cap_mem), float(A),
                     float(G), cost, span, triples, max_rounds)
        vals, _, _ = tables.at(x)
        obj = float(_objective(vals, prios, float(A), float(G)))
        if obj > best_obj + MIN_GAIN:
            best_x, best_obj = x, obj
    return best_x
