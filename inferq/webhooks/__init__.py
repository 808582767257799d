"""Webhooks (docs/api.md, "Webhooks"): each job's terminal event POSTed to its ``webhook_url``, signed per Standard
Webhooks, with retries and an address guard.

- :mod:`.signing`: signatures made and checked with the ``standardwebhooks`` package; :mod:`.tenant_secrets`: each
  tenant's signing secret.
- :mod:`.netguard`: which hosts a webhook may be POSTed to (checked when a job is accepted and again at send time);
  :mod:`.guarded_http`: the send-time half, an httpx transport that connects only to the address it checked.
- :mod:`.sender`: delivery from the events stream (a task of every worker and one pass per scaler tick);
  :mod:`.post`: one POST.

The gateway ships signing, secrets and the guard's table, not the sender (mk/sam.mk).
"""
