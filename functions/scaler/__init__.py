"""The scaler Lambda (docs/architecture.md): ``app.handler`` parses the event, ``scaler`` observes, decides with
:mod:`inferq.scaling.policy`, applies to ECS, records and reports."""
