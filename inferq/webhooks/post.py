"""One webhook POST: the final job object, signed per Standard Webhooks (:mod:`inferq.webhooks.signing`), to an
address the guard has checked (:mod:`inferq.webhooks.guarded_http`), within one deadline, reading at most
:data:`MAX_RESPONSE_BYTES` of the answer. What to send and when (the events stream, leases, retries) is
:mod:`inferq.webhooks.sender`'s."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from enum import Enum

import httpx

from inferq.config.settings import Settings
from inferq.webhooks import netguard
from inferq.webhooks.signing import signature_header, signing_key

from .guarded_http import GuardedTransport, read_capped

log = logging.getLogger("inferq.webhooks")  # the name every log filter and test knows, from before the move

POST_DEADLINE_S = 10.0
"""The whole of one POST: resolving, connecting, TLS, sending, the receiver's answer."""
MAX_RESPONSE_BYTES = 4096
"""What is read of a receiver's answer (its status is all that matters); the rest is never downloaded."""


class Outcome(Enum):
    DELIVERED = "delivered"
    FAILED = "failed"  # worth another attempt
    REFUSED = "refused"  # the address guard said no, or the URL cannot be sent to: no attempt will do better


class WebhookPost:
    """Sends webhooks for one sender: its HTTP client (guarded, no redirects) and the deployment's signing key, if
    any (``INFERQ_WEBHOOK_SECRET``), which signs beside each tenant's own."""

    def __init__(self, settings: Settings, *, client: httpx.AsyncClient | None = None,
                 deadline_s: float = POST_DEADLINE_S, connections: int = 16) -> None:
        self.settings = settings
        self.post_deadline_s = deadline_s
        self._shared_key = signing_key(settings.webhook_secret) if settings.webhook_secret else None
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            transport=GuardedTransport(settings.webhook_allow_private, connections,
                                       blocked=netguard.networks(settings.webhook_blocked_networks)),
            timeout=deadline_s,
            follow_redirects=False,  # a redirect could lead anywhere, past the guard
            trust_env=False,  # no proxy, .netrc or CA setting of httpx's from the environment (the transport's own)
            headers={"User-Agent": "inferq-webhooks"},
        )

    def _headers(self, msg_id: str, body: bytes, secrets: Sequence[str]) -> dict[str, str]:
        timestamp = int(time.time())
        keys: list[str | bytes] = [*secrets]
        if self._shared_key is not None:
            keys.append(self._shared_key)
        return {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
                "webhook-signature": signature_header(keys, msg_id, timestamp, body)}

    async def post(self, msg_id: str, job_id: str, url: str, body: bytes, secrets: Sequence[str]) -> Outcome:
        """One POST of ``body``, signed with each of ``secrets`` (the tenant's valid ones) and the shared key."""
        where = {"webhook_job": job_id}
        try:
            target = httpx.URL(url)
        except httpx.InvalidURL:
            log.warning("webhook refused: the URL cannot be parsed", extra=where)
            return Outcome.REFUSED
        if target.scheme != "https" and not (target.scheme == "http" and self.settings.webhook_allow_private):
            log.warning("webhook refused: %s is not https", target.scheme, extra=where)
            return Outcome.REFUSED
        refusal = netguard.host_refusal(target.host, self.settings.webhook_hosts) or (
            None if self.settings.webhook_allow_private else netguard.port_refusal(
                443 if target.port is None else target.port, self.settings.webhook_ports))
        if refusal:
            log.warning("webhook refused: %s", refusal, extra=where)
            return Outcome.REFUSED
        headers = self._headers(msg_id, body, secrets)
        try:
            async with asyncio.timeout(self.post_deadline_s):
                async with self._client.stream("POST", target, content=body, headers=headers) as r:
                    await read_capped(r, MAX_RESPONSE_BYTES)
                    status = r.status_code
        except netguard.BlockedAddress as exc:
            # the host and the address, never the URL: its query may carry the receiver's token
            log.warning("webhook refused: %s", exc, extra=where)
            return Outcome.REFUSED
        except TimeoutError:
            log.info("webhook attempt failed: no answer within %.0f s", self.post_deadline_s, extra=where)
            return Outcome.FAILED
        except (httpx.HTTPError, OSError) as exc:
            log.info("webhook attempt failed: %s", type(exc).__name__, extra=where)
            return Outcome.FAILED
        if 200 <= status < 300:
            return Outcome.DELIVERED
        log.info("webhook attempt failed: receiver answered %d", status, extra=where)
        return Outcome.FAILED

    async def aclose(self) -> None:
        if self._own_client:
            await self._client.aclose()
