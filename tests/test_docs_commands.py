"""Every documented command works as pasted (issue 38): the ``sh`` blocks of README.md (the
tour), docs/models.md, docs/coordinator.md and docs/operations.md run, in page order, one
bash per page (the state of one block carries to the next, as in a reader's shell), in a
scratch home, and each command must succeed (``set -e``) with no Python traceback.

How a block says what it needs, in an HTML comment on the line before its fence
(invisible on GitHub; ``check_annotation`` refuses any other word):

- ``<!-- docs-test: skip (why) -->``: not run; the reason is required (systemd, docker, a
  box over ssh, a real fleet: what cannot run here, and the test that covers it instead).
- ``<!-- docs-test: agent (...) -->``: the block starts the agent (``make run``); the test
  starts what the Makefile's ``run`` recipe starts, on ports of its own, before the page.
- ``<!-- docs-test: needs agent registry s3 PATH -->``: servers the test starts before the
  page (the demo agent, Debian's docker-registry, moto's S3 with a bucket ``models``:
  tests/servers.py), or a path relative to the checkout that must exist (else the block
  is left out, said in the output).

The test runs in a scratch copy of the checkout's top level (symlinks: files the blocks
write stay out of the checkout), ``$HOME`` and ``$TMPDIR`` scratch folders, and the
readers' ``out=$(mktemp -d)`` first. The documented ports (8000, 8001, 8011, 8012, 8100,
8111, 5000, 9000) become free ones in the blocks' text, and ``$EDGEAGENT_URL`` and
``$EDGEAGENT_COORDINATOR_URL`` name the moved agent and coordinator for the commands that
use their defaults. ``make tour`` is not run (it would install into the shared venv): the
test's venv must already hold the extras it installs, which is checked. A command whose
comment names the error status it answers (``# ... (404 until a node reports)``) may exit
non-zero. The pages run as slow tests (``make test-slow``): the tour compiles kernels and
replays hours of traffic.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/models.md", "docs/coordinator.md", "docs/operations.md")
#: The ports the pages name, moved to free ones.
PORTS = (8000, 8001, 8011, 8012, 8100, 8111, 5000, 9000)
SERVERS = ("agent", "registry", "s3")
_ANNOTATION = re.compile(r"^<!-- docs-test: (.*) -->$")
#: A line that would install into (or rebuild) the venv the test itself runs in.
_INSTALLS = re.compile(r"^\s*(?:make\b|\S*pip\s+install\b|\S*python3?\s+-m\s+pip\b|"
                       r"\S*/bin/python3?\s+-m\s+venv\b)")
#: A command whose comment says which error status it answers may fail.
_EXPECTED_ERROR = re.compile(r"^(\.venv/bin/edgeagent [^#]*?)(\s+#.*\b[45]\d\d\b.*)$")


@dataclass
class Block:
    """One ``sh`` block of a page: where it starts, its text and its annotation."""

    page: str
    line: int
    text: str
    skip: str | None = None
    starts_agent: bool = False
    needs: set[str] = field(default_factory=set)


def check_annotation(words: str) -> tuple[str | None, bool, set[str]]:
    """(skip reason, starts the agent, needs) of an annotation; ValueError otherwise."""
    kind, _, rest = words.partition(" ")
    if kind == "skip":
        reason = rest.strip()
        if not (reason.startswith("(") and reason.endswith(")") and len(reason) > 6):
            raise ValueError(f"skip needs a reason in parentheses: {words!r}")
        return reason[1:-1], False, set()
    if kind == "agent":
        return None, True, {"agent"}
    if kind == "needs":
        needs = set(rest.split())
        unknown = {n for n in needs if n not in SERVERS and "/" not in n}
        if not needs or unknown:
            raise ValueError(f"needs takes {', '.join(SERVERS)} or a path: {words!r}")
        return None, False, needs
    raise ValueError(f"unknown docs-test annotation {words!r} (skip, agent, needs)")


def page_blocks(page: str) -> list[Block]:
    lines = (ROOT / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            if lines[i].strip() == "```sh":
                block = Block(page, i + 1, "\n".join(lines[i + 1:end]))
                note = _ANNOTATION.match(lines[i - 1]) if i else None
                if note:
                    block.skip, block.starts_agent, block.needs = check_annotation(
                        note.group(1))
                found.append(block)
            i = end
        i += 1
    return found


# -- quick checks of the pages' form (every run) --------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_each_block_says_what_it_needs_in_words_the_test_knows(page):
    blocks = page_blocks(page)
    assert blocks, page
    text = (ROOT / page).read_text()
    for line in re.findall(r"<!-- docs-test:.*", text):
        assert _ANNOTATION.match(line), f"{page}: a docs-test comment not on its own line"
    assert text.count("<!-- docs-test:") == sum(
        1 for b in blocks if b.skip or b.starts_agent or b.needs), \
        f"{page}: a docs-test comment that is not right above an sh block"


#: Variables a README block may use without setting them: the reader's ``out`` (the
#: README says to make it first) and the shell's own.
_GIVEN = {"out", "HOME", "PATH", "PWD"}


def test_each_readme_block_sets_the_variables_it_uses():
    """A tour step pasted on its own never writes into ``/`` (``$repo/x`` with ``repo``
    unset): a README block sets each variable it uses (loop variables included)."""
    for block in page_blocks("README.md"):
        used = set(re.findall(r"\$\{?([A-Za-z_]\w*)", block.text))
        assigned = set(re.findall(r"(?:^|[\s;(])([A-Za-z_]\w*)=", block.text)) | set(
            re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", block.text))
        loose = used - assigned - _GIVEN
        assert not loose, f"README.md:{block.line}: uses ${', $'.join(sorted(loose))} " \
                          f"without setting it"


def test_make_run_starts_what_the_test_starts_for_it():
    """The agent the test starts for ``make run`` is the Makefile's ``run`` recipe."""
    recipe = (ROOT / "Makefile").read_text().split("\nrun: ", 1)[1].split("\n\n", 1)[0]
    assert "\t$(BIN)/edgeagent serve --host $(HOST) --port $(PORT) --grpc-port " \
           "$(GRPC_PORT) $(ARGS)" in recipe, recipe


