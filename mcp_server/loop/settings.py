"""Operational settings: budgets, campaign, schedules, connectors, webhook server, executor.

They are the human's, so they live in the state directory (`settings.toml`, 0600),
outside the workspace the agent can write, and change only through
`loopwright config set|unset|edit` (validated with the same pydantic models as
loopwright.toml). A connector's endpoint (`[slack] base_url`, `[jira] server`) and
the *names* of its token variables come from here only: an edit of the workspace's
loopwright.toml cannot point a token at another host. Being outside git, they
survive baseline, discard, crash and revert; the loop re-reads the file (by
mtime) on every check, so a change takes effect at the next one.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, ValidationError, field_validator

from mcp_server.loop import config as cfgmod
from mcp_server.loop.config import (
    BudgetConfig,
    CampaignConfig,
    ConfigError,
    ExecutorConfig,
    JiraConfig,
    ScheduleConfig,
    SlackConfig,
    WebhookConfig,
    tomllib,
)

SETTINGS_NAME = "settings.toml"
_HEADER = ("# loopwright operational settings (budgets, schedules, connectors).\n"
           "# Change them with `loopwright config set KEY VALUE` (or `loopwright config edit`); the loop\n"
           "# reads this file at every check. Secrets are never stored here, only env variable NAMES.\n\n")


class SettingsError(ConfigError):
    """A settings problem, phrased as what to do."""


class Settings(cfgmod.Section):
    campaign: CampaignConfig = Field(default_factory=CampaignConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    schedule: list[ScheduleConfig] = Field(default_factory=list)
    slack: Optional[SlackConfig] = None
    jira: Optional[JiraConfig] = None
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)

    @field_validator("slack", "jira", "webhook")
    @classmethod
    def _connector(cls, v: Any) -> Any:
        """Values that cannot work, checked here (what the loop uses) and not in loopwright.toml's models
        (copies there are ignored): *_env must name a variable, never hold the secret; the hosts a token
        goes to must be http(s) URLs, https unless on this machine."""
        if v is None:
            return v
        for name in type(v).model_fields:
            value = getattr(v, name)
            if name.endswith("_env"):
                cfgmod.check_env_name(name, value)
            elif name in ("base_url", "server") and value is not None:
                cfgmod.check_token_url(name, value)
        return v


def validate(data: dict, where: str = SETTINGS_NAME) -> Settings:
    try:
        return Settings.model_validate(data)
    except ValidationError as e:
        raise SettingsError(cfgmod.format_error(where, e).replace(
            "(see docs/configuration.md)", "(`loopwright config show` lists the keys)")) from None


def data_of(s: Settings) -> dict:
    return s.model_dump(mode="json", exclude_none=True)


def to_text(s: Settings) -> str:
    return _HEADER + cfgmod.toml_text(data_of(s))


def parse(text: str, where: str = SETTINGS_NAME, hint: bool = True) -> Settings:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{where}: not valid TOML ({e})" + (
            "; fix it by hand in an editor, or with `loopwright config edit` (it opens the file as it is and "
            "saves it once valid)" if hint else "")) from None
    return validate(data, where)


_CACHE: dict[str, tuple[tuple[int, int, int], Settings]] = {}


def load(path: Path) -> Settings:
    """The settings at `path` (defaults when the file does not exist yet)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return Settings()
    key = (st.st_mtime_ns, st.st_size, st.st_ctime_ns)
    hit = _CACHE.get(str(path))
    if hit and hit[0] == key:
        return hit[1]
    s = parse(path.read_text(encoding="utf-8"), str(path))
    _CACHE[str(path)] = (key, s)
    return s


def stat_key(path: Path) -> Optional[tuple[int, int, int]]:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ctime_ns)


def save(path: Path, s: Settings) -> None:
    """Atomic write, owner-only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".settings.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(to_text(s))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _CACHE.pop(str(path), None)


# -- keys ------------------------------------------------------------------------

def keys() -> list[str]:
    """Every settable dotted key (sections as a whole are settable too)."""
    out = []
    for name, field in Settings.model_fields.items():
        model = _model_of(field.annotation)
        if name == "schedule":
            out.append("schedule")
            out += [f"schedule.N.{k}" for k in ScheduleConfig.model_fields]
        elif model is not None:
            out += [f"{name}.{k}" for k in model.model_fields]
    return out


def _model_of(annotation: Any):
    for cand in (CampaignConfig, BudgetConfig, SlackConfig, JiraConfig, WebhookConfig, ExecutorConfig):
        if annotation is cand or cand in getattr(annotation, "__args__", ()):
            return cand
    return None


def _split(key: str) -> list[Any]:
    parts: list[Any] = []
    for p in key.strip().split("."):
        if not p:
            raise SettingsError(f"bad key {key!r}: use dotted names such as budget.max_experiments")
        parts.append(int(p) if p.isdigit() else p)
    if not parts or parts[0] not in Settings.model_fields:
        raise SettingsError(f"unknown key {key!r}: sections are {', '.join(Settings.model_fields)}; "
                            "`loopwright config show --keys` lists every key")
    return parts


def _known(parts: list[Any]) -> bool:
    shape = ".".join("N" if isinstance(p, int) else str(p) for p in parts)
    return shape in Settings.model_fields or shape in keys()


def get(s: Settings, key: str) -> Any:
    cur: Any = s.model_dump(mode="json")
    parts = _split(key)
    if not _known(parts):
        raise SettingsError(f"unknown key {key!r}; `loopwright config show --keys` lists every key")
    for p in parts:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            raise SettingsError(f"{key!r} is not set (`loopwright config show` prints the settings)") from None
    return cur


def parse_value(raw: str) -> Any:
    """A TOML value (4, 2.5, true, "x", [..], {..}); anything else is taken as a plain string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def set_value(s: Settings, key: str, raw: str) -> Settings:
    parts = _split(key)
    value = parse_value(raw)
    where = key    # not the value: it may be a secret pasted where its variable's name belongs
    try:
        return validate(_assign(data_of(s), parts, value, key), where)
    except SettingsError as first:
        if isinstance(value, str):
            raise
        # `set slack.channel 123`: a number where a string belongs
        try:
            return validate(_assign(data_of(s), parts, raw, key), where)
        except SettingsError:
            raise first from None


def unset(s: Settings, key: str) -> Settings:
    """Back to the default (a whole optional section such as [slack] is removed)."""
    parts = _split(key)
    data = data_of(s)
    parent: Any = data
    for p in parts[:-1]:
        try:
            parent = parent[p]
        except (KeyError, IndexError, TypeError):
            return s
    try:
        del parent[parts[-1]]
    except (KeyError, IndexError, TypeError):
        return s
    return validate(data, f"unset {key}")


def _assign(data: dict, parts: list[Any], value: Any, key: str) -> dict:
    cur: Any = data
    for i, p in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(cur, list):
            if not isinstance(p, int) or p > len(cur):
                raise SettingsError(f"{key!r}: index {p} is out of range (there are {len(cur)} entries; "
                                    f"use {len(cur)} to add one)")
            if p == len(cur):
                cur.append({})
            cur = cur[p]
            continue
        if p not in cur or cur[p] is None:
            cur[p] = [] if isinstance(nxt, int) else {}
        cur = cur[p]
    last = parts[-1]
    if isinstance(cur, list):
        if not isinstance(last, int) or last > len(cur):
            raise SettingsError(f"{key!r}: index {last} is out of range")
        if last == len(cur):
            cur.append(value)
        else:
            cur[last] = value
    else:
        cur[last] = value
    return data
