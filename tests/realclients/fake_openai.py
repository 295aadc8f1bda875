"""A scripted fake of the OpenAI Responses API, for driving the real
``codex exec`` offline.

    from realclients.fake_openai import FakeOpenAI, Turn, Message, ApplyPatch, McpCall

    script = [
        ApplyPatch("*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"),  # turn 0
        McpCall("adder", "add", {"a": 2, "b": 3}),                                   # turn 1
        lambda req: f"the tool said {req.last_tool_outputs()[0].text}",            # turn 2
    ]
    with FakeOpenAI(script) as fake:
        ...  # base_url = fake.url + "/v1"

Turn selection is stateless: the index is the number of *model turns* already
in the request's ``input``, where a model turn is a run of consecutive items
the model produced (assistant ``message``, ``function_call``,
``custom_tool_call``, ``reasoning`` ...), separated by client items (user /
developer messages, ``*_output`` items).  A retried request replays the same
turn.  A script entry may be a :class:`Turn`, an item (:class:`Message`,
:class:`FunctionCall`, :class:`McpCall`, :class:`CustomToolCall`,
:class:`ApplyPatch`), a plain ``str`` (a message), a list of items, or a
callable ``f(ResponsesRequest) -> any of those``.  When the script is
exhausted the server answers a short message (:data:`EXHAUSTED_TEXT`).

SSE: response.created, response.in_progress, then per item
response.output_item.added (+ response.output_text.delta pieces for messages,
response.function_call_arguments.delta / response.custom_tool_call_input.delta
for calls), response.output_item.done, and finally response.completed with
usage.  Anything but ``POST /v1/responses`` gets JSON (``GET /v1/models`` a
one-model list) or a 404.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Union

try:
    from ._serve import Recorded, ScriptedServer, split_chunks, sse
except ImportError:  # pragma: no cover
    from _serve import Recorded, ScriptedServer, split_chunks, sse

EXHAUSTED_TEXT = "(fake-openai: script exhausted)"


# --------------------------------------------------------------------------
# script vocabulary
@dataclass
class Message:
    """An assistant text message."""

    text: str


@dataclass
class FunctionCall:
    """A ``function_call`` item.  For MCP tools set ``namespace`` to
    ``mcp__<server>`` and ``name`` to the bare tool name (see :func:`McpCall`)."""

    name: str
    arguments: dict | str = field(default_factory=dict)
    namespace: str | None = None
    call_id: str | None = None  # default: call_lw_<turn>_<item>


def McpCall(server: str, tool: str, arguments: dict | None = None, call_id: str | None = None) -> FunctionCall:
    """A call of MCP tool ``tool`` on the server configured as ``[mcp_servers.<server>]``."""
    return FunctionCall(tool, arguments or {}, namespace=f"mcp__{server}", call_id=call_id)


@dataclass
class CustomToolCall:
    """A ``custom_tool_call`` item (freeform tools: ``input`` is raw text)."""

    name: str
    input: str
    call_id: str | None = None


def ApplyPatch(patch: str, call_id: str | None = None) -> CustomToolCall:
    """Codex's freeform ``apply_patch`` tool; ``patch`` is the whole
    ``*** Begin Patch`` ... ``*** End Patch`` text."""
    if not patch.endswith("\n"):
        patch += "\n"
    return CustomToolCall("apply_patch", patch, call_id)


Item = Union[Message, FunctionCall, CustomToolCall]


class Turn:
    """One model response: a list of output items."""

    def __init__(self, *items: Item | str):
        self.items = [Message(i) if isinstance(i, str) else i for i in items]

    def __repr__(self) -> str:
        return f"Turn({', '.join(map(repr, self.items))})"


ScriptEntry = Union[Turn, Message, FunctionCall, CustomToolCall, str, list, Callable[["ResponsesRequest"], Any]]


def as_turn(entry: Any) -> Turn:
    if isinstance(entry, Turn):
        return entry
    if isinstance(entry, (Message, FunctionCall, CustomToolCall, str)):
        return Turn(entry)
    if isinstance(entry, (list, tuple)):
        return Turn(*entry)
    raise TypeError(f"cannot make a Turn out of {entry!r}")


# --------------------------------------------------------------------------
# request view
def is_model_item(item: Any) -> bool:
    """Did the model (rather than the client) produce this ``input`` item?"""
    if not isinstance(item, dict):
        return False
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return not kind.endswith("_output")


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            c.get("text", "") if isinstance(c, dict) else str(c) for c in content
        )
    return json.dumps(content)


@dataclass
class ToolOutput:
    """A ``function_call_output`` / ``custom_tool_call_output`` item.

    Codex does not flag failures to the model: a denied apply_patch reads
    "Command blocked by PreToolUse hook: <reason>. Command: ...", an MCP
    ToolError reads "Wall time: ...\nOutput:\nError executing tool ...".
    (In ``codex exec --json`` the ``mcp_tool_call`` item has status
    "failed".)"""

    call_id: str
    type: str
    text: str
    raw: dict


class ResponsesRequest:
    """A read-only view of one ``POST /v1/responses`` body."""

    def __init__(self, rec: Recorded):
        self.rec = rec
        self.body: dict = rec.body if isinstance(rec.body, dict) else {}

    @property
    def input(self) -> list[dict]:
        inp = self.body.get("input")
        if isinstance(inp, str):
            return [{"type": "message", "role": "user", "content": inp}]
        return inp or []

    @property
    def model(self) -> str:
        return self.body.get("model") or "gpt-fake"

    @property
    def instructions(self) -> str:
        return self.body.get("instructions") or ""

    @property
    def tools(self) -> list[dict]:
        return self.body.get("tools") or []

    @property
    def tool_names(self) -> list[str]:
        """Top-level tool names (namespaced MCP tools show as their namespace)."""
        return [t.get("name") or t.get("type") for t in self.tools if isinstance(t, dict)]

    @property
    def text(self) -> str:
        return self.rec.text

    @property
    def turn(self) -> int | None:
        """The scripted turn the server answered this request with."""
        return self.rec.turn

    @property
    def turn_index(self) -> int:
        turns, prev_model = 0, False
        for item in self.input:
            model = is_model_item(item)
            if model and not prev_model:
                turns += 1
            prev_model = model
        return turns

    def _tail(self) -> list[dict]:
        items = self.input
        last = max((i for i, it in enumerate(items) if is_model_item(it)), default=-1)
        return items[last + 1 :]

    @staticmethod
    def _outputs(items: list[dict]) -> list[ToolOutput]:
        out = []
        for it in items:
            if isinstance(it, dict) and it.get("type", "").endswith("_output"):
                o = it.get("output")
                text = o if isinstance(o, str) else content_text(o.get("content") if isinstance(o, dict) and "content" in o else o)
                out.append(ToolOutput(it.get("call_id", ""), it.get("type", ""), text, it))
        return out

    def tool_outputs(self) -> list[ToolOutput]:
        """Every tool output item in ``input``, oldest first."""
        return self._outputs(self.input)

    def last_tool_outputs(self) -> list[ToolOutput]:
        """Tool outputs after the model's last item."""
        return self._outputs(self._tail())

    def tool_output(self, call_id: str) -> ToolOutput | None:
        return next((o for o in self.tool_outputs() if o.call_id == call_id), None)

    def user_texts_after_last_model_item(self) -> str:
        """Text of user/developer messages the client added since the model
        last spoke (e.g. Stop-hook continuation prompts)."""
        return "\n".join(
            content_text(it.get("content"))
            for it in self._tail()
            if isinstance(it, dict) and it.get("type", "message") == "message"
        )