# -- running the pages (slow) ----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Box:
    """The scratch home, checkout and servers the pages run against."""

    def __init__(self, tmp: Path, stack: contextlib.ExitStack) -> None:
        self.tmp, self.stack = tmp, stack
        self.checkout = tmp / "work" / "edgeagent"
        self.checkout.mkdir(parents=True)
        for entry in ROOT.iterdir():
            if entry.name not in (".git", "dist", "build", ".pytest_cache"):
                (self.checkout / entry.name).symlink_to(entry)
        shared = ROOT.parent / "shared"
        if shared.is_dir():
            (tmp / "work" / "shared").symlink_to(shared)
        self.home, self.scratch = tmp / "home", tmp / "tmp"
        self.home.mkdir()
        self.scratch.mkdir()
        self.ports = {p: _free_port() for p in PORTS}
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("EDGEAGENT_", "AWS_", "PYTEST_"))}
        self.env |= {"HOME": str(self.home), "TMPDIR": str(self.scratch),
                     "EDGEAGENT_URL": f"http://127.0.0.1:{self.ports[8000]}",
                     "EDGEAGENT_COORDINATOR_URL": f"http://127.0.0.1:{self.ports[8100]}"}
        self.env.pop("XDG_DATA_HOME", None)
        self.started: set[str] = set()

    def ensure(self, need: str) -> None:
        if need in self.started or "/" in need:
            return
        getattr(self, f"_start_{need}")()
        self.started.add(need)

    def _start_agent(self) -> None:
        proc = subprocess.Popen(
            [".venv/bin/edgeagent", "serve", "--host", "127.0.0.1", "--port",
             str(self.ports[8000]), "--grpc-port", str(self.ports[8001])],
            cwd=self.checkout, env=self.env, stdout=subprocess.PIPE,
            stderr=open(self.tmp / "agent.log", "w"), text=True, start_new_session=True)
        self.stack.callback(_stop, proc)
        for line in proc.stdout:
            if "listening on" in line:
                break
        else:
            raise AssertionError((self.tmp / "agent.log").read_text()[-3000:])

    def _start_registry(self) -> None:
        from tests.servers import oci_registry

        registry = self.stack.enter_context(oci_registry(self.tmp / "registry"))
        self.ports[5000] = int(registry.host.rpartition(":")[2])

    def _start_s3(self) -> None:
        from tests.servers import s3_server

        s3 = self.stack.enter_context(s3_server(self.tmp / "s3"))
        self.ports[9000] = int(s3.endpoint_url.rpartition(":")[2])
        self.env |= s3.env
        s3.client().create_bucket(Bucket="models")

    def script(self, blocks: list[Block]) -> tuple[str, list[str]]:
        """The page's bash script, and what it leaves out, with why."""
        lines = ["set -eE -o pipefail",
                 "trap 'echo \"docs-test: FAILED (exit $?): $BASH_COMMAND\" >&2' ERR",
                 "out=$(mktemp -d)"]
        left_out = []
        for block in blocks:
            where = f"{block.page}:{block.line}"
            missing = [n for n in block.needs if "/" in n and not (self.checkout / n).exists()]
            if block.skip or block.starts_agent or missing:
                left_out.append(f"{where}: " + (block.skip or "the test starts the agent"
                                                if not missing else f"no {missing[0]}"))
                continue
            lines.append(f"echo 'docs-test: {where}' >&2")
            lines += [self._line(line) for line in block.text.splitlines()]
        return "\n".join(lines) + "\n", left_out

    def _line(self, line: str) -> str:
        if line.strip() == "make tour":
            return "true  # make tour: the test's venv holds the extras (checked)"
        assert not _INSTALLS.match(line), (
            f"a block installs into the venv ({line.strip()!r}): the test would change the "
            "venv it runs in; annotate the block (skip, agent) or map the line here")
        expected = _EXPECTED_ERROR.match(line)
        if expected:  # its comment names the error it answers
            line = f"{expected.group(1)} || true{expected.group(2)}"
        return re.sub(r"(?<![\d.])(%s)(?!\d)" % "|".join(map(str, PORTS)),
                      lambda m: str(self.ports[int(m.group(1))]), line)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield Box(tmp_path_factory.mktemp("docs"), stack)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the page's own bound below; the tour replays hours of traffic
