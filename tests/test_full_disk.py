"""A full disk while the agent persists its resident set and footprints (issue 13): no
temporary file is left behind, the old file stays whole, the error is logged, and the
agent keeps serving.

The disk is filled by a test double: a file opener whose file object writes part of the
text, then raises ENOSPC, as ``write()`` does on a full filesystem. A real full
filesystem would need a tiny tmpfs or loop mount, which needs privileges (CAP_SYS_ADMIN)
that neither the test runner nor CI's containers are given."""

from __future__ import annotations

import errno
import json
import logging
import time

import pytest

from agent.memory import write_atomic
from tests.helpers import AgentServer, add_mlp, v2_body


class FullDisk:
    """``open`` for a disk that fills up after ``room`` bytes: writes past it raise
    ENOSPC (the bytes before it reach the real file, as on a real disk)."""

    def __init__(self, room: int = 10) -> None:
        self.room, self.opened = room, []

    def __call__(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        self.opened.append(path)
        room = self.room
        real_write = f.write

        def write(text):
            nonlocal room
            if len(text) > room:
                real_write(text[:room])
                room = 0
                raise OSError(errno.ENOSPC, "No space left on device")
            room -= len(text)
            return real_write(text)

        f.write = write
        return f


def test_write_atomic_leaves_no_temp_file_and_the_old_file_whole(tmp_path):
    path = tmp_path / "state.json"
    write_atomic(path, '{"old": true}')
    disk = FullDisk(room=5)
    with pytest.raises(OSError) as err:
        write_atomic(path, json.dumps({"new": "x" * 100}), open_file=disk)
    assert err.value.errno == errno.ENOSPC
    assert disk.opened and not disk.opened[0].exists()  # the temp file was there, and gone
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    assert json.loads(path.read_text()) == {"old": True}
    write_atomic(path, '{"new": true}')  # room again: written
    assert json.loads(path.read_text()) == {"new": True}


def test_agent_keeps_serving_on_a_full_disk(repo, tmp_path, caplog):
    from agent.config import AgentConfig

    add_mlp(repo, "mlp")
    data = tmp_path / "data"
    data.mkdir()
    (data / "resident.json").write_text('{"format": 1, "resident": [], "pins": {}}')
    before = (data / "resident.json").read_text()
    disk = FullDisk(room=10)
    config = AgentConfig(repository=repo, data_dir=data, cpu_budget=200_000_000,
                         infer_threads=2)
    with caplog.at_level(logging.WARNING):
        agent = AgentServer(config, budgets={"cpu": 200_000_000}, open_file=disk)
        try:
            for _ in range(3):
                status, _, reply = agent.request("POST", "/v2/models/mlp/infer",
                                                 v2_body([1, 2, 3, 4]))
                assert status == 200, reply
            deadline = time.monotonic() + 10  # the state is written 0.2 s after a load
            while not any("cannot write state file" in r.getMessage()
                          for r in caplog.records) and time.monotonic() < deadline:
                time.sleep(0.05)
            agent.request("POST", "/v2/repository/models/mlp/unload")
            assert agent.request("POST", "/v2/models/mlp/infer", v2_body([1, 2, 3, 4]))[0] == 200
        finally:
            agent.close()  # persists once more, on the full disk
    messages = [r.getMessage() for r in caplog.records]
    assert any("cannot write state file" in m and "No space left" in m for m in messages)
    assert any("cannot write footprint file" in m and "No space left" in m for m in messages)
    assert len(disk.opened) >= 2
    assert not [p.name for p in data.rglob("*.tmp")]  # no temporary file left behind
    assert (data / "resident.json").read_text() == before  # the old state, whole
