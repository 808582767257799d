"""The scaler handler's fixtures (the shared moto ECS with the function's environment), shared with the registry's
tests."""

from .test_handler import ecs, scaler_env  # noqa: F401
