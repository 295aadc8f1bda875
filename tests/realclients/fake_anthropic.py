"""A scripted fake of the Anthropic Messages API, for driving the real
``claude`` CLI offline.

    from realclients.fake_anthropic import FakeAnthropic, Turn, Text, ToolUse

    script = [
        ToolUse("Write", {"file_path": "a.txt", "content": "hi\n"}),   # turn 0
        lambda req: f"the tool said: {req.last_tool_results()[0].text}",  # turn 1
    ]
    with FakeAnthropic(script) as fake:
        env["ANTHROPIC_BASE_URL"] = fake.url
        ...
    fake.requests   # every request, recorded (see _serve.Recorded)

Turn selection is stateless: the turn index is the number of assistant
messages in the request's ``messages`` (so a retried request replays the same
turn).  A script entry may be a :class:`Turn`, a block (:class:`Text`,
:class:`ToolUse`), a plain ``str`` (a text-only turn), a list of blocks, or a
callable ``f(MessagesRequest) -> any of those``.  When the script is exhausted
the server answers a short ``end_turn`` text (:data:`EXHAUSTED_TEXT`).

Streaming follows the real wire format: message_start, content_block_start /
content_block_delta (``text_delta``; ``input_json_delta`` with the tool input
split over several deltas) / content_block_stop, message_delta (stop_reason
``tool_use`` or ``end_turn``), message_stop.  ``stream: false`` gets a plain
JSON message; ``/v1/messages/count_tokens`` gets a rough count; anything else a
404 in Anthropic's error shape.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Union

try:  # imported both as ``realclients.fake_anthropic`` and stand-alone
    from ._serve import Recorded, ScriptedServer, split_chunks, sse
except ImportError:  # pragma: no cover
    from _serve import Recorded, ScriptedServer, split_chunks, sse

EXHAUSTED_TEXT = "(fake-anthropic: script exhausted)"


# --------------------------------------------------------------------------
# script vocabulary
@dataclass
class Text:
    text: str


@dataclass
class ToolUse:
    """A tool call. ``name`` is the client-side name: ``Write``, ``Edit``,
    ``Bash``, ``mcp__<server>__<tool>``, ``mcp__plugin_<plugin>_<server>__<tool>``."""

    name: str
    input: dict = field(default_factory=dict)
    id: str | None = None  # default: toolu_lw_<turn>_<block>


class Turn:
    """One assistant message.  ``stop_reason`` defaults to ``tool_use`` when
    the turn has a tool call, else ``end_turn``."""

    def __init__(self, *blocks: Text | ToolUse | str, stop_reason: str | None = None):
        self.blocks = [Text(b) if isinstance(b, str) else b for b in blocks]
        if stop_reason is None:
            stop_reason = "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"
        self.stop_reason = stop_reason

    def __repr__(self) -> str:
        return f"Turn({', '.join(map(repr, self.blocks))}, stop_reason={self.stop_reason!r})"


ScriptEntry = Union[Turn, Text, ToolUse, str, list, Callable[["MessagesRequest"], Any]]


def as_turn(entry: Any) -> Turn:
    if isinstance(entry, Turn):
        return entry
    if isinstance(entry, (Text, ToolUse, str)):
        return Turn(entry)
    if isinstance(entry, (list, tuple)):
        return Turn(*entry)
    raise TypeError(f"cannot make a Turn out of {entry!r}")


# --------------------------------------------------------------------------
# request view (what callbacks and tests look at)
def block_text(content: Any) -> str:
    """Flatten a message/tool_result ``content`` (str or list of blocks) to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for b in content:
        if isinstance(b, dict):
            if b.get("type") == "text":
                parts.append(b.get("text", ""))
            elif b.get("type") == "tool_result":
                parts.append(block_text(b.get("content")))
        elif isinstance(b, str):
            parts.append(b)
    return "\n".join(parts)


@dataclass
class ToolResult:
    tool_use_id: str
    is_error: bool
    text: str
    raw: dict


