"""The ``inferq`` command a person runs on a workstation: ``inferq up`` (the local emulator) and the HTTP commands
(submit, wait, status, cancel, dlq, redrive) built on :mod:`inferq.client`. No deployable ships it."""
