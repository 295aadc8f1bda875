"""Shared plumbing for the scripted fake model servers.

A :class:`ScriptedServer` is a threaded ``http.server`` on 127.0.0.1 (random
port) that records every request and hands POSTs of JSON to a subclass.  The
script is a list of *turns*; which turn a request gets is computed by the
subclass from the request itself (stateless, so a client retry replays the same
turn).  A turn may also be a callable ``f(request) -> turn`` so a script can
react to what the client sent (tool results, hook feedback, ...).
"""
from __future__ import annotations

import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit


@dataclass
class Recorded:
    """One HTTP request the fake server received (and what it answered)."""

    method: str
    path: str  # without the query string
    query: dict[str, list[str]]
    headers: dict[str, str]
    raw: bytes
    body: Any = None  # parsed JSON, or None
    turn: int | None = None  # index of the scripted turn served, if any
    status: int = 0
    error: str | None = None  # traceback when the handler crashed
    at: float = field(default_factory=time.time)

    @property
    def text(self) -> str:
        """The raw body as text: handy for ``"reason" in req.text`` checks."""
        return self.raw.decode("utf-8", "replace")


def sse(events: list[tuple[str, dict]]) -> bytes:
    """Encode ``(event_name, data)`` pairs as a Server-Sent-Events body."""
    out = []
    for name, data in events:
        out.append(f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n")
    return "".join(out).encode()


def split_chunks(s: str, parts: int = 3) -> list[str]:
    """Split ``s`` into up to ``parts`` non-empty pieces (for *_delta events)."""
    if len(s) <= 1 or parts <= 1:
        return [s]
    size = max(1, -(-len(s) // parts))
    return [s[i : i + size] for i in range(0, len(s), size)]


class ScriptedServer:
    """Base class: start/stop, recording, routing.  Subclasses implement
    :meth:`handle` returning ``(status, content_type, body_bytes)``."""

    def __init__(self, script: list | None = None, *, host: str = "127.0.0.1"):
        self.script = list(script or [])
        self.requests: list[Recorded] = []
        self.errors: list[str] = []
        self._host = host
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash, no /v1)."""
        return f"http://{self._host}:{self.port}"

    def start(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # keep test output quiet
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                split = urlsplit(self.path)
                rec = Recorded(
                    method=self.command,
                    path=split.path,
                    query=parse_qs(split.query),
                    headers={k.lower(): v for k, v in self.headers.items()},
                    raw=raw,
                )
                try:
                    rec.body = json.loads(raw) if raw else None
                except ValueError:
                    rec.body = None
                try:
                    status, ctype, payload = server.handle(rec)
                except Exception as exc:  # never crash the server thread
                    # A script callback that raises (e.g. a failed assert) ends
                    # the run: 400 is not retried by either client (a 5xx is,
                    # with backoff).  The shape suits both APIs.
                    rec.error = traceback.format_exc()
                    server.errors.append(rec.error)
                    status, ctype = 400, "application/json"
                    payload = json.dumps({"type": "error", "error": {
                        "type": "invalid_request_error",
                        "message": f"fake server: the script raised {type(exc).__name__}: {exc}"}}).encode()
                rec.status = status
                with server._lock:
                    server.requests.append(rec)
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                if ctype.startswith("text/event-stream"):
                    self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                    self.wfile.flush()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _serve

        self._httpd = ThreadingHTTPServer((self._host, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- scripting -------------------------------------------------------
    def resolve_turn(self, index: int, request: Any) -> Any | None:
        """The scripted turn at ``index`` (calling it if it is a callable),
        or None when the script is exhausted."""
        if index >= len(self.script):
            return None
        turn = self.script[index]
        if callable(turn) and not isinstance(turn, type):
            turn = turn(request)
        return turn

    def handle(self, rec: Recorded) -> tuple[int, str, bytes]:  # pragma: no cover
        raise NotImplementedError

    @staticmethod
    def json_response(status: int, obj: Any) -> tuple[int, str, bytes]:
        return status, "application/json", json.dumps(obj).encode()


Callback = Callable[[Any], Any]
