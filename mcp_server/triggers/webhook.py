"""`loopwright webhook`: signed HTTP triggers that start (or stop) agent sessions.

Endpoints (each verifies its sender's HMAC over the raw body with hmac.compare_digest):
  POST /github  X-Hub-Signature-256: sha256=HMAC(secret, body); deduped by X-GitHub-Delivery
  POST /slack   slash command; X-Slack-Signature: v0=HMAC(secret, "v0:{ts}:{body}") with
                X-Slack-Request-Timestamp inside the window; `start`, `status`, `stop [reason]`
  POST /slack/interactive  Slack's Approve / Reject buttons (autonomy slider), signed as /slack;
                a replayed request does nothing (approval_routes.py)
  POST /jira    X-Hub-Signature: sha256=HMAC(secret, body); deduped by X-Atlassian-Webhook-Identifier;
                also `/approve N`, `/reject N why` on the campaign's issue
  POST /hook    generic: X-Loopwright-Signature: sha256=HMAC(secret, "{ts}.{body}"),
                X-Loopwright-Timestamp inside the window, deduped by X-Loopwright-Delivery
  GET  /healthz
Secrets come from the environment variables named in [webhook]; an endpoint whose
secret is unset answers 503 and never accepts an unsigned request.

A start replies 202 and runs the session in a background thread while holding the
session lock shared with `loopwright cron`: at most one session at a time. A start
while one runs gets 409 {"status": "busy"} (Slack: a 200 reply saying so) and its
delivery id is forgotten, so the sender's redelivery can start it later.
Duplicate delivery ids get 200 {"status": "duplicate"} and do nothing; seen ids
are kept for 30 days in the state directory's webhook.db, so a restart does not forget them.

A stop request is `ledger.request_stop(reason)`: the loop honours it
at its next budget check.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Mapping, Optional
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from mcp_server.ledger.seen import SeenStore
from mcp_server.triggers import approval_routes
from mcp_server.triggers.common import SESSION_LOCK, SessionLock, launch

log = logging.getLogger("loopwright.webhook")


TRUSTED_GITHUB_ROLES = {"OWNER", "MEMBER", "COLLABORATOR"}
StartSession = Callable[[str], None]   # (trigger_detail) -> None; blocks until the session ends


class Reject(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class SessionRunner:
    """Runs one session at a time in a background thread, holding the shared session lock."""

    def __init__(self, start_session: StartSession, lock: SessionLock):
        self.start_session, self.lock = start_session, lock
        self.thread: Optional[threading.Thread] = None

    def try_start(self, detail: str, on_refused: Optional[Callable[[], None]] = None) -> bool:
        """Start a session in the background; `on_refused` runs when the launcher refused to start one
        (nothing recorded: budget spent, client missing), so a redelivery may try again."""
        held = self.lock.try_acquire()
        if held is None:
            return False

        def run() -> None:
            from mcp_server.agents.launch import LaunchError

            try:
                self.start_session(detail)
            except LaunchError as e:
                log.error("session (%s) not started: %s", detail, e)
                if on_refused is not None:
                    on_refused()
            except Exception:
                log.exception("session (%s) failed", detail)
            finally:
                held.release()

        self.thread = threading.Thread(target=run, name="loopwright-session", daemon=False)
        self.thread.start()
        return True

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def wait(self, timeout: Optional[float] = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
        return not self.running


# -- signatures -------------------------------------------------------------------
def _hex_hmac(secret: str, data: bytes) -> str:
    return hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def _check(expected: str, given: Optional[str], what: str) -> None:
    if not given:
        raise Reject(401, f"missing {what} header")
    if not hmac.compare_digest(expected.encode(), given.strip().encode()):
        raise Reject(401, f"bad {what}")


def _check_timestamp(ts: Optional[str], now: float, window: float, what: str) -> None:
    try:
        age = abs(now - int(ts or ""))
    except ValueError:
        raise Reject(401, f"missing or malformed {what} header") from None
    if age > window:
        raise Reject(401, f"{what} is {age:.0f}s away from now (window {window:.0f}s): stale or replayed")


def github_signature(secret: str, body: bytes) -> str:
    return "sha256=" + _hex_hmac(secret, body)


def slack_signature(secret: str, timestamp: str, body: bytes) -> str:
    return "v0=" + _hex_hmac(secret, b"v0:" + timestamp.encode() + b":" + body)


def generic_signature(secret: str, timestamp: str, body: bytes) -> str:
    return "sha256=" + _hex_hmac(secret, timestamp.encode() + b"." + body)


# -- the app ----------------------------------------------------------------------
def _command(text: str) -> tuple[str, str]:
    """'/loopwright stop too slow' → ('stop', 'too slow'); anything else → ('', '')."""
    words = (text or "").strip().split(None, 2)
    if len(words) >= 2 and words[0] == "/loopwright":
        return words[1].lower(), words[2] if len(words) > 2 else ""
    return "", ""


def _default_status(ledger) -> str:
    if ledger is None:
        return "status unavailable: no ledger"
    c = ledger.campaign()
    if c is None:
        return "no campaign yet"
    n = ledger.count_experiments(c["id"])
    stop = ledger.stop_request()
    return (f"campaign {c['tag']} ({c['status']}): {n} experiments, best commit {str(c['best_commit'])[:12]}"
            + (f"; stop requested: {stop}" if stop else ""))


def create_app(root_or_cfg, start_session: Optional[StartSession] = None, ledger=None,  # noqa: C901 - routes as closures
               clock: Callable[[], float] = time.time, *, status_text: Optional[Callable[[], str]] = None,
               state_dir: Path | str | None = None, env: Optional[Mapping[str, str]] = None,
               preflight: Optional[Callable[[], Optional[str]]] = None) -> Starlette:
    """The receiver. `root_or_cfg` is a workspace root (config, ledger and state dir from it) or a
    LoopwrightConfig (then pass `ledger` and/or `state_dir`; without either, seen ids live in memory).
    `preflight` says why no session could start now (None: it can), before a start is answered."""
    if isinstance(root_or_cfg, (str, Path)):
        from mcp_server.loop.workspace import Workspace

        ws = Workspace.open(root_or_cfg)
        cfg, state_dir = ws.cfg, state_dir or ws.state_dir
        ledger = ledger if ledger is not None else ws.ledger()
        if start_session is None:
            start_session, preflight = default_starter(ws.root, cfg), preflight or default_preflight(ws.root, cfg)
        ws_root = ws.root   # approvals (Slack buttons, Jira /approve) need the workspace
    else:
        cfg, ws_root = root_or_cfg, None
        if start_session is None:
            raise ValueError("pass start_session when create_app gets a config instead of a workspace root")
    if state_dir is None and ledger is not None:
        state_dir = Path(ledger.path).parent
    if state_dir is None:
        log.warning("no state dir: delivery ids are remembered in memory only")
    wh, env = cfg.webhook, (os.environ if env is None else env)
    seen = SeenStore(Path(state_dir) / "webhook.db" if state_dir else ":memory:", clock)
    lock_dir = Path(state_dir) if state_dir else Path(tempfile.gettempdir())
    runner = SessionRunner(start_session, SessionLock(lock_dir / SESSION_LOCK))
    status_text = status_text or (lambda: _default_status(ledger))

    def secret(env_name: str) -> str:
        value = env.get(env_name)
        if not value:
            raise Reject(503, f"this endpoint is disabled: ${env_name} is not set; export the shared secret "
                              "and restart `loopwright webhook` (see docs/connectors.md)")
        return value

    async def body_of(request: Request) -> bytes:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > wh.max_body_bytes):
            raise Reject(413, f"body larger than {wh.max_body_bytes} bytes")
        buf = bytearray()
        async for chunk in request.stream():   # also bounds chunked bodies without a length
            buf += chunk
            if len(buf) > wh.max_body_bytes:
                raise Reject(413, f"body larger than {wh.max_body_bytes} bytes")
        return bytes(buf)

    async def verified(request: Request, env_name: str, sig_header: str, sign,
                       ts_header: Optional[str] = None) -> tuple[bytes, str]:
        """The raw body and its signature, once the secret, size, timestamp and HMAC all check out."""
        key = secret(env_name)
        body = await body_of(request)
        ts = None
        if ts_header:
            ts = request.headers.get(ts_header)
            _check_timestamp(ts, clock(), wh.timestamp_window_s, ts_header)
        sig = request.headers.get(sig_header)
        _check(sign(key, ts, body), sig, sig_header)
        return body, sig or ""                   # _check refused a missing one

    def act(source: str, delivery_id: str, action: str, text: str) -> str:
        """Start a session (text: its detail) or record a stop request (text: the reason), once per
        delivery id. Returns started | busy | stop requested | duplicate."""
        if not seen.add(source, delivery_id):
            return "duplicate"
        if action == "stop":
            if ledger is None:
                seen.forget(source, delivery_id)
                raise Reject(503, "no ledger to record the stop request in")
            ledger.request_stop(text)
            log.info("stop requested: %s", text)
            return "stop requested"
        problem = preflight() if preflight is not None else None
        if problem:
            seen.forget(source, delivery_id)   # a redelivery after the fix may start it
            raise Reject(503, f"not starting a session: {problem}")
        if not runner.try_start(text, on_refused=lambda: seen.forget(source, delivery_id)):
            seen.forget(source, delivery_id)   # let a redelivery start it once the session ends
            return "busy"
        log.info("session started: %s", text)
        return "started"

    def respond(source: str, delivery_id: str, action: str, text: str) -> JSONResponse:
        outcome = act(source, delivery_id, action, text)
        code = {"started": 202, "stop requested": 202, "busy": 409, "duplicate": 200}[outcome]
        return JSONResponse({"status": outcome, "detail": text}, status_code=code)

    def ignored(why: str) -> JSONResponse:
        return JSONResponse({"status": "ignored", "reason": why})

    async def github(request: Request) -> JSONResponse:
        body, _ = await verified(request, wh.github_secret_env, "X-Hub-Signature-256",
                                 lambda key, ts, b: github_signature(key, b))
        event, delivery = request.headers.get("x-github-event", ""), request.headers.get("x-github-delivery")
        if event == "ping":
            return JSONResponse({"status": "pong"})
        if not delivery:
            raise Reject(400, "missing X-GitHub-Delivery header")
        p = _json_body(body, request.headers.get("content-type", ""))
        repo = _obj(p, "repository").get("full_name", "?")
        if event == "push":
            ref = str(p.get("ref", ""))
            if ref.startswith(("refs/heads/loopwright/", "refs/heads/loopwright-pending/")) or p.get("deleted"):
                return ignored("push to a loopwright branch (the loop's own) or a branch deletion")
            return respond("github", delivery, "start", f"github push {repo} {ref} {str(p.get('after', ''))[:12]}")
        if event == "workflow_run":
            if p.get("action") != "completed":
                return ignored("workflow_run not completed")
            run = _obj(p, "workflow_run")
            return respond("github", delivery, "start",
                           f"github workflow_run {repo} {run.get('name', '?')} {run.get('conclusion', '?')}")
        if event == "issue_comment" and p.get("action") == "created":
            comment = _obj(p, "comment")
            cmd, arg = _command(_str(comment, "comment.body"))
            who = _obj(p, "sender").get("login", "?")
            if cmd and comment.get("author_association") not in TRUSTED_GITHUB_ROLES:
                # on a public repository anyone may comment: sessions cost money
                return ignored(f"{who} is not an owner, member or collaborator of {repo}")
            if cmd == "start":
                return respond("github", delivery, "start", f"github comment by {who} on {repo}")
            if cmd == "stop":
                return respond("github", delivery, "stop", arg or f"requested by {who} on GitHub")
            return ignored("comment without a /loopwright command")
        return ignored(f"event {event or '(none)'} does not start sessions")

    async def slack(request: Request) -> JSONResponse:
        body, sig = await verified(request, wh.slack_signing_secret_env, "X-Slack-Signature", slack_signature,
                                   ts_header="X-Slack-Request-Timestamp")
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        words = form.get("text", "").strip().split(None, 1)
        cmd, arg = (words[0].lower() if words else "help"), (words[1] if len(words) > 1 else "")
        who = form.get("user_name") or form.get("user_id") or "?"

        def reply(text: str) -> JSONResponse:   # Slack shows non-200 replies as errors: always 200
            return JSONResponse({"response_type": "ephemeral", "text": text})

        if cmd == "status":
            return reply(status_text())
        if cmd not in ("start", "stop"):
            return reply("usage: /loopwright start | status | stop [reason]")
        # Slack sends no delivery id; the signature (which covers the timestamp) names the request
        try:
            outcome = act("slack", sig, cmd, f"slack /loopwright start by {who}" if cmd == "start"
                          else arg or f"requested by {who} on Slack")
        except Reject as e:
            return reply(f"Not done: {e}")
        return reply({"started": "Starting a loopwright session.",
                      "busy": "A session is already running; not starting another.",
                      "stop requested": "Stop requested: the loop stops at its next budget check.",
                      "duplicate": "Duplicate request ignored."}[outcome])

    async def jira(request: Request) -> JSONResponse:
        body, _ = await verified(request, wh.jira_secret_env, "X-Hub-Signature",
                                 lambda key, ts, b: github_signature(key, b))   # same scheme as GitHub
        delivery = request.headers.get("x-atlassian-webhook-identifier") or hashlib.sha256(body).hexdigest()
        p = _json_body(body, "application/json")
        if p.get("webhookEvent") != "comment_created":
            return ignored(f"event {p.get('webhookEvent')} does not start sessions")
        comment = _obj(p, "comment")
        if ws_root is not None and approval_routes.JIRA_COMMAND.match(_str(comment, "comment.body")):
            # `/approve 12`, `/reject 12 why`: the autonomy slider (approval_routes.py); replays do nothing
            if not seen.add("jira-approval", delivery):
                return JSONResponse({"status": "duplicate"})
            outcome = approval_routes.jira_comment(ws_root, settings_now(), ledger, p, appliers)
            if outcome is not None:
                return JSONResponse(dict(outcome))
        cmd, arg = _command(_str(comment, "comment.body"))
        issue = _obj(p, "issue").get("key", "?")
        who = _obj(comment, "author", "comment.author").get("displayName", "?")
        if cmd == "start":
            return respond("jira", delivery, "start", f"jira comment by {who} on {issue}")
        if cmd == "stop":
            return respond("jira", delivery, "stop", arg or f"requested by {who} on {issue}")
        return ignored("comment without a /loopwright command")

    async def generic(request: Request) -> JSONResponse:
        body, sig = await verified(request, wh.generic_secret_env, "X-Loopwright-Signature", generic_signature,
                                   ts_header="X-Loopwright-Timestamp")
        delivery = request.headers.get("x-loopwright-delivery") or sig
        p = _json_body(body, "application/json") if body.strip() else {}
        action = str(p.get("action", "start"))
        if action == "start":
            return respond("hook", delivery, "start", f"webhook {p.get('detail') or 'start'}"[:200])
        if action == "stop":
            return respond("hook", delivery, "stop", str(p.get("reason") or "requested by webhook"))
        if action == "status":
            return JSONResponse({"status": "ok", "text": status_text()})
        raise Reject(400, f"unknown action {action!r}; use start, stop or status")

    async def slack_interactive(request: Request) -> JSONResponse:
        """Slack's interactivity request (Approve / Reject buttons), signed like a slash command."""
        body, sig = await verified(request, wh.slack_signing_secret_env, "X-Slack-Signature", slack_signature,
                                   ts_header="X-Slack-Request-Timestamp")
        if ws_root is None:
            raise Reject(503, "approvals need the receiver to serve a workspace: `loopwright webhook -w DIR`")
        if not seen.add("slack-interactive", sig):    # the signature covers the timestamp: a replay
            return JSONResponse({"status": "duplicate"})
        # always 200: Slack shows anything else to the person as an error
        return JSONResponse(dict(approval_routes.slack_interaction(ws_root, settings_now(), ledger, body, env,
                                                                    appliers)))

    def settings_now():
        """The current settings (allow-lists, Slack token variable): changed with `loopwright config set`."""
        from mcp_server.loop.workspace import Workspace

        return Workspace.open(ws_root).cfg

    appliers: list = []   # background threads applying approved changes (tests join them)

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "session_running": runner.running})

    def guarded(fn):
        async def endpoint(request: Request) -> JSONResponse:
            try:
                return await fn(request)
            except Reject as e:
                log.warning("%s %s rejected: %s", request.method, request.url.path, e)
                return JSONResponse({"error": str(e)}, status_code=e.status)
        return endpoint

    app = Starlette(routes=[Route("/github", guarded(github), methods=["POST"]),
                            Route("/slack", guarded(slack), methods=["POST"]),
                            Route("/slack/interactive", guarded(slack_interactive), methods=["POST"]),
                            Route("/jira", guarded(jira), methods=["POST"]),
                            Route("/hook", guarded(generic), methods=["POST"]),
                            Route("/healthz", healthz, methods=["GET"])])
    app.state.runner, app.state.seen, app.state.appliers = runner, seen, appliers
    return app