# --------------------------------------------------------------------------
# the server
class FakeOpenAI(ScriptedServer):
    """Scripted ``/v1/responses`` server.  The Codex ``base_url`` is
    ``fake.url + "/v1"``."""

    def __init__(self, script: list[ScriptEntry] | None = None, *, chunks: int = 3, **kw):
        super().__init__(script, **kw)
        self.chunks = chunks

    def response_requests(self) -> list[ResponsesRequest]:
        return [
            ResponsesRequest(r)
            for r in list(self.requests)
            if r.method == "POST" and r.path.rstrip("/").endswith("/responses")
        ]

    @property
    def turns_served(self) -> list[int | None]:
        return [r.rec.turn for r in self.response_requests()]

    @property
    def exhausted(self) -> bool:
        return any(t is not None and t >= len(self.script) for t in self.turns_served)

    def handle(self, rec: Recorded):
        path = rec.path.rstrip("/")
        if rec.method == "POST" and path.endswith("/responses"):
            return self._responses(rec)
        if rec.method in ("GET", "HEAD") and path.endswith("/models"):
            return self.json_response(200, {"object": "list", "data": [{"id": "gpt-5.5", "object": "model", "owned_by": "fake"}], "models": []})
        if rec.method in ("GET", "HEAD") and path in ("", "/", "/v1"):
            return self.json_response(200, {"ok": True, "fake": "openai"})
        return self.json_response(404, {"error": {"message": f"fake: no route {rec.method} {rec.path}", "type": "invalid_request_error"}})

    def _responses(self, rec: Recorded):
        if not isinstance(rec.body, dict):
            return self.json_response(400, {"error": {"message": "fake: JSON body required", "type": "invalid_request_error"}})
        req = ResponsesRequest(rec)
        index = req.turn_index
        rec.turn = index
        entry = self.resolve_turn(index, req)
        turn = Turn(EXHAUSTED_TEXT) if entry is None else as_turn(entry)
        resp_id = f"resp_lw_{index:03d}_{len(self.requests):03d}"
        base = {"id": resp_id, "object": "response", "created_at": 0, "model": req.model}
        events: list[tuple[str, dict]] = [
            ("response.created", {"type": "response.created", "response": {**base, "status": "in_progress", "output": []}}),
            ("response.in_progress", {"type": "response.in_progress", "response": {**base, "status": "in_progress", "output": []}}),
        ]
        done_items = []
        for n, it in enumerate(turn.items):
            if isinstance(it, Message):
                item_id = f"msg_lw_{index:03d}_{n}"
                events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": n,
                    "item": {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}}))
                events.append(("response.content_part.added", {"type": "response.content_part.added", "item_id": item_id,
                    "output_index": n, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}))
                for piece in split_chunks(it.text, self.chunks):
                    events.append(("response.output_text.delta", {"type": "response.output_text.delta", "item_id": item_id,
                        "output_index": n, "content_index": 0, "delta": piece}))
                events.append(("response.output_text.done", {"type": "response.output_text.done", "item_id": item_id,
                    "output_index": n, "content_index": 0, "text": it.text}))
                item = {"type": "message", "id": item_id, "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": it.text, "annotations": []}]}
            elif isinstance(it, FunctionCall):
                call_id = it.call_id or f"call_lw_{index:03d}_{n}"
                args = it.arguments if isinstance(it.arguments, str) else json.dumps(it.arguments)
                item = {"type": "function_call", "id": f"fc_lw_{index:03d}_{n}", "call_id": call_id,
                        "name": it.name, "arguments": args, "status": "completed"}
                if it.namespace:
                    item["namespace"] = it.namespace
                events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": n,
                    "item": {**item, "arguments": "", "status": "in_progress"}}))
                for piece in split_chunks(args, self.chunks):
                    events.append(("response.function_call_arguments.delta", {"type": "response.function_call_arguments.delta",
                        "item_id": item["id"], "output_index": n, "delta": piece}))
                events.append(("response.function_call_arguments.done", {"type": "response.function_call_arguments.done",
                    "item_id": item["id"], "output_index": n, "arguments": args}))
            elif isinstance(it, CustomToolCall):
                call_id = it.call_id or f"call_lw_{index:03d}_{n}"
                item = {"type": "custom_tool_call", "id": f"ctc_lw_{index:03d}_{n}", "call_id": call_id,
                        "name": it.name, "input": it.input, "status": "completed"}
                events.append(("response.output_item.added", {"type": "response.output_item.added", "output_index": n,
                    "item": {**item, "input": "", "status": "in_progress"}}))
                for piece in split_chunks(it.input, self.chunks):
                    events.append(("response.custom_tool_call_input.delta", {"type": "response.custom_tool_call_input.delta",
                        "item_id": item["id"], "output_index": n, "delta": piece}))
                events.append(("response.custom_tool_call_input.done", {"type": "response.custom_tool_call_input.done",
                    "item_id": item["id"], "output_index": n, "input": it.input}))
            else:  # pragma: no cover - as_turn guards this
                raise TypeError(f"unknown item {it!r}")
            events.append(("response.output_item.done", {"type": "response.output_item.done", "output_index": n, "item": item}))
            done_items.append(item)
        in_tokens = max(1, len(rec.raw) // 4)
        out_tokens = max(1, len(json.dumps(done_items)) // 4)
        events.append(("response.completed", {"type": "response.completed", "response": {**base, "status": "completed",
            "output": done_items,
            "usage": {"input_tokens": in_tokens, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": in_tokens + out_tokens}}}))
        return 200, "text/event-stream; charset=utf-8", sse(events)
