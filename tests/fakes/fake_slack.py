"""A fake Slack: the Web API methods loopwright uses, the upload URL, and incoming webhooks.

Endpoints (as documented by Slack): POST /api/chat.postMessage (JSON),
GET /api/conversations.history (with metadata when include_all_metadata),
/api/files.getUploadURLExternal → upload_url on this server, POST /upload/<id>
(the bytes), /api/files.completeUploadExternal, /api/files.info (`shares`; file_not_found until completed),
/api/auth.test, and
POST /services/<path> for an incoming webhook, /api/chat.update. `messages` is the channel as a
person would see it: what a test asserts on.
"""
from __future__ import annotations

import itertools
import json

from . import LoopbackServer, Request, Response

CHANNELS = {"#research": "C0RESEARCH", "C0RESEARCH": "C0RESEARCH"}


class FakeSlack(LoopbackServer):
    def __init__(self, token: str = "xoxb-test-token"):
        super().__init__()
        self.token = token
        self.messages: list[dict] = []          # posted via chat.postMessage or a webhook
        self.updates: list[dict] = []           # chat.update calls that changed a message
        self.files: dict[str, dict] = {}        # file_id → {data, title, channel, thread_ts, shared}
        self._ts = itertools.count(1)
        self._fid = itertools.count(1)

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/services/T000/B000/secretpart"

    def route(self, req: Request) -> str:
        if req.path.startswith("/api/"):
            return req.path[len("/api/"):]
        if req.path.startswith("/upload/"):
            return "upload"
        if req.path.startswith("/services/"):
            return "webhook"
        return req.path

    def shared_files(self) -> list[dict]:
        return [f for f in self.files.values() if f["shared"]]

    def handle(self, req: Request) -> Response:
        route = self.route(req)
        if route == "webhook":
            self.messages.append({"via": "webhook", "text": req.params.get("text"),
                                  "blocks": req.params.get("blocks")})
            return Response(200, "ok")
        if route == "upload":
            fid = req.path.rsplit("/", 1)[-1]
            if fid not in self.files:
                return Response(404, "no such upload")
            self.files[fid]["data"] = req.raw
            return Response(200, f"OK - {len(req.raw)}")
        if req.headers.get("authorization") != f"Bearer {self.token}":
            return Response(200, {"ok": False, "error": "invalid_auth"})
        method = getattr(self, "_" + route.replace(".", "_"), None)
        if method is None:
            return Response(200, {"ok": False, "error": "unknown_method"})
        return method(req.params)

    def _auth_test(self, p) -> Response:
        return Response(200, {"ok": True, "team_id": "T000", "user_id": "U0BOT"})

    def _chat_postMessage(self, p) -> Response:
        channel = CHANNELS.get(p.get("channel"))
        if channel is None:
            return Response(200, {"ok": False, "error": "channel_not_found"})
        ts = f"1700000000.{next(self._ts):06d}"
        blocks = p.get("blocks")
        metadata = p.get("metadata")
        msg = {"via": "api", "channel": channel, "ts": ts, "text": p.get("text"),
               "blocks": json.loads(blocks) if isinstance(blocks, str) else blocks,
               "metadata": json.loads(metadata) if isinstance(metadata, str) else metadata}
        self.messages.append(msg)
        return Response(200, {"ok": True, "channel": channel, "ts": ts, "message": {"text": msg["text"]}})

    def _chat_update(self, p) -> Response:
        """chat.update: the message (by channel and ts) gets the new text and blocks, as Slack shows it."""
        blocks = p.get("blocks")
        for m in self.messages:
            if m.get("channel") == p.get("channel") and m.get("ts") == p.get("ts"):
                m.update(text=p.get("text"), blocks=json.loads(blocks) if isinstance(blocks, str) else blocks,
                         edited=True)
                self.updates.append({"channel": m["channel"], "ts": m["ts"], "text": m["text"]})
                return Response(200, {"ok": True, "channel": m["channel"], "ts": m["ts"], "text": m["text"]})
        return Response(200, {"ok": False, "error": "message_not_found"})

    def _conversations_history(self, p) -> Response:
        channel = p.get("channel")
        with_md = str(p.get("include_all_metadata")).lower() in ("1", "true")
        out = []
        for m in reversed(self.messages):
            if m.get("channel") == channel:
                item = {"type": "message", "ts": m["ts"], "text": m["text"]}
                if with_md and m.get("metadata"):
                    item["metadata"] = m["metadata"]
                out.append(item)
        return Response(200, {"ok": True, "messages": out, "has_more": False})

    def _files_getUploadURLExternal(self, p) -> Response:
        if not p.get("filename") or not p.get("length"):
            return Response(200, {"ok": False, "error": "invalid_arguments"})
        fid = f"F{next(self._fid):04d}"
        self.files[fid] = {"data": None, "title": None, "channel": None, "thread_ts": None, "shared": False,
                           "filename": p["filename"]}
        return Response(200, {"ok": True, "upload_url": f"{self.url}/upload/{fid}", "file_id": fid})

    def _files_completeUploadExternal(self, p) -> Response:
        files = json.loads(p.get("files") or "[]")
        out = []
        for f in files:
            rec = self.files.get(f.get("id"))
            if rec is None or rec["data"] is None:
                return Response(200, {"ok": False, "error": "file_not_found"})
            rec.update(title=f.get("title"), channel=p.get("channel_id"), thread_ts=p.get("thread_ts"), shared=True)
            rec["share_count"] = rec.get("share_count", 0) + 1     # Slack shares again on a repeated call
            out.append({"id": f["id"], "title": f.get("title")})
        return Response(200, {"ok": True, "files": out})

    def _files_info(self, p) -> Response:
        rec = self.files.get(p.get("file"))
        if rec is None or not rec["shared"]:   # an upload never completed is not a file yet
            return Response(200, {"ok": False, "error": "file_not_found"})
        shares = {"public": {rec["channel"]: [{"ts": rec["thread_ts"], "thread_ts": rec["thread_ts"]}]}}
        channels = [rec["channel"]]
        return Response(200, {"ok": True, "file": {"id": p["file"], "name": rec["filename"], "title": rec["title"],
                                                   "shares": shares, "channels": channels}})
