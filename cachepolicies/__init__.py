"""Model-level cache eviction policies, a trace-driven simulator and workload generators.

The same policy objects drive the simulator and the node agent's live cache.

The names below load on first use (PEP 562): the policies import numba, while the
trace readers (``cachepolicies.traces``) do not, so a reader can parse a trace while
another thread imports the policies (``edgeagent simulate``).
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_EXPORTS = {
    "InsufficientSpace": "cachepolicies.pool",
    "Policy": "cachepolicies.base",
    "POLICIES": "cachepolicies.registry",
    "POLICY_NAMES": "cachepolicies.registry",
    "make_policy": "cachepolicies.registry",
    "parse_policy_spec": "cachepolicies.registry",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cachepolicies' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "InsufficientSpace",
    "Policy",
    "POLICIES",
    "POLICY_NAMES",
    "make_policy",
    "parse_policy_spec",
]
