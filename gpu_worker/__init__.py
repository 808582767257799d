"""The GPU worker: pulls jobs from one queue through a window, runs them on a backend, writes one result each.

``python -m gpu_worker`` runs it (``__main__``); ``worker.Worker`` is the loop, ``backends/`` the model servers.
The webhook sender lives in ``inferq.webhooks``: the scaler Lambda, which ships without this package, runs it too.
This package imports nothing eagerly.
"""
