"""The coordinator's planning process dies with the coordinator: a coordinator killed
mid-plan (kill -9, the OOM killer) leaves no planning process running a plan nobody
will read. Real processes: a parent started as a subprocess spawns a child that calls
``exit_with_parent`` and then works (sleeps) as a long plan would; the parent is
SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

PARENT = r"""
import multiprocessing as mp, sys, time

def busy(parent):
    from agent.coordinator.planworker import exit_with_parent
    exit_with_parent(parent, 0.1)
    time.sleep(120)  # a long plan

if __name__ == "__main__":
    import os
    child = mp.get_context("spawn").Process(target=busy, args=(os.getpid(),))
    child.start()
    print(child.pid, flush=True)
    time.sleep(120)
"""


def test_a_child_exits_when_its_parent_is_killed_mid_work(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                              text=True, cwd=os.getcwd())
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        time.sleep(0.5)  # the child is at work, or still importing
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        # within 0.1 s of watching; a loaded box may still be importing it for a while
        gone, _ = psutil.wait_procs([child], timeout=30)
        assert gone, "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
