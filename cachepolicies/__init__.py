"""Model-level cache eviction policies, a trace-driven simulator and workload generators.

The same policy objects drive the simulator and the node agent's live cache.
"""

from cachepolicies.base import InsufficientSpace, Policy
from cachepolicies.registry import POLICIES, POLICY_NAMES, make_policy, parse_policy_spec

__all__ = [
    "InsufficientSpace",
    "Policy",
    "POLICIES",
    "POLICY_NAMES",
    "make_policy",
    "parse_policy_spec",
]
