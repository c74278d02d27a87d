"""The models the cache knows: the repository's specs, an entry per version asked for or
loaded, and the version that serves requests naming none (the default: the newest, or
the one the coordinator's version pins name, ``agent.node.cache.versionpins``; or the old
one held while a new one rolls out: ``agent.node.cache.rollout``)."""

from __future__ import annotations

from agent.node.cache.entry import Entry, EntryWatcher
from agent.node.cache.errors import ModelInvalid, NotListed, UnknownModel
from agent.node.cache.lifecycle import AT_REST, State
from agent.node.cache.versionpins import VersionPins
from agent.node.repository import ModelSpec

Key = tuple[str, int]


class Catalog:
    """Specs by name, entries by ``(name, version)``, held serving versions by name."""

    def __init__(self, entries: dict[Key, Entry], watcher: EntryWatcher,
                 pins: VersionPins) -> None:
        self.entries, self.watcher, self.pins = entries, watcher, pins
        self.specs: dict[str, ModelSpec] = {}
        self.held: dict[str, int] = {}  # name -> the old version serving during a rollout

    def default(self, spec: ModelSpec) -> int | None:
        """The version of ``spec`` served once any rollout to it is done: the newest, or
        the one the pins name."""
        return self.pins.served(spec.name, spec.versions)

    def serving(self, name: str) -> int | None:
        """The version requests without one go to."""
        spec = self.specs.get(name)
        default = self.default(spec) if spec is not None else None
        return self.held.get(name, default)

    def entry_for(self, spec: ModelSpec, version: int) -> Entry:
        entry = self.entries.get((spec.name, version))
        if entry is None:
            entry = self.entries[(spec.name, version)] = Entry(spec, version, self.watcher)
        return entry

    def entry(self, name: str, version: int | None = None) -> Entry:
        """The entry for ``name`` (default: the serving version); ``UnknownModel``,
        ``NotListed`` or ``ModelInvalid`` when there is none."""
        spec = self.specs.get(name)
        if spec is None:
            raise UnknownModel(f"Request for unknown model {name!r}")
        if version is None:
            version = self.held.get(name, self.default(spec))  # ``serving``, per request
            if version is None and spec.pending and not spec.error:
                raise NotListed(spec.pending)
            if version is None:
                raise ModelInvalid(spec.error or f"model {name!r} has no version")
        elif version not in spec.versions:
            raise UnknownModel(f"model {name!r} has no version {version} (versions: "
                               f"{', '.join(map(str, spec.versions)) or 'none'})")
        return self.entry_for(spec, version)

    def listing(self) -> list[Entry]:
        """Default-version entries of every model, plus other versions that were used."""
        out = []
        for (name, version), entry in sorted(self.entries.items()):
            spec = self.specs.get(name)
            if spec is None:
                if entry.state is not State.UNLOADED:
                    out.append(entry)
            elif (version == self.default(spec) or entry.stats.loads
                  or entry.state is not State.UNLOADED):
                out.append(entry)
        return out

    def adopt(self, specs: dict[str, ModelSpec]) -> list[Entry]:
        """Take a rescan: entries of versions still listed follow their new spec (a
        failed load whose config changed is forgotten), those of versions gone are
        dropped at rest; returns the READY idle ones gone, to unload."""
        self.specs = dict(specs)
        gone = []
        for (name, version), entry in list(self.entries.items()):
            spec = specs.get(name)
            if spec is not None and version in spec.versions:
                if entry.state is State.FAILED and spec.config != entry.spec.config:
                    entry.life.forget_failure()  # its config changed: try again at once
                entry.spec = spec
                if entry.state is State.UNLOADED and spec.config.pin:
                    entry.pin(True)
            elif entry.state in AT_REST:
                del self.entries[(name, version)]
            elif entry.state is State.READY and entry.account.in_flight == 0:
                gone.append(entry)
        self.add_defaults()
        for name in set(self.held) - set(specs):
            del self.held[name]
        return gone

    def add_defaults(self) -> None:
        """An entry for each model's default version (listed, loaded or not)."""
        for spec in self.specs.values():
            version = self.default(spec)
            if version is not None:
                self.entry_for(spec, version)
