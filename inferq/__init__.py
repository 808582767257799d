"""inferq: the queue protocol shared by the gateway, the workers, the scaler and the emulator.

Nothing here imports an HTTP framework or an AWS SDK: handlers are thin and call into this package.
"""

from .jobs import Job, JobRequest, JobStatus
from .keys import Keys
from .queue import Delivery, Lease, Observation, Outcome, Queue
from .settings import Settings, SettingsError

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