def _obj(p: dict, key: str, name: Optional[str] = None) -> dict:
    """p[key] as an object ({} when absent); a signed payload of the wrong shape is the sender's error
    (400 with the field's name), never a crash of the receiver."""
    v = p.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise Reject(400, f"payload field {name or key!r} must be an object, got {type(v).__name__}")
    return v


def _str(p: dict, name: str) -> str:
    v = p.get(name.rsplit(".", 1)[-1])
    if v is None:
        return ""
    if not isinstance(v, str):
        raise Reject(400, f"payload field {name!r} must be a string, got {type(v).__name__}")
    return v


def _json_body(body: bytes, content_type: str) -> dict:
    """JSON, or GitHub's form encoding (payload=<json>)."""
    try:
        if "x-www-form-urlencoded" in content_type:
            body = parse_qs(body.decode())["payload"][0].encode()
        data = json.loads(body)
    except (ValueError, KeyError):
        raise Reject(400, "body is not the JSON payload expected") from None
    if not isinstance(data, dict):
        raise Reject(400, "JSON payload must be an object")
    return data


def default_preflight(root: Path | str, cfg) -> Callable[[], Optional[str]]:
    """What the launcher would refuse before starting (client binary missing, budget spent), checked
    while the request waits, so the answer is not "started" for a session that cannot start."""
    def check() -> Optional[str]:
        from mcp_server.agents.launch import LaunchError, client_env, find_client
        from mcp_server.loop.engine import Engine

        agent = cfg.webhook.agent
        if agent in ("claude", "codex"):
            try:
                find_client(agent, client_env(0, Path(root), agent=agent, cfg=cfg))
            except LaunchError as e:
                return str(e)
        eng = Engine(Path(root))
        try:
            budget = eng.budget()
        finally:
            eng.close()
        if budget.should_stop:
            return (f"the campaign budget says stop ({'; '.join(budget.reasons)}); raise it with `loopwright config "
                    "set budget.<key> VALUE` or clear a stop request with `loopwright stop --clear`")
        return None
    return check


def default_starter(root: Path | str, cfg) -> StartSession:
    def start(detail: str) -> None:
        launch(root, agent=cfg.webhook.agent, trigger="webhook", detail=detail)
    return start


def serve(root: Path | str, host: Optional[str] = None, port: Optional[int] = None) -> None:
    """`loopwright webhook`: serve the receiver with uvicorn until SIGTERM/SIGINT (a session in
    progress runs to its end before the process exits)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from mcp_server.loop.workspace import Workspace

    wh = Workspace.open(root).cfg.webhook      # the human's settings, not the agent-writable loopwright.toml
    app = create_app(root)
    uvicorn.run(app, host=host or wh.host, port=port or wh.port, log_level="info")
