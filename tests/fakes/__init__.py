"""Loopback fakes of the Slack Web API and the Jira REST API, for the real clients to talk to.

`LoopbackServer` is a threaded http.server on 127.0.0.1 (random port) that
records every request and lets a test inject faults per endpoint: an HTTP status
(429 with Retry-After, 5xx), a stall (the request is *processed*, then the
answer comes too late for the client's timeout: the worst, ambiguous case), or a
hold (the request waits, unprocessed, until the test releases it).
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import parse_qs, urlsplit


@dataclass
class Fault:
    status: int = 0                 # answer with this HTTP status instead of handling the request
    retry_after: Optional[int] = None
    stall_s: float = 0.0            # handle the request, then wait this long before answering
    body: Any = None
    # hold the request before handling it until `release` is set (`arrived` is set when it comes): a test
    # forces an interleaving, e.g. a second delivery pass runs while the first one's call is in the air
    release: Optional[threading.Event] = None
    arrived: Optional[threading.Event] = None


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]         # names lower-cased
    params: dict[str, Any]          # query + form fields (first values) or the JSON body
    raw: bytes
    status: int = 0                 # what the fake answered


@dataclass
class Response:
    status: int = 200
    body: Any = field(default_factory=dict)   # dict/list → JSON, str/bytes as is
    headers: dict[str, str] = field(default_factory=dict)


class LoopbackServer:
    """Subclasses implement `handle(req) -> Response`; `route(req)` names the endpoint faults key on."""

    def __init__(self):
        self.requests: list[Request] = []
        self._faults: dict[str, deque[Fault]] = defaultdict(deque)
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output quiet
                pass

            def _any(self):
                outer._serve(self)

            do_GET = do_POST = do_PUT = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def inject(self, route: str, *faults: Fault) -> None:
        """Queue faults for the next requests to `route` (consumed one per request)."""
        with self._lock:
            self._faults[route].extend(faults)

    def calls(self, route: str) -> list[Request]:
        return [r for r in self.requests if self.route(r) == route]

    def route(self, req: Request) -> str:
        return req.path

    def handle(self, req: Request) -> Response:  # pragma: no cover - subclasses
        raise NotImplementedError

    # -- plumbing ----------------------------------------------------------------
    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        split = urlsplit(h.path)
        raw = h.rfile.read(int(h.headers.get("Content-Length") or 0))
        params: dict[str, Any] = {k: v[0] for k, v in parse_qs(split.query).items()}
        ctype = h.headers.get("Content-Type", "")
        try:
            if "json" in ctype and raw:
                params.update(json.loads(raw))
            elif "x-www-form-urlencoded" in ctype:
                params.update({k: v[0] for k, v in parse_qs(raw.decode()).items()})
        except ValueError:  # e.g. raw upload bytes sent with urllib's default form content type
            pass
        req = Request(h.command, split.path, {k.lower(): v for k, v in h.headers.items()}, params, raw)
        with self._lock:
            self.requests.append(req)
            queue = self._faults.get(self.route(req))
            fault = queue.popleft() if queue else None
        if fault and fault.release is not None:
            if fault.arrived is not None:
                fault.arrived.set()
            fault.release.wait(60)
        if fault and fault.status:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            resp = Response(fault.status, fault.body if fault.body is not None else {"error": "injected"}, headers)
        else:
            with self._lock:
                resp = self.handle(req)
            if fault and fault.stall_s:
                time.sleep(fault.stall_s)
        req.status = resp.status
        body = resp.body
        if isinstance(body, (dict, list)):
            body, ctype = json.dumps(body).encode(), "application/json; charset=utf-8"
        else:
            body, ctype = (body.encode() if isinstance(body, str) else body), "text/plain; charset=utf-8"
        try:
            h.send_response(resp.status)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            for k, v in resp.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
            pass
