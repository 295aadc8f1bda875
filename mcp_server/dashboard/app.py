"""The dashboard's routes (Starlette, served by uvicorn as the webhook receiver is).

  GET  /                        the workspaces (one workspace: its page)
  GET  /w/<i>/                  a campaign: overview, live chart, approvals, experiment table
  GET  /w/<i>/fragments         the same parts as JSON of HTML strings (what the page's script swaps in)
  GET  /w/<i>/experiments/<id>  one experiment: paired runs and seeds, verdict reason, replay, diff, log tail
  GET  /events                  Server-Sent Events: `change` whenever a workspace's ledger moves
  POST /w/<i>/approvals/<id>    Approve / Reject (the token in the form + Origin + Host; not in --read-only)

Reads run in worker threads (anyio.to_thread) so a slow ledger read never stalls the event loop, and each
SSE client is its own task: one that stops reading only fills its own socket buffer. The loop itself runs
in other processes and only shares the SQLite file, which the dashboard reads and never locks.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path
from typing import AsyncIterator, Callable, Optional

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mcp_server.dashboard import actions, data, views
from mcp_server.dashboard.auth import Guard
from mcp_server.ledger.store import LedgerError
from mcp_server.loop.errors import LoopError
from mcp_server.loop.workspace import WorkspaceError

log = logging.getLogger("loopwright.dashboard")
STATIC = Path(__file__).parent / "static"
HEADERS = {
    # inert by construction: no inline script or style, nothing from another origin, no framing
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def create_app(sources: list[data.Source], guard: Guard, who: str,  # noqa: C901 - routes as closures
               poll_s: float = 1.0, heartbeat_s: float = 15.0) -> Starlette:
    appliers = actions.Appliers()

    def source(request: Request) -> data.Source:
        i = int(request.path_params["index"])
        if not 0 <= i < len(sources):
            raise LookupError(f"no workspace #{i}: this dashboard shows {len(sources)}")
        return sources[i]

    async def read(fn: Callable, *args):
        return await anyio.to_thread.run_sync(fn, *args)

    def html(body: str, status: int = 200) -> HTMLResponse:
        return HTMLResponse(body, status_code=status, headers=HEADERS)

    async def index(request: Request) -> Response:
        if len(sources) == 1:       # a redirect keeps the URL's #fragment (the token) for the page's script
            return RedirectResponse("/w/0/", status_code=303, headers=HEADERS)
        return html(views.index([await read(data.snapshot, s) for s in sources]))

    async def index_fragments(request: Request) -> Response:
        snaps = [await read(data.snapshot, s) for s in sources]
        return JSONResponse({"parts": {"workspaces": views.index_table(snaps)}}, headers=HEADERS)

    def parts(request: Request, snap: dict) -> dict[str, str]:   # the same for every visitor: no secret in it
        return views.fragments(snap, guard.read_only)

    async def workspace(request: Request) -> Response:
        src = source(request)
        version = json.dumps(await read(src.version))     # before the snapshot: a change meanwhile refreshes again
        snap = await read(data.snapshot, src)
        return html(views.workspace(snap, parts(request, snap), version))

    async def fragments(request: Request) -> Response:
        src = source(request)
        version = json.dumps(await read(src.version))
        snap = await read(data.snapshot, src)
        return JSONResponse({"version": version, "parts": parts(request, snap)}, headers=HEADERS)

    async def experiment(request: Request) -> Response:
        src = source(request)
        d = await read(data.experiment_detail, src, int(request.path_params["eid"]))
        if d is None:
            return html(views.message_page("not found", f"There is no experiment #{request.path_params['eid']} "
                                                        "in this workspace.", f"/w/{src.index}/"), 404)
        return html(views.experiment(src.index, d))

    async def decide(request: Request) -> Response:
        src = source(request)
        back = f"/w/{src.index}/"
        form = await request.form()
        problem = guard.action_problem(request.headers, str(form.get("token", "")))
        if problem:
            log.warning("refused a decision on approval %s: %s", request.path_params["aid"], problem)
            return html(views.message_page("refused", problem, back), 403)
        choice = str(form.get("decision", ""))
        if choice not in ("approve", "reject"):
            return html(views.message_page("bad request", "the form must say decision=approve or decision=reject",
                                           back), 400)
        result = await read(actions.decide, src.root, int(request.path_params["aid"]), choice == "approve", who,
                            str(form.get("note", ""))[:500], appliers)
        return html(views.message_page("decided" if result.ok else "not decided", result.message, back),
                    200 if result.ok else 409)

    # one reading of the ledgers per poll interval, however many browsers listen
    cache: dict = {"at": -1.0, "versions": []}
    cache_lock = asyncio.Lock()

    async def versions() -> list[str]:
        async with cache_lock:
            now = asyncio.get_running_loop().time()
            if now - cache["at"] >= poll_s * 0.9:
                out = []
                for s in sources:
                    try:
                        out.append(json.dumps(await read(s.version)))
                    except Exception as e:  # noqa: BLE001 - a ledger being migrated or moved: say so, keep going
                        out.append(f"error: {type(e).__name__}")
                cache.update(at=now, versions=out)
            return cache["versions"]

    async def events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            last: list = [None] * len(sources)
            quiet = 0.0
            yield "retry: 2000\n\n"
            while True:
                changed = []
                for i, v in enumerate(await versions()):
                    if v != last[i]:
                        last[i] = v
                        changed.append(i)
                if changed:
                    quiet = 0.0
                    yield f"event: change\ndata: {json.dumps({str(i): last[i] for i in changed})}\n\n"
                elif quiet >= heartbeat_s:
                    quiet = 0.0
                    yield ": alive\n\n"
                await asyncio.sleep(poll_s)
                quiet += poll_s
        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={**HEADERS, "X-Accel-Buffering": "no"})

    def gated(endpoint):
        async def wrapped(request: Request) -> Response:
            problem = guard.host_problem(request.headers)
            if problem:
                return Response(problem + "\n", status_code=421, media_type="text/plain", headers=HEADERS)
            problem = guard.login_problem(request.headers)
            if problem:
                return Response(problem + "\n", status_code=401, media_type="text/plain",
                                headers={**HEADERS, "WWW-Authenticate": 'Basic realm="loopwright dashboard"'})
            try:
                return await endpoint(request)
            except (LookupError, ValueError) as e:
                return html(views.message_page("not found", str(e), "/"), 404)
            except (LedgerError, LoopError, WorkspaceError) as e:   # e.g. a ledger from a newer loopwright
                return html(views.message_page("cannot show this workspace", str(e), "/"), 503)
        return wrapped

    async def no_slash(request: Request) -> Response:
        return RedirectResponse(f"/w/{request.path_params['index']}/", status_code=308, headers=HEADERS)

    routes = [Route("/", gated(index)), Route("/fragments", gated(index_fragments)),
              Route("/events", gated(events)),
              Route("/w/{index:int}", gated(no_slash)), Route("/w/{index:int}/", gated(workspace)),
              Route("/w/{index:int}/fragments", gated(fragments)),
              Route("/w/{index:int}/experiments/{eid:int}", gated(experiment)),
              Route("/w/{index:int}/approvals/{aid:int}", gated(decide), methods=["POST"]),
              Mount("/static", app=StaticFiles(directory=STATIC), name="static")]
    app = Starlette(routes=routes)
    app.state.appliers = appliers
    app.state.guard = guard
    return app


def _check_port(host: str, port: int) -> None:
    """Say plainly when the port is taken (uvicorn would log a bind error and exit)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise data.DashboardError(f"cannot listen on {host}:{port} ({e.strerror or e}): another program "
                                  "(another dashboard?) uses it; pass --port N") from None


def serve(roots: list[Path], host: str, port: int, allow_remote: bool, read_only: bool, who: str,
          on_start: Optional[Callable[[str], None]] = None) -> None:
    """`loopwright dashboard`: check the binding and the workspaces, print the URL with the token, serve."""
    import uvicorn

    guard = Guard.for_binding(host, port, allow_remote, read_only)
    app = create_app(data.sources(roots), guard, who)
    _check_port(host, port)
    shown = f"[{host}]" if ":" in host else host
    url = views.link_with_token(f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else shown}:{port}", guard.token)
    if on_start is not None:
        on_start(url)
    # open SSE streams never end by themselves: give them a moment at Ctrl-C, then close them
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
