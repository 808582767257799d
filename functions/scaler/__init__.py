"""The scaler Lambda (DESIGN.md section 6): ``app.handler`` parses the event, ``scaler`` observes, decides with
:mod:`inferq.policy`, applies to ECS, records and reports."""
