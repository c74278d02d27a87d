"""Policy names and their parameters, parsed in one place.

A policy spec is ``NAME`` or ``NAME:key=value,key=value``, e.g.
``cremebrulee:rate=cumulative`` or ``cremebrulee:half_life=120``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from cachepolicies.base import Key, Policy
from cachepolicies.beladymin import BeladyMin
from cachepolicies.cremebrulee import CremeBrulee
from cachepolicies.cremebrulee_forecast import CremeBruleeForecast
from cachepolicies.cremebrulee_oracle import CremeBruleeOracle
from cachepolicies.gdsf import GDSF
from cachepolicies.lru import LRU
from cachepolicies.popularity import Popularity
from cachepolicies.random_policy import RandomPolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (LRU, RandomPolicy, Popularity, GDSF, BeladyMin, CremeBrulee,
                CremeBruleeForecast, CremeBruleeOracle)
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def parse_policy_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split ``NAME:k=v,k=v`` into the name and raw string parameters."""
    name, _, rest = spec.strip().partition(":")
    params: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad policy parameter {item!r} in {spec!r}: expected key=value")
        params[key.strip()] = value.strip()
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}: expected one of {', '.join(POLICY_NAMES)}")
    return name, params


def make_policy(
    spec: str, *, future: Sequence[Key] | None = None, seed: int = 0, **overrides: object
) -> Policy:
    """Build the policy a spec names. Oracles need ``future``; ``random`` uses ``seed``.

    String parameters are converted to the type of the constructor's default value;
    unknown parameters are an error naming the policy and what it accepts.
    """
    name, raw = parse_policy_spec(spec)
    cls = POLICIES[name]
    signature = inspect.signature(cls.__init__)
    accepted = {p.name: p for p in signature.parameters.values() if p.name != "self"}
    kwargs: dict[str, object] = {}
    for key, value in {**raw, **overrides}.items():
        if key not in accepted or key == "future":
            allowed = ", ".join(k for k in accepted if k != "future") or "none"
            raise ValueError(f"policy {name!r} has no parameter {key!r} (accepts: {allowed})")
        kwargs[key] = _convert(name, key, value, accepted[key].default)
    if "seed" in accepted and "seed" not in kwargs:
        kwargs["seed"] = seed
    if cls.needs_future:
        if future is None:
            raise ValueError(f"policy {name!r} is an oracle: it needs the future request trace")
        kwargs["future"] = future
    return cls(**kwargs)


def _convert(policy: str, key: str, value: object, default: object) -> object:
    if not isinstance(value, str) or default is inspect.Parameter.empty:
        return value
    try:
        if isinstance(default, bool):
            return value.lower() in ("1", "true", "yes", "on")
        if isinstance(default, (int, float, str)):
            return type(default)(value)
    except ValueError:
        raise ValueError(
            f"policy {policy!r}: parameter {key}={value!r} is not a valid {type(default).__name__}"
        ) from None
    return value


def prime_policy(spec: str) -> None:
    """Run each verb of a throwaway ``spec`` policy once, so that its compiled kernels
    are loaded (or compiled) now rather than on the first request that needs them."""
    policy = make_policy(spec, future=(0, 1, 0))
    policy.record_access(0, 0.0)
    policy.admit(0, 10, 1.0, 0.0)
    policy.record_access(1, 1.0)
    policy.admit(1, 10, 1.0, 1.0)
    for key in policy.choose_victims(5, 2.0, lambda key: True):
        policy.remove(key)
