"""numba for the policy kernels, or a pure-Python stand-in that runs the same source.

The kernels (``cachepolicies.kernels`` and every policy's) are written against the few
numba names this module exports: ``njit``, ``types.StructRef``, ``structref.register`` /
``StructRefProxy`` / ``define_proxy`` and ``overload``. With numba they are compiled (the
simulator: millions of decisions per second). Without it they run as plain Python over
the same numpy arrays, decision for decision the same, at a few microseconds a call: what
the node agent needs (one decision per request), without numba and llvmlite in its
resident memory (``bench/idle_rss.py``, ``bench/live_policy.py``).

The choice is made once per process, when the kernels are first imported, by the
environment variable ``EDGEAGENT_JIT``: ``1`` compiles, ``0`` interprets; unset, compile
(``edgeagent serve`` sets ``0`` unless it is set; so does ``edgeagent simulate`` when
it replays with modules compiled ahead of time, ``cachepolicies.native``, whose policy
objects only give their parameters). ``COMPILED`` says which was taken.
"""

from __future__ import annotations

import os
from typing import Any

COMPILED = os.environ.get("EDGEAGENT_JIT", "1").strip() != "0"


def _import_arraymath_without_scipy_linalg() -> None:
    """Import ``numba.np.arraymath`` such that it does not import ``scipy.linalg``.

    ``numba.np.arraymath`` imports ``scipy.linalg.cython_blas`` when it is first loaded,
    only to learn whether BLAS exists (a large import, numpy.f2py included). numba loads it
    before compiling anything; called before a kernel compiles, this makes that check
    ask whether scipy is installed instead. numba still imports the real BLAS when it
    compiles a function that uses it (``np.dot``), as before. Any surprise in numba's
    layout leaves numba's own behaviour untouched.
    """
    import importlib.util
    import sys

    if "numba.np.arraymath" in sys.modules:
        return
    try:
        from numba.np import linalg
    except ImportError:
        return
    real = getattr(linalg, "ensure_blas", None)
    if real is None:
        return

    def scipy_installed() -> None:
        if importlib.util.find_spec("scipy") is None:
            raise ImportError("scipy 0.16+ is required for linear algebra")

    linalg.ensure_blas = scipy_installed
    try:
        from numba.np import arraymath
    finally:
        linalg.ensure_blas = real
    if getattr(arraymath, "ensure_blas", None) is scipy_installed:
        arraymath.ensure_blas = real


def _load_cached_kernels_lean() -> None:
    """Load cached kernels without numba's full target refresh.

    Before loading a kernel from its on-disk cache numba refreshes its CPU target: the
    first refresh imports and installs every implementation registry (linear algebra,
    random generators, typed containers, jitclass, datetime, ...) in every simulate
    process, although running already compiled machine code needs none of
    it, only numba's runtime (NRT, for the arrays a kernel allocates). Here a cache
    load initialises the runtime only (so neither ``numba.np.arraymath`` nor scipy ever
    loads into a simulate process whose kernels are cached). Compiling is unchanged:
    ``compile_extra`` refreshes both contexts before every compilation (a cache miss,
    a new signature, any other ``@njit``), which installs whatever was skipped; on a
    miss, arraymath is imported first without ``scipy.linalg``. Any surprise in numba's
    layout leaves numba's own behaviour untouched.
    """
    try:
        from numba.core.caching import Cache
        from numba.core.runtime import rtsys
    except ImportError:
        return
    if not all(hasattr(Cache, name) for name in ("load_overload", "_load_overload",
                                                 "_guard_against_spurious_io_errors")):
        return
    if not hasattr(rtsys, "initialize"):
        return

    def load_overload(self, sig, target_context):
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            compiled = self._load_overload(sig, target_context)
        if compiled is None:  # numba compiles it next
            _import_arraymath_without_scipy_linalg()
        return compiled

    Cache.load_overload = load_overload


if COMPILED:
    _load_cached_kernels_lean()
    from numba import njit, types
    from numba.experimental import structref
    from numba.extending import overload
else:
    import types as _pytypes

    def njit(fn=None, **options: Any):
        """The function itself (``njit``'s options mean nothing to the interpreter)."""
        return fn if fn is not None else (lambda f: f)

    class StructRef:
        """Stands for ``numba.types.StructRef``: a state type, subclassed per policy."""

    class StructRefProxy:
        """Stands for ``numba.experimental.structref.StructRefProxy``: instances are
        plain objects whose fields (``define_proxy``) are set positionally."""

        _fields: tuple[str, ...] = ()

        def __init__(self, *values: Any) -> None:
            for name, value in zip(self._fields, values, strict=True):
                setattr(self, name, value)

    def _register(state_type: type) -> type:
        return state_type

    def _define_proxy(proxy: type, state_type: type, fields: list[str]) -> None:
        """Give ``proxy`` its fields; ``state_type.proxy`` names it (for verbs)."""
        proxy._fields = tuple(fields)
        state_type.proxy = proxy

    def overload(verb):
        """Verbs are dispatched by ``kernels.implements`` on the state's class instead."""
        raise NotImplementedError("overload is numba's; kernels.implements dispatches verbs")

    types = _pytypes.SimpleNamespace(StructRef=StructRef)
    structref = _pytypes.SimpleNamespace(register=_register, StructRefProxy=StructRefProxy,
                                         define_proxy=_define_proxy)

__all__ = ["COMPILED", "njit", "overload", "structref", "types"]
