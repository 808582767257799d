"""Usage metering for chargeback (``GET /v1/usage``, docs/operations.md): the periods usage is kept in, reading it
back per tenant, model and lane, prices and budgets, and the daily export."""
