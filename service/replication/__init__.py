"""Replication: decide and remember. ``planner`` (manifests in, actions out, pure), ``engine`` (one pass:
plan → copy → publish → retire) and ``passes`` (its result), ``state`` (SQLite: every durable fact),
``lease`` (one writer per destination), and ``noop_check`` (``ferry sync``'s no-op without the storage stack).

It drives ``ferry.service.transfer``; transfer never imports it.
"""