class MessagesRequest:
    """A read-only view of one ``POST /v1/messages`` body."""

    def __init__(self, rec: Recorded):
        self.rec = rec
        self.body: dict = rec.body if isinstance(rec.body, dict) else {}

    @property
    def messages(self) -> list[dict]:
        return self.body.get("messages") or []

    @property
    def model(self) -> str:
        return self.body.get("model") or "claude-fake"

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def tool_names(self) -> list[str]:
        return [t.get("name") for t in self.body.get("tools") or [] if isinstance(t, dict)]

    @property
    def system_text(self) -> str:
        return block_text(self.body.get("system"))

    @property
    def turn_index(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    @property
    def text(self) -> str:
        return self.rec.text

    @property
    def turn(self) -> int | None:
        """The scripted turn the server answered this request with."""
        return self.rec.turn

    def tool_results(self) -> list[ToolResult]:
        """Every tool_result block in the conversation, oldest first."""
        out = []
        for m in self.messages:
            if m.get("role") != "user" or not isinstance(m.get("content"), list):
                continue
            for b in m["content"]:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    out.append(
                        ToolResult(b.get("tool_use_id", ""), bool(b.get("is_error")), block_text(b.get("content")), b)
                    )
        return out

    def last_tool_results(self) -> list[ToolResult]:
        """tool_result blocks after the last assistant message."""
        last_asst = max((i for i, m in enumerate(self.messages) if m.get("role") == "assistant"), default=-1)
        tail = MessagesRequest.__new__(MessagesRequest)
        tail.rec, tail.body = self.rec, {"messages": self.messages[last_asst + 1 :]}
        return tail.tool_results()

    def tool_result(self, tool_use_id: str) -> ToolResult | None:
        return next((r for r in self.tool_results() if r.tool_use_id == tool_use_id), None)

    def user_texts_after_last_assistant(self) -> str:
        """All non-tool_result text the client added since the model last spoke
        (e.g. Stop-hook feedback, system reminders)."""
        last_asst = max((i for i, m in enumerate(self.messages) if m.get("role") == "assistant"), default=-1)
        parts = []
        for m in self.messages[last_asst + 1 :]:
            c = m.get("content")
            if isinstance(c, str):
                parts.append(c)
            elif isinstance(c, list):
                parts.extend(b.get("text", "") for b in c if isinstance(b, dict) and b.get("type") == "text")
        return "\n".join(parts)


# --------------------------------------------------------------------------
# the server
class FakeAnthropic(ScriptedServer):
    """Scripted ``/v1/messages`` server.  ``.url`` is the ANTHROPIC_BASE_URL."""

    def __init__(self, script: list[ScriptEntry] | None = None, *, chunks: int = 3, **kw):
        super().__init__(script, **kw)
        self.chunks = chunks

    # views ----------------------------------------------------------------
    def message_requests(self) -> list[MessagesRequest]:
        """The recorded ``POST /v1/messages`` calls, as :class:`MessagesRequest`."""
        return [
            MessagesRequest(r)
            for r in list(self.requests)
            if r.method == "POST" and r.path.rstrip("/").endswith("/v1/messages")
        ]

    @property
    def turns_served(self) -> list[int | None]:
        return [r.rec.turn for r in self.message_requests()]

    @property
    def exhausted(self) -> bool:
        """True when some request asked for a turn past the end of the script."""
        return any(t is not None and t >= len(self.script) for t in self.turns_served)

    # routing --------------------------------------------------------------
    def handle(self, rec: Recorded):
        path = rec.path.rstrip("/")
        if rec.method == "POST" and path.endswith("/v1/messages"):
            return self._messages(rec)
        if rec.method == "POST" and path.endswith("/v1/messages/count_tokens"):
            return self.json_response(200, {"input_tokens": max(1, len(rec.raw) // 4)})
        if rec.method in ("GET", "HEAD") and path in ("", "/"):
            return self.json_response(200, {"ok": True, "fake": "anthropic"})
        return self.json_response(
            404, {"type": "error", "error": {"type": "not_found_error", "message": f"fake: no route {rec.method} {rec.path}"}}
        )

    def _messages(self, rec: Recorded):
        req = MessagesRequest(rec)
        if not isinstance(rec.body, dict) or not isinstance(rec.body.get("messages"), list):
            return self.json_response(
                400, {"type": "error", "error": {"type": "invalid_request_error", "message": "fake: body needs messages"}}
            )
        index = req.turn_index
        rec.turn = index
        entry = self.resolve_turn(index, req)
        turn = Turn(EXHAUSTED_TEXT) if entry is None else as_turn(entry)
        msg_id = f"msg_lw_{index:03d}_{len(self.requests):03d}"
        blocks = []
        for i, b in enumerate(turn.blocks):
            if isinstance(b, ToolUse):
                blocks.append({"type": "tool_use", "id": b.id or f"toolu_lw_{index:02d}_{i}", "name": b.name, "input": b.input})
            else:
                blocks.append({"type": "text", "text": b.text})
        in_tokens = max(1, len(rec.raw) // 4)
        out_tokens = max(1, sum(len(json.dumps(b)) for b in blocks) // 4)
        if not req.stream:
            return self.json_response(
                200,
                {
                    "id": msg_id, "type": "message", "role": "assistant", "model": req.model,
                    "content": blocks, "stop_reason": turn.stop_reason, "stop_sequence": None,
                    "usage": {"input_tokens": in_tokens, "output_tokens": out_tokens},
                },
            )
        events: list[tuple[str, dict]] = [
            ("message_start", {
                "type": "message_start",
                "message": {
                    "id": msg_id, "type": "message", "role": "assistant", "model": req.model,
                    "content": [], "stop_reason": None, "stop_sequence": None,
                    "usage": {"input_tokens": in_tokens, "output_tokens": 1,
                              "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                },
            }),
        ]
        for i, b in enumerate(blocks):
            if b["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "text", "text": ""}}))
                for piece in split_chunks(b["text"], self.chunks):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "text_delta", "text": piece}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": i,
                                                       "content_block": {"type": "tool_use", "id": b["id"],
                                                                         "name": b["name"], "input": {}}}))
                for piece in split_chunks(json.dumps(b["input"]), self.chunks):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                                           "delta": {"type": "input_json_delta", "partial_json": piece}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": turn.stop_reason, "stop_sequence": None},
                                         "usage": {"output_tokens": out_tokens}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return 200, "text/event-stream; charset=utf-8", sse(events)
