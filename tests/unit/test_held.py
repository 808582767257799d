"""The jobs a worker holds (gpu_worker/held.py): the window bounds the jobs at the engine, twice the window all
held, and a slot freed between the puller's question and its wait is not missed."""

from __future__ import annotations

import asyncio

from gpu_worker.attempt import Abort, Attempt
from gpu_worker.held import HeldJobs
from gpu_worker.window import StaticWindow
from inferq.queue.jobs import Job, JobStatus
from inferq.queue.protocol import Delivery


def attempt(n: int, deliveries: int = 1) -> Attempt:
    job = Job(id=f"j{n}", tenant="acme", status=JobStatus.RUNNING, url="/v1/chat/completions", body={},
              attempts=1, deliveries=deliveries, created_at=0.0)
    return Attempt(Delivery(entry_id=f"{n}-0", job=job))


def test_the_window_bounds_the_jobs_at_the_engine_and_twice_it_bounds_all_held() -> None:
    counts: list[int] = []
    held = HeldJobs(StaticWindow(2), on_change=counts.append)
    first, second, third, fourth = (attempt(n) for n in range(4))
    assert held.free() == 2
    held.add(first)
    held.add(second)
    held.changed()
    assert held.free() == 0 and held.at_engine() == 2 and counts == [2]
    held.settling(first)  # its call is over: its engine slot is free while the outcome is written
    assert held.at_engine() == 1 and held.free() == 1
    held.add(third)
    held.settling(second)
    held.settling(third)
    held.add(fourth)
    # four held, one at the engine: the engine has room for one more, but twice the window is reached
    assert held.at_engine() == 1 and len(held) == 4 and held.free() == 0
    held.remove(first)
    assert held.free() == 1 and counts == [2, 3] and first.key not in held and second.key in held
    held.remove(first)  # twice: nothing changes (the settling count stays right)
    assert held.at_engine() == 1 and len(held) == 3


def test_the_room_follows_the_window_size() -> None:
    class Growing:
        size = 1

    window = Growing()
    held = HeldJobs(window)
    held.add(attempt(0))
    assert held.free() == 0
    window.size = 3
    assert held.free() == 2


async def test_a_slot_freed_before_the_wait_runs_is_not_missed() -> None:
    held = HeldJobs(StaticWindow(1))
    job = attempt(0)
    held.add(job)
    wait = asyncio.ensure_future(held.wait_for_slot())  # the puller found no room and waits
    held.remove(job)  # freed before the wait's first step
    await asyncio.wait_for(wait, 1)


def test_a_reclaimed_attempt_is_a_suspect() -> None:
    assert attempt(0, deliveries=2).suspect and not attempt(1).suspect


async def test_an_attempt_is_aborted_once_and_never_once_its_outcome_is_being_written() -> None:
    job = attempt(0)
    job.task = asyncio.create_task(asyncio.sleep(10))
    assert job.cancel(Abort.CANCEL) and job.abort == Abort.CANCEL
    assert not job.cancel(Abort.LOST) and job.abort == Abort.CANCEL
    late = attempt(1)
    late.task = asyncio.create_task(asyncio.sleep(10))
    late.settling = True
    assert not late.cancel(Abort.SHUTDOWN) and late.abort is None
    await asyncio.sleep(0)
    assert job.task.cancelled() and not late.task.done()
    late.task.cancel()
