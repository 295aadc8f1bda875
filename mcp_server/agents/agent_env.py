"""The environment a launched agent session gets: an allow-list, not this process's environment.

    agent_environment(agent, base=os.environ, cfg=None) -> dict

The launcher (cron, webhook, `loopwright launch`) holds the connector tokens (Slack, Jira) and the
webhook signing secrets; the agent's client, and everything it starts (its shell, the MCP server,
the hooks, train.py through the server), inherits what the client gets. So the client gets only:

- what any program needs: PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TERM, TZ,
  TMPDIR, the XDG_* directories (XDG_DATA_HOME also locates the loop's state), colour switches;
- network plumbing: the HTTP(S)/ALL/NO proxy variables, CA bundles (SSL_CERT_*, REQUESTS_CA_BUNDLE,
  CURL_CA_BUNDLE, NODE_EXTRA_CA_CERTS);
- the Python and accelerator setup the MCP server and the runs use: PYTHONPATH, PYTHONHOME,
  VIRTUAL_ENV, LD_LIBRARY_PATH, CUDA_* / NVIDIA_* / HIP_* / ROCR_*, thread counts, TORCH_* /
  PYTORCH_*, RAY_ADDRESS and other RAY_* (no secret-looking names among these);
- LOOPWRIGHT_* settings, except secret-looking names (KEY, TOKEN, SECRET, PASSWORD, ...);
- the client's own settings and credential: Claude Code: ANTHROPIC_*, CLAUDE_*, its documented
  DISABLE_* / MCP_* / BASH_* knobs, and AWS_* or GOOGLE_* / CLOUD_ML_REGION / VERTEX_* when it is
  configured for Bedrock or Vertex; Codex: OPENAI_*, CODEX_*, and the `env_key` its config.toml's
  model providers name; the built-in agent needs none;
- names the person lists in LOOPWRIGHT_CLIENT_ENV (comma-separated), for a client setting not
  covered above.

Whatever the rules above admit, the variables the loop's settings name for a connector or a
webhook (`[slack] token_env`, `[jira] email_env` / `token_env`, `[webhook] *_secret_env`, ...) and
their defaults are never passed.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

if TYPE_CHECKING:
    from mcp_server.loop.config import LoopwrightConfig

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE", re.I)
EXTRA_VAR = "LOOPWRIGHT_CLIENT_ENV"

_BASE = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "COLORTERM", "TZ", "TMPDIR",
         "NO_COLOR", "FORCE_COLOR", "http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTP_PROXY",
         "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
         "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED",
         "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
         "OPENBLAS_NUM_THREADS"}
# prefixes whose secret-looking names are still dropped
_BASE_PREFIXES = ("LC_", "XDG_", "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "TORCH_", "PYTORCH_", "RAY_", "LOOPWRIGHT_")
# the client's own: (prefixes passed whole: its API key is its credential, not a connector's;
# prefixes of its knobs, secret-looking names dropped; exact names)
_CLIENT = {
    "claude": (("ANTHROPIC_", "CLAUDE_"), ("DISABLE_", "MCP_", "BASH_"),
               {"IS_SANDBOX", "MAX_THINKING_TOKENS", "MAX_MCP_OUTPUT_TOKENS", "USE_BUILTIN_RIPGREP"}),
    "codex": (("OPENAI_", "CODEX_"), (), {"RUST_LOG"}),
}
# the connector and webhook variables, by their settings' defaults (the settings may rename them)
_CONNECTOR_DEFAULTS = {"SLACK_BOT_TOKEN", "SLACK_WEBHOOK_URL", "SLACK_SIGNING_SECRET", "JIRA_EMAIL",
                       "JIRA_API_TOKEN", "LOOPWRIGHT_GITHUB_SECRET", "LOOPWRIGHT_JIRA_SECRET",
                       "LOOPWRIGHT_WEBHOOK_SECRET"}


def connector_names(cfg: Optional[LoopwrightConfig] = None) -> set[str]:
    """The variable names that hold connector tokens or webhook secrets: the defaults plus every
    `*_env` field of the [slack], [jira] and [webhook] settings."""
    names = set(_CONNECTOR_DEFAULTS)
    for sec in ((cfg.slack, cfg.jira, cfg.webhook) if cfg is not None else ()):
        if sec is None:
            continue
        for key, value in sec.model_dump().items():
            if key.endswith("_env") and isinstance(value, str) and value:
                names.add(value)
    return names


def _codex_env_keys(base: Mapping[str, str]) -> set[str]:
    """The `env_key` of each model provider in Codex's config.toml: the API key Codex itself reads."""
    home = base.get("CODEX_HOME") or os.path.join(base.get("HOME") or os.path.expanduser("~"), ".codex")
    try:
        cfg = tomllib.loads(Path(home, "config.toml").read_text())
    except (OSError, ValueError):
        return set()
    providers = cfg.get("model_providers") if isinstance(cfg, dict) else None
    return {str(p["env_key"]) for p in (providers or {}).values() if isinstance(p, dict) and p.get("env_key")}


def _client_names(agent: str, base: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...], set[str]]:
    whole, knobs, exact = _CLIENT.get(agent, ((), (), set()))   # the built-in agent: none
    prefixes: tuple[str, ...] = tuple(whole)
    names = set(exact)
    if agent == "claude":
        if base.get("CLAUDE_CODE_USE_BEDROCK"):
            prefixes += ("AWS_",)
        if base.get("CLAUDE_CODE_USE_VERTEX"):
            prefixes += ("VERTEX_", "GOOGLE_", "CLOUD_ML_")
    elif agent == "codex":
        names |= _codex_env_keys(base)
    return prefixes, knobs, names


def agent_environment(agent: str, base: Optional[Mapping[str, str]] = None,
                      cfg: Optional[LoopwrightConfig] = None) -> dict[str, str]:
    """The allow-listed environment for a session of `agent` (see the module docstring)."""
    base = os.environ if base is None else base
    client_prefixes, knobs, client_names = _client_names(agent, base)
    filtered = _BASE_PREFIXES + knobs
    extra = {n.strip() for n in base.get(EXTRA_VAR, "").split(",") if n.strip()}
    never = connector_names(cfg)
    out: dict[str, str] = {}
    for name, value in base.items():
        if name in never:
            continue
        if name in client_names or name in extra or name.startswith(client_prefixes):
            out[name] = value
        elif name in _BASE or (name.startswith(filtered) and not SECRET_NAME.search(name)):
            out[name] = value
    return out
