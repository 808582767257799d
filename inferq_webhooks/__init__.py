"""The webhook sender: delivers each job's terminal event to its ``webhook_url``, signed, with retries and an
address guard. It runs in two deployables, as a task of every worker and as one pass per scaler tick, so it is a
package of its own that both ship (the worker image and the scaler zip); the gateway and the protocol package
(``inferq``) carry no HTTP client. :mod:`.sender` has the delivery, :mod:`.guarded_http` the send-time guard."""
