"""The client of ferry's service: ServiceClient over the HTTP API, the API's records, and ``ferry status``.

Needs no torch, and imports nothing of ``ferry.service``."""