@pytest.mark.parametrize("page", PAGES)
def test_the_pages_commands_run_as_pasted(box, page):
    from agent.commands import EXTRA_MODULES, _installed

    assert all(_installed(m) for m in EXTRA_MODULES["sim"] + EXTRA_MODULES["coordinator"])
    blocks = page_blocks(page)
    for need in sorted({n for b in blocks if not b.skip for n in b.needs}):
        box.ensure(need)
    script, left_out = box.script(blocks)
    (box.tmp / f"{Path(page).stem}.sh").write_text(script)
    started = time.monotonic()
    log = box.tmp / f"{Path(page).stem}.log"
    # the output to a file, not a pipe: what a failed block leaves in the background
    # (a server started with &) holds the file, so the test waits for the script alone
    with open(log, "w") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=box.checkout, env=box.env,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            proc.wait(timeout=1500)
        finally:
            _stop(proc)  # and what its blocks left in the background
    output = log.read_text()
    print(f"{page}: {time.monotonic() - started:.0f} s; left out: {left_out}")
    assert proc.returncode == 0, f"{page} (whole output in {log}):\n{output[-6000:]}"
    assert "Traceback (most recent call last)" not in output, output[-6000:]
    ran = output.count("docs-test: ")
    assert ran == len(blocks) - len(left_out), (ran, left_out)


def test_no_block_the_test_runs_installs_into_its_venv():
    """``make run``, ``make test`` or a ``pip install`` run by the pages' test would change
    the venv the suite runs in (an editable install moved to the scratch checkout): every
    such block is annotated, and the script refuses any that is not."""
    box = Box.__new__(Box)
    box.ports = {p: p for p in PORTS}
    for page in PAGES:
        for block in page_blocks(page):
            if block.skip or block.starts_agent:
                continue
            for line in block.text.splitlines():
                box._line(line)  # raises for an install
    with pytest.raises(AssertionError, match="installs into the venv"):
        box._line("make run")
    with pytest.raises(AssertionError, match="installs into the venv"):
        box._line(".venv/bin/pip install -e '.[all]'")
