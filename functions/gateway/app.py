"""The gateway Lambda: ``functions/gateway/app.handler``.

Settings are read at import, so a bad variable (or no API keys at all) fails the Lambda init with a message
naming it. Redis and boto3 clients are created on first use. The handler is Mangum, plus one EMF flush of the
invocation's metrics (see ``telemetry.py``). With SnapStart (template.yaml), the import runs once per published
version and new sandboxes start from its snapshot; ``snapstart.py``'s hooks drop connections and reseed randomness
around it.
"""

from __future__ import annotations

import gc
from typing import Any

from mangum import Mangum

from inferq.config.settings import SettingsError

from . import snapstart
from .api import create_app

LAMBDA_SYNC_WAIT_MAX_S = 25.0
"""API Gateway's HTTP API ends a request at 30 s: a front-door call must have answered (its 504 included) before."""

__all__ = ["GatewayHandler", "app", "create_app", "handler"]


class GatewayHandler(Mangum):
    """Mangum, flushing the invocation's metrics as EMF when it returns; long-poll waits block on the job's own
    wakeup list (a background reader would be frozen with the sandbox between invocations)."""

    def __call__(self, event: Any, context: Any) -> dict[str, Any]:
        self.app.state.gateway.shared_waits = False  # type: ignore[attr-defined]  # one request per invocation
        self.app.state.gateway.streams = False  # type: ignore[attr-defined]  # API Gateway buffers the answer
        try:
            return super().__call__(event, context)
        finally:
            self.app.state.telemetry.flush()  # type: ignore[attr-defined]


app = create_app(defer_routes=True)  # routes other than submit/get: built on the first request needing them
if app.state.gateway.settings.sync_wait_s > LAMBDA_SYNC_WAIT_MAX_S:
    raise SettingsError("INFERQ_SYNC_WAIT_S", f"must be <= {LAMBDA_SYNC_WAIT_MAX_S:g} on Lambda (API Gateway's HTTP "
                        "API ends a request at 30 s)")
app.state.telemetry.adopt_package_loggers()
handler = GatewayHandler(app, lifespan="off")
snapstart.register(app)  # SnapStart's hooks, where the Lambda runtime has them (snapstart.py)
gc.freeze()  # what the import made lives as long as the process: the cyclic collector stops walking it per cycle
