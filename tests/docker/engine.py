"""The private Docker engine of the suite: :mod:`emulator.dockerd` (``make sam-local`` starts the same one)."""

from emulator.dockerd import PACKAGES, SBIN_PATH, Bridge, Engine, EngineUnavailable, install_packages, which

__all__ = ["PACKAGES", "SBIN_PATH", "Bridge", "Engine", "EngineUnavailable", "install_packages", "which"]
