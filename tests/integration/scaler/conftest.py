"""The scaler handler's fixtures (moto ECS, the function's environment), shared with the registry's tests."""

from .test_handler import aws_env, ecs, scaler_env  # noqa: F401
