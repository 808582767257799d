"""Configuration: every ``INFERQ_*`` setting, read once and validated (:mod:`.settings`, docs/configuration.md), and
the model registry (:mod:`.registry`, ``INFERQ_MODELS``, docs/models.md)."""
