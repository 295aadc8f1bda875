"""Who may look and who may act.

- Binding: loopback only unless `--allow-remote` is given, and then only with a login password from the
  environment (LOOPWRIGHT_DASHBOARD_PASSWORD; HTTP Basic on every request). Never from a file or a flag.
- Acting (every POST): the token printed at start, in the form (the page's script copies it there from the
  browser's storage for this origin); an Origin (or Referer) naming this server; no cross-site
  Sec-Fetch-Site; and a Host this server answers to (DNS rebinding).
- The printed URL carries the token in its fragment (`/#token=...`), which browsers never send to a server.
  The page keeps it in localStorage, which is private to this origin (scheme, host and port). It is never a
  cookie: a browser sends cookies to every port of a host, so any other local web server (one an agent
  started, say) would receive it.
The token lives in this process's memory only: not on disk, not in the ledger, not in any agent's env.
"""
from __future__ import annotations

import base64
import hmac
import ipaddress
import os
import secrets
from dataclasses import dataclass, field
from typing import Mapping, Optional
from urllib.parse import urlsplit

PASSWORD_ENV = "LOOPWRIGHT_DASHBOARD_PASSWORD"


class AuthError(ValueError):
    """A refused configuration, said as what to do."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Guard:
    host: str
    port: int
    token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    password: Optional[str] = None         # set: every request needs HTTP Basic with it (remote binding)
    read_only: bool = False

    @classmethod
    def for_binding(cls, host: str, port: int, allow_remote: bool, read_only: bool,
                    env: Mapping[str, str] = os.environ) -> "Guard":
        if is_loopback(host):
            return cls(host, port, read_only=read_only)
        if not allow_remote:
            raise AuthError(f"--host {host} is not a loopback address: anyone who can reach it could see the "
                            "campaign. Keep the default (127.0.0.1) and use an SSH tunnel, or pass --allow-remote "
                            f"with a login password in ${PASSWORD_ENV}")
        password = env.get(PASSWORD_ENV) or ""
        if len(password) < 12:
            raise AuthError(f"--allow-remote needs a login: set ${PASSWORD_ENV} to a password of at least 12 "
                            "characters (it is read from the environment only, never stored)")
        return cls(host, port, read_only=read_only, password=password)

    def token_matches(self, given: str) -> bool:
        return hmac.compare_digest((given or "").encode(), self.token.encode())

    # -- every request --------------------------------------------------------------------------
    def allowed_hosts(self) -> set[str]:
        names = {"127.0.0.1", "localhost", "[::1]"} if is_loopback(self.host) else {self.host}
        return {f"{n}:{self.port}" for n in names} | ({*names} if self.port in (80, 443) else set())

    def host_problem(self, headers: Mapping[str, str]) -> Optional[str]:
        if self.host in ("0.0.0.0", "::"):       # all interfaces: the login is the gate, any name may be used
            return None
        got = headers.get("host", "")
        if got not in self.allowed_hosts():
            return f"Host {got!r} is not this dashboard ({', '.join(sorted(self.allowed_hosts()))})"
        return None

    def login_problem(self, headers: Mapping[str, str]) -> Optional[str]:
        if self.password is None:
            return None
        scheme, _, value = headers.get("authorization", "").partition(" ")
        try:
            _, _, given = base64.b64decode(value).decode("utf-8").partition(":")
        except ValueError:
            given = ""
        if scheme.lower() == "basic" and hmac.compare_digest(given.encode(), self.password.encode()):
            return None
        return "log in (any user name, the password in $" + PASSWORD_ENV + ")"

    # -- state-changing requests ----------------------------------------------------------------
    def action_problem(self, headers: Mapping[str, str], form_token: str) -> Optional[str]:
        """Why a POST is refused, or None. Cross-site checks come first: a foreign page learns nothing else."""
        if self.read_only:
            return "this dashboard is read-only (started with --read-only); decide with `loopwright approve`"
        origin = headers.get("origin") or ""
        if not origin or origin == "null":
            ref = headers.get("referer") or ""
            origin = "" if not ref else f"{urlsplit(ref).scheme}://{urlsplit(ref).netloc}"
        if not origin:
            return "the request names no Origin: a decision must come from the dashboard's own page"
        if urlsplit(origin).netloc != headers.get("host", ""):
            return f"cross-site request refused: Origin {origin} is not this dashboard"
        if headers.get("sec-fetch-site") not in (None, "same-origin", "none"):
            return f"cross-site request refused (Sec-Fetch-Site: {headers.get('sec-fetch-site')})"
        if not form_token:
            return ("no dashboard token: open the URL `loopwright dashboard` printed at start (it carries the "
                    "token) in this browser, then try again")
        if not self.token_matches(form_token):
            return ("wrong dashboard token (the dashboard was restarted?): open the URL it printed at start, "
                    "then try again")
        return None
