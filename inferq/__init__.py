"""inferq: the queue protocol shared by the gateway, the workers, the scaler and the emulator, and the client.

Nothing here imports an HTTP framework or an AWS SDK: handlers are thin and call into this package. The names below
are loaded on first use (PEP 562), so ``import inferq.client`` (the HTTP client a user installs with
``pip install inferq``) loads no Redis library: the queue and its Redis plumbing come with the server extras.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config.settings import Settings, SettingsError
    from .queue.jobs import Job, JobRequest, JobStatus
    from .queue.keys import Keys
    from .queue.protocol import Delivery, Lease, Observation, Outcome, Queue

_LAZY = {
    "Job": "queue.jobs",
    "JobRequest": "queue.jobs",
    "JobStatus": "queue.jobs",
    "Keys": "queue.keys",
    "Delivery": "queue.protocol",
    "Lease": "queue.protocol",
    "Observation": "queue.protocol",
    "Outcome": "queue.protocol",
    "Queue": "queue.protocol",
    "Settings": "config.settings",
    "SettingsError": "config.settings",
}

__all__ = [
    "Delivery",
    "Job",
    "JobRequest",
    "JobStatus",
    "Keys",
    "Lease",
    "Observation",
    "Outcome",
    "Queue",
    "Settings",
    "SettingsError",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferq' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once loaded, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
