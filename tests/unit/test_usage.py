"""The pure parts of usage metering: a worker's busy time split among the jobs it runs at once, the finish call's
rows, the buckets' rows read back, the periods, the budgets setting and the budget guard's clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from inferq.config.parsers import Budget, SettingsError
from inferq.config.settings import Settings
from inferq.queue.jobs import JobStatus, Priority
from inferq.usage.budgets import RECHECK_S, BudgetExceeded, BudgetGuard, Spent
from inferq.usage.periods import DAY_S, HOUR_S, hours, meter_args, month_start, next_month_start
from inferq.usage.report import Row, parse
from inferq.usage.spend import BusyShare, Spend, UsageRows, tokens_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_s_busy_time_is_split_among_the_jobs_it_runs_at_once() -> None:
    clock = Clock()
    share = BusyShare(clock=clock)
    share.begin("a")
    clock.now += 1.0          # a alone: 1 s
    share.begin("b")
    clock.now += 2.0          # a and b: 1 s each
    assert share.end("a") == Spend(run_ms=3000, gpu_ms=2000)
    clock.now += 0.5          # b alone
    assert share.end("b") == Spend(run_ms=2500, gpu_ms=1500)
    assert share.end("never began") == Spend() and share.running == 0


def test_the_shares_of_one_busy_stretch_add_up_to_it_times_the_gpus() -> None:
    clock = Clock()
    share = BusyShare(gpus=4, clock=clock)
    for job in range(8):
        share.begin(job)
        clock.now += 0.125
    spent = [share.end(job) for job in range(8)]
    assert sum(s.gpu_ms for s in spent) == pytest.approx(1000 * 4, abs=8)


def test_tokens_come_from_the_result_s_usage_and_nothing_else() -> None:
    result = {"status_code": 200, "body": {"usage": {"prompt_tokens": 7, "completion_tokens": 9}}}
    assert Spend(1, 2).with_tokens(tokens_of(result)) == Spend(1, 2, 7, 9)
    for odd in (None, {"body": "x"}, {"body": {"usage": {"prompt_tokens": "7", "completion_tokens": True}}},
                {"body": {"usage": {"prompt_tokens": -1}}}):
        assert Spend(1, 2).with_tokens(tokens_of(odd)) == Spend(1, 2, 0, 0)


@dataclass
class FakeJob:
    tenant: str


@dataclass
class FakeDelivery:
    job: FakeJob
    lane: Priority = Priority.NORMAL
    spent: tuple[str, int, int] = ("m", 100, 50)


def test_a_finish_call_s_jobs_are_added_up_per_row_with_their_earlier_attempts() -> None:
    rows = UsageRows(True)
    assert rows.add(FakeDelivery(FakeJob("a")), JobStatus.SUCCEEDED, Spend(10, 5, 1, 2)) == [1, "110 55 1 2"]
    assert rows.add(FakeDelivery(FakeJob("b")), JobStatus.FAILED, Spend()) == [2, "100 50 0 0"]
    assert rows.add(FakeDelivery(FakeJob("a")), JobStatus.CANCELLED, Spend(1, 1, 0, 0)) == [1, "101 51 0 0"]
    assert rows.args() == [2, "a|normal|m", "1 0 1 0 1 2 211 106", "b|normal|m", "0 1 0 0 0 0 100 50"]
    off = UsageRows(False)
    assert off.add(FakeDelivery(FakeJob("a")), JobStatus.SUCCEEDED, Spend(1, 1, 1, 1)) == [0, ""]
    assert off.args() == [0]


def test_a_bucket_row_reads_back_and_anything_else_is_skipped() -> None:
    assert parse("t|high|org/model|v2", "1 2 3 4 5 6 7 8") == ("t", "high", "org/model|v2", [1, 2, 3, 4, 5, 6, 7, 8])
    for name, value in (("#t", "3"), ("t|normal", "1 2 3 4 5 6 7 8"), ("t|normal|m", "1 2 3"),
                        ("t|normal|m", "1 2 3 4 5 6 7 x")):
        assert parse(name, value) is None
    row = Row("t", "m", "normal")
    row.add([1, 0, 0, 0, 10, 20, 3000, 7200_000], 1.5)
    assert row.to_api(with_cost=True)["estimated_cost_usd"] == 3.0
    assert row.to_api(with_cost=True)["usd_per_million_tokens"] == 100000.0
    assert "estimated_cost_usd" not in row.to_api()


def test_periods_cover_whole_hours_and_expire_after_the_retention() -> None:
    start = 1_764_547_200  # 2025-12-01T00:00Z
    assert hours(start + 10, start + HOUR_S + 1) == [start, start + HOUR_S]
    assert hours(start, start + HOUR_S) == [start]
    assert meter_args((start + 90) * 1000, 30) == ("2025-12-01T00", start + HOUR_S + 30 * DAY_S)
    assert meter_args(start * 1000, 0) == ("2025-12-01T00", 0)
    assert next_month_start(start + 10 * DAY_S) == 1_767_225_600 and month_start(start + 10 * DAY_S) == start


@pytest.mark.parametrize("raw, expected", [
    ("a:1000tokens", {"a": Budget(tokens=1000)}),
    ("a:250usd, b:$12.5", {"a": Budget(usd=250.0), "b": Budget(usd=12.5)}),
    ("a:10tokens,a:2usd", {"a": Budget(tokens=10, usd=2.0)}),
    ("", None),
])
def test_budgets_are_read_per_tenant(raw: str, expected: Any) -> None:
    assert Settings.from_env({"INFERQ_TENANT_BUDGETS": raw}).tenant_budgets == expected


@pytest.mark.parametrize("raw", ["a", "a:10", "a:ten tokens", "bad tenant:10tokens", "a:10gpu"])
def test_a_bad_budget_stops_the_process_naming_the_variable(raw: str) -> None:
    with pytest.raises(SettingsError, match="INFERQ_TENANT_BUDGETS"):
        Settings.from_env({"INFERQ_TENANT_BUDGETS": raw})


def test_which_budget_is_reached_is_said() -> None:
    budget = Budget(tokens=100, usd=5.0)
    assert Spent(99, 4.99).exceeded(budget) is None
    assert "100 tokens" in (Spent(100, 0.0).exceeded(budget) or "")
    assert "$5" in (Spent(0, 5.0).exceeded(budget) or "")
    assert Spent(80, 1.0).share_of(budget) == 0.8


def test_the_guard_reads_a_budgeted_tenant_again_only_after_its_recheck_and_holds_a_refusal() -> None:
    clock = Clock()
    reads: list[str] = []
    spent = [5]

    async def month(_: Any, tenant: str, now: float) -> Spent:
        reads.append(tenant)
        return Spent(spent[0], 0.0)

    guard = BudgetGuard({"a": Budget(tokens=10)}, clock=clock, read=month)
    asyncio.run(guard.check("a", lambda: []))
    spent[0] = 10
    asyncio.run(guard.check("a", lambda: []))  # within the recheck: the answer it had
    assert reads == ["a"]
    clock.now += RECHECK_S
    with pytest.raises(BudgetExceeded):
        asyncio.run(guard.check("a", lambda: []))
    clock.now += 3600
    with pytest.raises(BudgetExceeded):  # held until the month ends, without reading
        asyncio.run(guard.check("a", lambda: []))
    asyncio.run(guard.check("no budget", lambda: []))
    assert reads == ["a", "a"]
