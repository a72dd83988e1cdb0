"""Serve the API with uvicorn: in a background thread next to the daemon, or blocking.

``install_serve_hooks()`` plugs this into ``ferry serve`` (adds ``--host``/``--port`` and starts
the server after the daemon); ``start_server`` is what tests and the demo call directly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

import uvicorn

from ferry.shard_tools.errors import ServiceError
from ferry.shard_tools.threadname import start_named_thread

from ..config import ApiConfig
from .app import create_app
from .connections import ConnectionStats, defer_accept, guarded_protocol
from .settings import api_config_of

__all__ = ["RunningServer", "install_serve_hooks", "redact_query", "run_server", "start_server"]

log = logging.getLogger("ferry.api")
# Query parameters whose value the access log never shows: ?token=, ?access_token=, ?api_key=,
# ?X-Amz-Signature=, ?password=... (ferry takes its token in a header; a client may still send one here)
_SECRET_PARAM = re.compile(r"token|key|secret|sig|pass|auth|cred|session", re.IGNORECASE)


def redact_query(target: str) -> str:
    """``path?query`` with the value of every secret-looking query parameter replaced by ``***``."""
    path, sep, query = target.partition("?")
    if not sep:
        return target
    pairs = []
    for pair in query.split("&"):
        name, eq, _ = pair.partition("=")
        pairs.append(f"{name}=***" if eq and _SECRET_PARAM.search(unquote_plus(name)) else pair)
    return f"{path}?{'&'.join(pairs)}"


class _RedactAccessLog(logging.Filter):
    """Rewrites uvicorn's access-log record (args: client, method, path?query, version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_query(args[2]), *args[3:])
        return True


def _redact_access_log() -> None:
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _RedactAccessLog) for f in access.filters):
        access.addFilter(_RedactAccessLog())


@dataclass
class RunningServer:
    """A uvicorn server on a background thread; ``url`` is its base URL, ``stop()`` ends it."""

    url: str
    _server: uvicorn.Server
    _thread: threading.Thread
    _app: Any
    connections: ConnectionStats = field(default_factory=ConnectionStats)  # what the connection guard did
    _stopped: bool = field(default=False)

    @property
    def app(self) -> Any:
        """The ASGI app being served (a ``FastReadsApp``)."""
        return self._app

    def stop(self, timeout: float = 10.0) -> None:
        """End open event streams, stop accepting, join the thread, stop the backend's helper threads."""
        if self._stopped:
            return
        self._stopped = True
        loop = getattr(self._server, "_ferry_loop", None)
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._app.state.stopping.set)
        self._server.should_exit = True
        self._thread.join(timeout)
        self._app.state.unsubscribe()
        backend = self._app.state.backend
        close = getattr(backend, "close", None)
        if close is not None:
            close()


def _settings_of(config: Any) -> ApiConfig:
    return api_config_of(config)


def start_server(
    daemon: Any,
    config: Any = None,
    *,
    host: str | None = None,
    port: int | None = None,
    access_log: bool = False,
    startup_timeout: float = 20.0,
    own_log_handlers: bool = True,
) -> RunningServer:
    """Start the API for ``daemon`` on a thread; ``config`` is the ferry ``Config`` or its ``[api]``.

    ``port=0`` picks a free port (read it from ``.url``). ``own_log_handlers=False`` leaves uvicorn's
    loggers without handlers of their own: their records reach the process's (``--log-format json``).
    """
    settings = _settings_of(config if config is not None else getattr(daemon, "config", None))
    app = create_app(daemon, settings)
    loop = _new_loop()  # made here, run on the server's thread
    try:
        protocol, stats = guarded_protocol(settings, reads_each_accept=type(loop).__module__.startswith("uvloop"))
        uv_config = uvicorn.Config(
            app,
            host=host or settings.host,
            port=settings.port if port is None else port,
            log_level="info" if access_log else "warning",
            access_log=access_log,
            log_config=uvicorn.config.LOGGING_CONFIG if own_log_handlers else None,
            timeout_graceful_shutdown=2,
            lifespan="on",
            http=protocol,  # connection cap, header/body/send timeouts, header size limits
            ws="none",  # the API has no WebSocket route
            backlog=stats.backlog,
            timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]
        )
        _redact_access_log()  # after uvicorn.Config, which (re)configures the uvicorn loggers
        server = uvicorn.Server(uv_config)
    except BaseException:
        loop.close()
        raise

    def run() -> None:
        server._ferry_loop = loop  # type: ignore[attr-defined]  # lets stop() reach the loop
        try:
            loop.run_until_complete(server.serve())
        finally:
            loop.close()

    thread = start_named_thread(run, "ferry-api")
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ServiceError(f"the API server did not start on {uv_config.host}:{uv_config.port}")
        time.sleep(0.02)
    for listening in (s for srv in server.servers for s in srv.sockets):
        defer_accept(listening)
    sock = server.servers[0].sockets[0].getsockname()
    bound_host = uv_config.host if uv_config.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = f"http://{_host_for_url(bound_host)}:{sock[1]}"
    return RunningServer(url, server, thread, app, stats)


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (the ``service`` extra brings it): several times less CPU per request."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run_server(daemon: Any, config: Any = None) -> None:
    """Serve the API in the foreground until the daemon stops (or KeyboardInterrupt)."""
    running = start_server(daemon, config)
    try:
        while daemon.running:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="bind address of the HTTP API (default: [api] host)")
    parser.add_argument("--port", type=int, default=None, help="port of the HTTP API (default: [api] port)")
    parser.add_argument("--no-api", action="store_true", help="run the daemon without the HTTP API and dashboard")
    parser.add_argument("--access-log", action="store_true", help="log every HTTP request")


def _extra(daemon: Any, args: argparse.Namespace) -> Callable[[], None] | None:
    if getattr(args, "no_api", False):
        return None
    json_logs = getattr(args, "log_format", "human") == "json"
    running = start_server(
        daemon,
        daemon.config,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
        access_log=bool(getattr(args, "access_log", False)),
        own_log_handlers=not json_logs,
    )
    if json_logs:  # every stderr line is a JSON record then
        log.info("dashboard at %s/  (API %s/api/v1/)", running.url, running.url)
    else:
        # one write: print() sends the text and its newline apart, and a log line of another thread came between
        sys.stderr.write(f"ferry: dashboard at {running.url}/  (API {running.url}/api/v1/)\n")
        sys.stderr.flush()
    return running.stop


def install_serve_hooks(hooks: list[Any], extras: list[Any]) -> None:
    """Register the API with ``ferry serve`` (idempotent)."""
    if _add_options not in hooks:
        hooks.append(_add_options)
    if _extra not in extras:
        extras.append(_extra)
