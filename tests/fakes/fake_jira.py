"""A fake Jira (REST API v2, plus Cloud's v3 search/jql) for the real `jira` client.

Endpoints: GET serverInfo, GET myself, GET field, POST issue, GET issue/{key},
GET/POST issue/{key}/comment, GET/POST issue/{key}/transitions, GET search
(Server/DC) and GET/POST /rest/api/3/search/jql (Cloud). The workflow is
To Do → In Progress → Done. Cloud mode expects basic auth, Server mode a bearer
token; anything else gets 401.
"""
from __future__ import annotations

import base64
import itertools
import re

from . import LoopbackServer, Request, Response

STATUSES = {
    "To Do": {"name": "To Do", "statusCategory": {"key": "new"}},
    "In Progress": {"name": "In Progress", "statusCategory": {"key": "indeterminate"}},
    "Done": {"name": "Done", "statusCategory": {"key": "done"}},
}
FIELDS = [{"id": f, "key": f, "name": f.title(), "custom": False, "navigable": True, "searchable": True,
           "clauseNames": [f], "schema": {"type": "string", "system": f}}
          for f in ("summary", "description", "status", "project", "issuetype", "labels")]
TRANSITIONS = {  # from status → [(id, name, to)]
    "To Do": [("11", "Start Progress", "In Progress"), ("31", "Done", "Done")],
    "In Progress": [("21", "Stop Progress", "To Do"), ("31", "Done", "Done")],
    "Done": [("41", "Reopen", "To Do")],
}


class FakeJira(LoopbackServer):
    def __init__(self, cloud: bool = False, email: str = "bot@example.com", token: str = "jira-secret-token"):
        super().__init__()
        self.cloud = cloud
        self.expected_auth = ("Basic " + base64.b64encode(f"{email}:{token}".encode()).decode()) if cloud \
            else f"Bearer {token}"
        self.issues: dict[str, dict] = {}     # key → {"fields": {...}, "comments": [...], "transitions": [...]}
        self._n = itertools.count(1)
        self._cid = itertools.count(100)

    def route(self, req: Request) -> str:
        """`METHOD path` with the issue key replaced by {key}, e.g. 'POST issue/{key}/comment'."""
        path = re.sub(r"^/rest/api/[23]/", "", req.path)
        path = re.sub(r"^issue/[A-Z][A-Z0-9]*-\d+", "issue/{key}", path)
        return f"{req.method} {path}"

    def comments(self, key: str) -> list[str]:
        return [c["body"] for c in self.issues[key]["comments"]]

    def handle(self, req: Request) -> Response:
        if req.headers.get("authorization") != self.expected_auth:
            return Response(401, {"errorMessages": ["You are not authenticated."]})
        route = self.route(req)
        m = re.match(r"^/rest/api/[23]/issue/([A-Z][A-Z0-9]*-\d+)", req.path)
        key = m.group(1) if m else None
        if key is not None and key not in self.issues:
            return Response(404, {"errorMessages": ["Issue does not exist or you do not have permission to see it."]})
        handler = {
            "GET serverInfo": self._server_info,
            "GET myself": lambda r, k: Response(200, {"name": "bot", "accountId": "acc-1", "displayName": "Bot"}),
            "POST issue": self._create,
            "GET issue/{key}": self._get_issue,
            "GET issue/{key}/comment": self._list_comments,
            "POST issue/{key}/comment": self._add_comment,
            "GET issue/{key}/transitions": self._list_transitions,
            "POST issue/{key}/transitions": self._do_transition,
            "GET field": lambda r, k: Response(200, FIELDS),
            "GET search": self._search,
            "GET search/jql": self._search,
            "POST search/jql": self._search,
        }.get(route)
        if handler is None:
            return Response(404, {"errorMessages": [f"fake jira: no route {route}"]})
        return handler(req, key)

    def _server_info(self, req, key) -> Response:
        return Response(200, {"baseUrl": self.url, "version": "9.12.0", "versionNumbers": [9, 12, 0],
                              "deploymentType": "Cloud" if self.cloud else "Server", "serverTitle": "Fake Jira"})

    def _issue_json(self, key: str) -> dict:
        return {"id": str(1000 + int(key.split("-")[1])), "key": key, "self": f"{self.url}/rest/api/2/issue/{key}",
                "fields": self.issues[key]["fields"]}

    def _create(self, req, key) -> Response:
        fields = req.params.get("fields") or {}
        project = (fields.get("project") or {}).get("key")
        if not project or not fields.get("summary") or not (fields.get("issuetype") or {}).get("name"):
            return Response(400, {"errors": {"summary": "required"}})
        key = f"{project}-{next(self._n)}"
        self.issues[key] = {"fields": {**fields, "status": STATUSES["To Do"]}, "comments": []}
        return Response(201, {"id": str(1000 + int(key.split("-")[1])), "key": key,
                              "self": f"{self.url}/rest/api/2/issue/{key}"})

    def _get_issue(self, req, key) -> Response:
        return Response(200, self._issue_json(key))

    def _list_comments(self, req, key) -> Response:
        cs = self.issues[key]["comments"]
        return Response(200, {"startAt": 0, "maxResults": len(cs), "total": len(cs), "comments": cs})

    def _add_comment(self, req, key) -> Response:
        c = {"id": str(next(self._cid)), "body": req.params.get("body"), "author": {"name": "bot"}}
        self.issues[key]["comments"].append(c)
        return Response(201, c)

    def _list_transitions(self, req, key) -> Response:
        status = self.issues[key]["fields"]["status"]["name"]
        return Response(200, {"transitions": [{"id": i, "name": n, "to": STATUSES[to]}
                                              for i, n, to in TRANSITIONS[status]]})

    def _do_transition(self, req, key) -> Response:
        tid = (req.params.get("transition") or {}).get("id")
        status = self.issues[key]["fields"]["status"]["name"]
        for i, _, to in TRANSITIONS[status]:
            if i == str(tid):
                self.issues[key]["fields"]["status"] = STATUSES[to]
                return Response(204, b"")
        return Response(400, {"errorMessages": [f"transition {tid} is not valid from {status}"]})

    def _search(self, req, key) -> Response:
        issues = [self._issue_json(k) for k in reversed(self.issues)]   # newest first, JQL not evaluated
        if req.path.endswith("search/jql"):
            return Response(200, {"issues": issues, "isLast": True})
        return Response(200, {"startAt": 0, "maxResults": 50, "total": len(issues), "issues": issues})
