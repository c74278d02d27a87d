"""Leases on the coordinator's side: what a node's full report leaves behind so that its
leases can be answered without it, and the version of the answer that lets a node whose
directives and routing table stand get a few bytes back (``agent.wire``, "Leases").

* **The basis.** A full report that carries a ``report_id`` (a node that renews leases
  between full reports) leaves its basis here: that id, the models it had resident and
  those it held (what its directives depend on: ``prefetch`` and ``drop``), and whether
  it routes. A lease that names the same report is answered from it; one that names
  another (the report went to another process: a report worker that never saw it, a
  coordinator since restarted) gets ``{"report": true}``, and the node sends its full
  report at once. Each process keeps the bases of the reports it answered: a node's
  kept connection stays with one listener, and a node that moves pays one full report.
* **The answer's version.** A digest of the directives' JSON and the routing table's
  version: the same directives and table make the same version in every process and
  every coordinator sharing a store (the directives come from the plan's rows, the
  table's version is a digest of its content), so a node that lands elsewhere is not
  sent its directives again. Made once per change of either, not per answer.

A basis is a few tuples of strings per node (which the garbage collector stops walking).
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from agent.wire import NodeReport

#: The answer to a lease whose report this process does not hold: send it in full.
SEND_REPORT = b'{"report":true}\n'


class Basis(NamedTuple):
    """What a node's last full report said that its directives depend on."""

    report_id: int
    resident: tuple[str, ...]
    held: tuple[str, ...]
    routes: bool


def basis_of(report: NodeReport) -> Basis | None:
    """The basis ``report`` leaves (None: a node that sends no ``report_id``, every
    report in full)."""
    if report.report_id is None:
        return None
    return Basis(report.report_id,
                 tuple(sorted(m for m, r in report.models.items() if r.resident)),
                 tuple(sorted(report.held())), report.routing is not None)


def answer_version(directives_json: bytes, routing_version: int | None) -> int:
    """The version of an answer: a digest of its directives' JSON and its routing
    table's version, under 2**48 (exact in every JSON reader)."""
    digest = hashlib.blake2b(b"%s|%d" % (directives_json, -1 if routing_version is None
                                         else routing_version), digest_size=6).digest()
    return int.from_bytes(digest, "big")


def renewed(version: int) -> bytes:
    """The answer to a lease whose answer stands (its directives renewed for their
    ``ttl_s``, its routing table confirmed)."""
    return b'{"answer":%d}\n' % version


def with_version(directives_json: bytes, version: int) -> bytes:
    """``directives_json`` (an object) with its ``answer`` version."""
    return directives_json[:-1] + b',"answer":%d}' % version


class LeaseBook:
    """Per node: the basis of its last full report answered here, and its answer's
    version as last made (``version``: made again only when the directives' JSON, a
    new object, or the routing table's version changed)."""

    def __init__(self) -> None:
        self._basis: dict[str, Basis] = {}
        self._versions: dict[str, tuple[bytes, int | None, int]] = {}

    def note(self, node: str, basis: Basis | None) -> None:
        """``node``'s full report was answered here (None: it sends no report id)."""
        if basis is None:
            self._basis.pop(node, None)
        else:
            self._basis[node] = basis

    def basis(self, node: str, report_id: int) -> Basis | None:
        """``node``'s basis if it is that of report ``report_id``; else None."""
        basis = self._basis.get(node)
        return basis if basis is not None and basis.report_id == report_id else None

    def version(self, node: str, directives_json: bytes, routing_version: int | None) -> int:
        last = self._versions.get(node)
        if last is not None and last[0] is directives_json and last[1] == routing_version:
            return last[2]
        version = answer_version(directives_json, routing_version)
        self._versions[node] = (directives_json, routing_version, version)
        return version

    def forget(self, node: str) -> None:
        self._basis.pop(node, None)
        self._versions.pop(node, None)

    def __len__(self) -> int:
        return len(self._basis)
