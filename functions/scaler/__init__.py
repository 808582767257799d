"""The scaler Lambda (docs/architecture.md): ``app.handler`` parses the event, ``scaler`` observes, decides with
:mod:`inferq.policy`, applies to ECS, records and reports."""
