"""systemd notification protocol (sd_notify), written by hand: one datagram per message
to ``$NOTIFY_SOCKET``. No-ops when not started by systemd with ``Type=notify``."""

from __future__ import annotations

import os
import socket


def notify(message: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``message`` (e.g. ``READY=1``); False when there is no notify socket."""
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.connect(address)
            sock.sendall(message.encode())
        except OSError:
            return False
    return True


def watchdog_interval(environ: dict[str, str] | None = None) -> float | None:
    """Seconds between ``WATCHDOG=1`` pings (half of ``WatchdogSec``), or None."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
