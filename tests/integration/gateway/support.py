"""Constants and fakes shared by the gateway tests."""

from __future__ import annotations

KEYS = {"key-tenant-a-0001": "tenant-a", "key-tenant-b-0002": "tenant-b"}
A = {"Authorization": "Bearer key-tenant-a-0001"}
B = {"x-api-key": "key-tenant-b-0002"}
CHAT = {"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}


class FakeWaker:
    """Records wake-ups; can be told to fail."""

    def __init__(self, fail: bool = False) -> None:
        self.calls = 0
        self.fail = fail

    async def __call__(self) -> None:
        self.calls += 1
        if self.fail:
            raise RuntimeError("scaler unreachable")
