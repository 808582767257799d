"""The Lambda functions of inferq: the HTTP gateway and the scaler. Each handler is thin and calls into ``inferq``."""
