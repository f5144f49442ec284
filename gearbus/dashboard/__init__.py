"""The dashboard: a REST API, /metrics and the web UI over the cluster, read through
gearbus.client (``gearbus dashboard``, or ``python -m services.dashboard`` as a role)."""
