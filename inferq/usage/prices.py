"""What a GPU-hour costs on the instance type a model runs on: the default of a registry model's ``gpu_hour_usd``
when its ``deploy.instance_type`` names a type listed here (usage turns GPU-seconds into an estimated cost with it).

The figures are AWS's EC2 On-Demand prices in us-east-1, Linux, shared tenancy (aws.amazon.com/ec2/pricing/
on-demand), for the GPU families a vLLM worker runs on; each instance's hourly price is divided by its GPUs, as
usage counts GPU-seconds per GPU (a worker's busy time times its ``deploy.gpus``). Another region, a Savings Plan or
Spot, or a type not listed (the P families, whose prices AWS has cut more than once): the model sets
``gpu_hour_usd`` itself, else ``INFERQ_GPU_HOUR_USD`` applies."""

from __future__ import annotations

ON_DEMAND: dict[str, tuple[float, int]] = {
    # instance type: (US dollars an hour, GPUs)
    # G4dn: NVIDIA T4, 16 GiB
    "g4dn.xlarge": (0.526, 1), "g4dn.2xlarge": (0.752, 1), "g4dn.4xlarge": (1.204, 1),
    "g4dn.8xlarge": (2.176, 1), "g4dn.16xlarge": (4.352, 1), "g4dn.12xlarge": (3.912, 4),
    # G5: NVIDIA A10G, 24 GiB
    "g5.xlarge": (1.006, 1), "g5.2xlarge": (1.212, 1), "g5.4xlarge": (1.624, 1), "g5.8xlarge": (2.448, 1),
    "g5.16xlarge": (4.096, 1), "g5.12xlarge": (5.672, 4), "g5.24xlarge": (8.144, 4), "g5.48xlarge": (16.288, 8),
    # G6: NVIDIA L4, 24 GiB
    "g6.xlarge": (0.8048, 1), "g6.2xlarge": (0.9776, 1), "g6.4xlarge": (1.3232, 1), "g6.8xlarge": (2.0144, 1),
    "g6.16xlarge": (3.3968, 1), "g6.12xlarge": (4.6016, 4), "g6.24xlarge": (6.6752, 4), "g6.48xlarge": (13.3504, 8),
    # G6e: NVIDIA L40S, 48 GiB
    "g6e.xlarge": (1.861, 1), "g6e.2xlarge": (2.24208, 1), "g6e.4xlarge": (3.00424, 1),
    "g6e.8xlarge": (4.52856, 1), "g6e.16xlarge": (7.57719, 1), "g6e.12xlarge": (10.49264, 4),
    "g6e.24xlarge": (15.06559, 4), "g6e.48xlarge": (30.13118, 8),
}


def gpu_hour_usd(instance_type: str) -> float | None:
    """One GPU-hour of ``instance_type`` on demand (its hourly price over its GPUs); None for a type not listed."""
    listed = ON_DEMAND.get(instance_type)
    if listed is None:
        return None
    price, gpus = listed
    return round(price / gpus, 6)
