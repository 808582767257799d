"""Fair share (G10) through ``inferq up`` with its default settings: a tenant's jobs submitted behind another
tenant's backlog start after a handful of that backlog, not after all of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from .conftest import TERMINAL, Emulator, chat

KEYS = {"heavy": "heavy-key-0123456789", "light": "light-key-0123456789"}


def finish(client: httpx.Client, job_id: str, polls: int = 6) -> dict[str, Any]:
    """The job once it ended, long-polled by its own tenant (20 s a poll)."""
    for _ in range(polls):
        job = client.get(f"/v1/jobs/{job_id}", params={"wait": 20}).json()
        if job["status"] in TERMINAL:
            break
    return job


def test_a_light_tenants_jobs_start_after_a_handful_of_another_tenants_backlog(
    own_stack: Callable[..., Emulator],
) -> None:
    # one worker of window 4; each job holds its slot for two seconds, so the backlog outlasts the submits
    emulator = own_stack(INFERQ_API_KEYS=",".join(f"{t}:{k}" for t, k in KEYS.items()), INFERQ_SCALE_MAX="1")
    heavy, light = (httpx.Client(base_url=emulator.url, headers={"Authorization": f"Bearer {KEYS[t]}"},
                                 timeout=30.0) for t in ("heavy", "light"))
    with heavy, light:
        backlog = []
        for i in range(120):
            response = heavy.post("/v1/jobs", json=chat(f"heavy {i}", latency_ms=2000))
            assert response.status_code == 202, response.text
            backlog.append(response.json()["id"])
        ours = []
        for i in range(3):
            response = light.post("/v1/jobs", json=chat(f"light {i}", latency_ms=2000))
            assert response.status_code == 202, response.text
            ours.append(response.json())
        submitted = ours[0]["created_at"]
        done = [finish(light, job["id"]) for job in ours]
        assert [job["status"] for job in done] == ["succeeded"] * 3
        light_started = max(job["started_at"] for job in done)
        # the heavy jobs that started between the light tenant's first submit and its last start
        started = [heavy.get(f"/v1/jobs/{job_id}").json()["started_at"] for job_id in backlog]
        ahead = [at for at in started if at is not None and submitted <= at < light_started]
        waiting = sum(at is None or at >= light_started for at in started)
        print(f"heavy jobs started between the light tenant's first submit and its last start: {len(ahead)}; "
              f"heavy jobs still waiting then: {waiting}")
        assert waiting > 60, "the backlog ran out before the light jobs were submitted: the test proves nothing"
        # first come, first served would start every waiting heavy job first; fair share alternates: the window's
        # four, the entry in the stream, and one heavy job per light job's turn at most
        assert len(ahead) <= 10, (len(ahead), waiting)
