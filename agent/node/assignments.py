"""The models the coordinator moves here and away (its ``pull`` and ``drop``
directives, ``agent.node.reporter``).

A pulled model the node's repository does not have is written as an assigned model
directory, ``<data_dir>/assigned/<model>/config.yaml`` (its config with the source; the
repository scan's second root, where the operator's own entry of the same name wins,
logged), its source listed, its files pulled by the disk tier (``DiskTier.ensure``) and,
with ``load``, loaded. A pull with a ``digest`` pins it in the config (with its
``version``, the one version served): the disk tier refuses a version of another digest.
A pull naming a version (or digest) the node has not seen lists the source again: a newer
version found is rolled out (``agent.node.cache.rollout``); a version a rollout pins
(``agent.node.coordinatorversions``) is the one pulled. A dropped model is unloaded
once idle (``ModelCache.unload_when_idle``; not while pinned, loading or unloading: the
next directives try again), then its directory is removed and its files left to the disk
tier (``DiskTier.drop``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from typing import TYPE_CHECKING, Any

from agent.config import parse_model_config
from agent.node.cache import CacheError
from agent.node.cache.lifecycle import State
from agent.sources import redact_url
from agent.wire import Pull, refuse_credentials

if TYPE_CHECKING:
    from agent.node.node import Node

log = logging.getLogger("edgeagent.reporter")


class Assignments:
    """The pulls and drops under way, and the last error of each model's pull."""

    def __init__(self, node: Node) -> None:
        self.node = node
        #: model -> its pull directive being carried out (one at a time per model)
        self.assigning: dict[str, asyncio.Task] = {}
        self.dropping: dict[str, asyncio.Task] = {}  # unloads before a drop
        #: model -> (version, digest) of the last pull carried out: a pull naming
        #: another lists the source again
        self._pulled: dict[str, tuple[int | None, str | None]] = {}
        self._shadowed: set[str] = set()  # pulls the operator's own entry outranks
        self.assign_errors: dict[str, str] = {}

    def tasks(self) -> list[asyncio.Task]:
        """The pulls and the unloads before a drop, under way or done."""
        return [*self.assigning.values(), *self.dropping.values()]

    def status(self) -> dict[str, Any]:
        """``assigning`` and ``assign_errors`` of ``GET /v1/coordinator``."""
        return {"assigning": sorted(n for n, t in self.assigning.items() if not t.done()),
                "assign_errors": dict(self.assign_errors)}

    def assigned(self, name: str) -> bool:
        """``name`` is served from an assigned model directory (the coordinator's)."""
        spec = self.node.cache.specs.get(name)
        return spec is not None and spec.path == self.node.config.assigned_dir / name

    def assign(self, pull: Pull) -> None:
        """Carry out ``pull`` in the background (one at a time per model)."""
        task = self.assigning.get(pull.model)
        if task is not None and not task.done():
            return
        self.assigning[pull.model] = asyncio.get_running_loop().create_task(
            self._carry_out(pull))

    async def _carry_out(self, pull: Pull) -> None:
        name = pull.model
        try:
            await self._pull(pull)
            self.assign_errors.pop(name, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged; the next directives try again
            self.assign_errors[name] = f"{type(exc).__name__}: {exc}" \
                if not isinstance(exc, (ValueError, CacheError)) else str(exc)
            log.warning("coordinator's pull of %s: %s", name, self.assign_errors[name])

    async def _pull(self, pull: Pull) -> None:
        """Write ``pull``'s model directory, list its source, pull its files, load it."""
        node, name = self.node, pull.model
        spec = node.cache.specs.get(name)
        if spec is not None and not self.assigned(name):
            if name not in self._shadowed:
                self._shadowed.add(name)
                log.info("coordinator's pull of %s: the repository's own entry %s serves "
                         "it", name, spec.path)
            return
        refuse_credentials(pull.source, pull.source_options)
        doc = {**pull.config, "source": pull.source,
               "source_options": dict(pull.source_options)}
        if pull.digest is not None:  # a digest pins one version: the catalog's, or
            doc["digest"] = pull.digest  # the newest listed
            if pull.version is not None:
                doc["version"] = pull.version
        where = node.config.assigned_dir / name / "config.yaml"
        parse_model_config(doc, where)  # ConfigError (a ValueError) names the key
        text = yaml_text(doc)
        relist = spec is None or self._pulled.get(name) != (pull.version, pull.digest)
        if spec is None or _read(where) != text:
            await asyncio.get_running_loop().run_in_executor(None, _write_atomically,
                                                             where, text)
            log.info("coordinator assigns %s from %s", name, redact_url(pull.source))
            node.rescan(relist=False)
        if relist or pull.version not in (None, *node.cache.specs[name].versions):
            if await node.disk.refresh([name]):
                node.rescan(relist=False)
        spec = node.cache.specs[name]
        if spec.error or spec.pending:
            raise ValueError(spec.error or spec.pending)
        version = self._version(name, pull)
        if version not in spec.versions:
            raise ValueError(f"model {name!r}: its source lists no version {version} "
                             f"(versions: {', '.join(map(str, spec.versions)) or 'none'})")
        self._pulled[name] = (pull.version, pull.digest)
        await node.disk.ensure(name, version)
        if pull.load:
            await node.cache.ensure_loaded(name)

    def _version(self, name: str, pull: Pull) -> int | None:
        """The version a pull's files are for: the one a rollout pins (exactly: the one
        below serves meanwhile), else the default, at least the pull's ``version``."""
        cache = self.node.cache
        pin = cache.version_pins.get(name)
        if pin is not None and pin.serve is not None:
            return pin.serve
        version = cache.default_version(name)
        if pin is None and pull.version is not None:
            version = max(pull.version, version or 0)
        return version

    def drop(self, name: str) -> None:
        """Unload assigned ``name`` once idle, remove its directory, free its files."""
        if not self.assigned(name):
            return
        if any(t is not None and not t.done()
               for t in (self.assigning.get(name), self.dropping.get(name))):
            return
        cache = self.node.cache
        entries = [e for (n, _), e in cache.entries.items() if n == name]
        if any(e.account.pinned or e.state in (State.LOADING, State.UNLOADING)
               for e in entries):
            return  # busy: the next directives try again
        ready = [e for e in entries if e.state is State.READY]
        if ready:  # removed once unloaded (the next directives)
            self.dropping[name] = asyncio.get_running_loop().create_task(
                self._unload_all(ready))
            return
        shutil.rmtree(self.node.config.assigned_dir / name, ignore_errors=True)
        self._pulled.pop(name, None)
        self.node.rescan(relist=False)
        self.node.disk.drop(name)
        log.info("coordinator moved %s away: dropped", name)

    async def _unload_all(self, entries: list[Any]) -> None:
        for entry in entries:
            await self.node.cache.unload_when_idle(entry)


def yaml_text(doc: dict[str, Any]) -> str:
    import yaml

    return "# written by edgeagent for the coordinator's pull directive\n" + \
        yaml.safe_dump(doc, sort_keys=True)


def _read(path: Any) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def _write_atomically(path: Any, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
