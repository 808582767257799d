"""The HTTP API's Lambda authorizer: refuses a request without a valid API key before the gateway function runs."""
