"""The simulator's plain replay compiled ahead of time: a simulate process that loads it
needs no numba.

Per policy, a Python extension module whose ``replay(parameters, ids, times, size,
penalty, capacity, trims) -> (loads, status, resident)`` builds a fresh state with the
policy module's ``new_state(res, *parameters)`` (an oracle's with a clock over ``ids``)
and runs ``replay.replay`` over it, as ``simulator._replay_compiled`` does. numba's
ahead-of-time compiler (``numba.pycc``, which needs a C compiler) builds it from the
very kernels the agent interprets and numba's JIT compiles, so all three decide alike;
the module links numba's small runtime in and imports only numpy.

A policy's module is built the first time a simulate process asks for it after an
install or an edit of the package (the file is named by ``cachepolicies.sourcestamp``),
in a child process, beside numba's cache (``cachepolicies/__pycache__``, else under
``NUMBA_CACHE_DIR`` or the user's cache, a directory per checkout). A build that fails
leaves a note beside it naming why (``replay_<policy>-<stamp>-<machine>.failed``); later
processes of the same sources then go straight to numba's JIT instead of trying again.

    python -m cachepolicies.native lru cremebrulee   # build them now, print their paths
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from cachepolicies.sourcestamp import PACKAGE, package_stamp


def module_name(policy: str) -> str:
    """The extension module of ``policy`` (``cremebrulee-oracle`` →
    ``replay_cremebrulee_oracle``)."""
    return "replay_" + policy.replace("-", "_")


def cache_directory() -> Path:
    """Where numba caches the kernels, so both caches live and go together; outside the
    package, one directory per checkout (each keeps only its own sources' modules)."""
    beside = PACKAGE / "__pycache__"
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if not configured and os.access(beside if beside.exists() else PACKAGE, os.W_OK):
        return beside
    root = Path(configured) if configured else \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgeagent"
    checkout = hashlib.sha256(str(PACKAGE.resolve()).encode()).hexdigest()[:12]
    return root / f"cachepolicies-native-{checkout}"


def build_tag() -> str:
    """What a module is valid for: these sources, numpy's major version, this machine."""
    import numpy as np

    return f"{package_stamp()[:20]}-np{np.__version__.split('.')[0]}-{platform.machine()}"


def module_path(policy: str, directory: Path | None = None, tag: str | None = None) -> Path:
    """The module file of ``policy`` for ``tag`` (default: ``build_tag()``) and this
    interpreter."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return ((directory or cache_directory())
            / f"{module_name(policy)}-{tag or build_tag()}{suffix}")


def failure_note(path: Path) -> Path:
    """The note a failed build of the module ``path`` leaves."""
    return path.with_name(path.name.split(".", 1)[0] + ".failed")


def load(policy: str, path: Path | None = None) -> ModuleType | None:
    """The built module of ``policy`` (at ``path``, default: this stamp's), or None
    when there is none or it does not load."""
    path = path or module_path(policy)
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(module_name(policy), path)
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


def ensure(policies: Sequence[str], *, timeout: float = 900,
           on_build: Callable[[list[str]], None] | None = None
           ) -> dict[str, ModuleType] | None:
    """The modules of ``policies`` (names, not specs), those missing built first in one
    child process (``on_build`` is told which, before); None when one cannot be had (a
    build failed for these sources before, or fails now: its note says why)."""
    directory, tag = cache_directory(), build_tag()
    paths = {name: module_path(name, directory, tag) for name in dict.fromkeys(policies)}
    modules = {name: load(name, path) for name, path in paths.items()}
    missing = [name for name, module in modules.items() if module is None]
    if any(failure_note(paths[name]).exists() for name in missing):
        return None
    if missing:
        if on_build is not None:
            on_build(missing)
        why = _build_in_child(missing, timeout)
        for name in missing:
            modules[name] = load(name, paths[name])
            if modules[name] is None:
                _write_note(failure_note(paths[name]), why)
    return None if None in modules.values() else modules


def _build_in_child(policies: list[str], timeout: float) -> str:
    """Build the modules of ``policies`` in a child process (numba compiles there);
    what it said, for a failure note."""
    env = {**os.environ, "EDGEAGENT_JIT": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", "cachepolicies.native", *policies],
                              cwd=PACKAGE.parent, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    return f"exit status {done.returncode}: {(done.stdout + done.stderr)[-4000:]}"


def build(policy: str, path: Path | None = None) -> Path:
    """Compile the replay of ``policy`` into its extension module (numba and a C compiler
    needed; ``EDGEAGENT_JIT`` must not be 0): written beside, then renamed into place;
    the module's files of other stamps go."""
    import tempfile
    import warnings

    from numba import typeof, types

    from cachepolicies.jit import COMPILED
    from cachepolicies.registry import POLICIES, make_policy

    if not COMPILED:
        raise RuntimeError("EDGEAGENT_JIT=0: the kernels are interpreted, nothing to compile")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numba.pycc's pending deprecation
        from numba.pycc import CC

    path = path or module_path(policy)
    ints, floats = types.Array(types.int64, 1, "C"), types.Array(types.float64, 1, "C")
    parameters = make_policy(policy, future=(0,)).state_parameters
    signature = types.Tuple((ints, types.int64, types.int64))(
        typeof(parameters), ints, floats, ints, floats, types.int64, types.boolean)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as scratch:
        cc = CC(module_name(policy), source_module=__name__)
        cc.output_dir, cc.output_file = scratch, path.name
        cc.export("replay", signature)(_replay_of(POLICIES[policy]))
        cc.compile()
        os.replace(Path(scratch) / path.name, path)
    for old in path.parent.glob(f"{module_name(policy)}-*"):  # other stamps' files
        if old != path:
            old.unlink(missing_ok=True)
    return path


def _replay_of(cls: type):
    """The replay of policy class ``cls`` as a Python function for ``CC.export``."""
    from cachepolicies import future, kernels, replay
    from cachepolicies.jit import njit

    new_state = sys.modules[cls.__module__].new_state
    if cls.needs_future:
        @njit
        def start(res, parameters, ids):
            clock = future.new_clock(ids, future.next_uses(ids, len(res.size)))
            return new_state(res, clock)
    else:
        @njit
        def start(res, parameters, ids):
            return new_state(res, *parameters)

    def run(parameters, ids, times, size, penalty, capacity, trims):
        res = kernels.new_resident(len(size))
        state = start(res, parameters, ids)
        loads, status = replay.replay(state, trims, ids, times, size, penalty, capacity)
        return loads, status, kernels.resident_count(res)

    return run


def _write_note(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError:
        pass  # a read-only cache: the next process tries again


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(build(name))
