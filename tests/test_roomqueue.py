"""The one room queue (``cachepolicies.roomqueue``) that the memory tier, the disk tier
and the twin wait for room in: deadline-then-arrival order, head of line, a futile wait
refused, a withdrawn grant given back, a deadline that passes, a change told while
granting; and every tier holds one."""

import asyncio
import functools

import pytest

from cachepolicies.pool import MemoryPool
from cachepolicies.registry import make_policy
from cachepolicies.roomqueue import RoomQueue, RoomTimeout, Waiter
from tests.helpers import add_synthetic


class Budget:
    """A ``Room`` over a plain byte count: grants what is free, nothing is evictable."""

    def __init__(self, free: int, futile: bool = False) -> None:
        self.free, self.refuse, self.granted, self.returned = free, futile, [], 0
        self.queue: RoomQueue | None = None

    def take(self, waiter: Waiter, now: float) -> list | None:
        if waiter.need > self.free:
            return None
        self.free -= waiter.need
        self.granted.append(waiter.key)
        return []

    def futile(self, waiter: Waiter) -> BaseException | None:
        return ValueError(f"{waiter.key} can never fit") if self.refuse else None

    def give_back(self, waiter: Waiter) -> None:
        self.free += waiter.need
        self.returned += waiter.need


def test_granted_by_deadline_then_arrival_and_a_later_one_never_overtakes_the_head():
    room = Budget(0)
    queue = RoomQueue(room)
    queue.ask("late", 10, deadline=9.0)
    queue.ask("big", 50, deadline=5.0)
    queue.ask("small", 10, deadline=5.0)  # same deadline, asked after "big"
    room.free = 20
    queue.changed(now=1.0)
    assert room.granted == [] and len(queue) == 3  # "big" is the head: nobody passes it
    room.free = 55
    queue.changed(now=2.0)
    assert room.granted == ["big"] and [w.key for w in queue.waiting()] == ["small", "late"]
    room.free += 15
    queue.changed(now=3.0)
    assert room.granted == ["big", "small", "late"] and len(queue) == 0


def test_a_futile_wait_is_refused_and_the_next_one_looked_at():
    room = Budget(5, futile=True)
    queue = RoomQueue(room)

    async def run():
        return await asyncio.gather(queue.wait("a", 10, 10.0, clock=lambda: 0.0),
                                    queue.wait("b", 5, 10.0, clock=lambda: 0.0),
                                    return_exceptions=True)

    refused, granted = asyncio.run(run())
    assert isinstance(refused, ValueError) and "a can never fit" in str(refused)
    assert granted.granted == [] and not granted.waited and room.granted == ["b"]


def test_a_deadline_passes_the_waiter_leaves_and_those_behind_go():
    room = Budget(0)
    queue = RoomQueue(room)
    async def run():
        clock = asyncio.get_running_loop().time
        head = asyncio.ensure_future(queue.wait("head", 100, clock() + 0.05, clock))
        behind = asyncio.ensure_future(queue.wait("behind", 10, clock() + 5, clock))
        await asyncio.sleep(0.01)
        room.free = 10  # enough for "behind", not for the head
        queue.changed(clock())
        assert room.granted == []  # head of line
        with pytest.raises(RoomTimeout):
            await head
        return await behind

    waiter = asyncio.run(run())
    assert waiter.waited and room.granted == ["behind"] and len(queue) == 0


def test_a_waiter_cancelled_after_its_grant_gives_the_room_back():
    room = Budget(0)
    queue = RoomQueue(room)

    async def run():
        task = asyncio.ensure_future(queue.wait("a", 10, 1e9, clock=lambda: 0.0))
        await asyncio.sleep(0)
        room.free = 10
        queue.changed(0.0)  # granted, but the task has not resumed yet
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert room.returned == 10 and room.free == 10


def test_a_change_told_while_granting_is_looked_at_once_the_grant_is_done():
    class Reentrant(Budget):
        def take(self, waiter, now):
            granted = super().take(waiter, now)
            if granted is not None:
                self.free += 10      # the grant's victim frees room at once...
                self.queue.changed(now)  # ...and its bookkeeping says so, re-entrantly
            return granted

    room = Reentrant(10)
    room.queue = queue = RoomQueue(room)
    for key in "abc":
        queue.ask(key, 10, 1.0)
    queue.changed(0.0)
    assert room.granted == ["a", "b", "c"]


async def test_the_memory_tier_the_disk_tier_and_the_twin_share_the_one_queue(repo, tmp_path):
    from cachepolicies.twin import Queueing, _Twin
    from cachepolicies.traces import make_profiles, make_trace
    from agent.node.cache import ModelCache
    from agent.node.cache.disktier import DiskTier
    from agent.node.repository import scan_repository

    add_synthetic(repo, "m")
    cache = ModelCache(scan_repository(repo), {"cpu": 10**8},
                       disk=functools.partial(DiskTier, tmp_path / "disk", 10**6))
    profiles = make_profiles(["m"], [1], [0.1], [0.01])
    twin = _Twin(make_trace([0.0], ["m"], profiles), profiles, 10, make_policy("lru"),
                 Queueing(), None, (), False)
    assert {type(x) for x in (cache.pools["cpu"].rooms, cache.disk.rooms, twin.rooms)} \
        == {RoomQueue}
    assert isinstance(cache.pools["cpu"].memory, MemoryPool)
    await cache.close()
    await cache.disk.close()
