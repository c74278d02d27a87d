"""The systemd units carry the hardening and settings docs/operations.md promises."""

from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"


def directives(unit: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, value = line.split("=", 1)
            found.setdefault(key.strip(), []).append(value.strip())
    return found


@pytest.mark.parametrize("unit, state", [("edgeagent.service", "edgeagent"),
                                          ("edgeagent-coordinator.service",
                                           "edgeagent-coordinator")])
def test_unit_is_hardened_and_can_write_its_caches(unit, state):
    d = directives(unit)
    assert d["Restart"] == ["on-failure"]
    assert d["DynamicUser"] == ["yes"] and d["NoNewPrivileges"] == ["yes"]
    assert d["ProtectSystem"] == ["strict"]
    assert d["StateDirectory"][0].split()[0] == state
    # numba must cache compiled kernels somewhere writable under ProtectSystem=strict.
    cache = [v for v in d.get("Environment", []) if v.startswith("NUMBA_CACHE_DIR=")]
    assert cache and cache[0].split("=", 1)[1].startswith(f"/var/lib/{state}/")
    # open files past systemd's 1024: the connection bounds are a quarter of it
    # (tests/test_strangers.py holds 2,000 connections at this limit)
    assert int(d["LimitNOFILE"][0]) >= 16384


def test_agent_unit_is_a_notify_service_with_a_watchdog():
    d = directives("edgeagent.service")
    assert d["Type"] == ["notify"] and int(d["WatchdogSec"][0]) > 0
    assert d["MemoryMax"] and d["ExecReload"][0].endswith("-HUP $MAINPID")


@pytest.mark.parametrize("unit, config, keys", [
    ("edgeagent.service", "edgeagent", ("admin-token",)),
    ("edgeagent-coordinator.service", "edgeagent-coordinator", ("admin-token",))])
def test_units_take_secrets_as_credentials_and_are_confined(unit, config, keys):
    """Tokens come through LoadCredential= (readable by the service alone, under
    /run/credentials/<unit>/, which the unit's comment tells the config to name); the
    service may open only local and IP sockets and make the system-service calls."""
    d = directives(unit)
    assert sorted(d["LoadCredential"]) == sorted(f"{k}:/etc/{config}/{k}" for k in keys)
    text = (UNITS / unit).read_text()
    for key in keys:  # the config names it there, or ExecStart does
        assert f"/run/credentials/{unit}/{key}" in text or \
            f"${{CREDENTIALS_DIRECTORY}}/{key}" in d["ExecStart"][0]
    assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert d["SystemCallFilter"] == ["@system-service"]
    assert d["CapabilityBoundingSet"] == [""] and d["RestrictNamespaces"] == ["yes"]
    assert "MemoryDenyWriteExecute" not in d  # numba writes the kernels it compiles
