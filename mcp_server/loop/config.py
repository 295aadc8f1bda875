"""The workspace configuration, validated by pydantic.

Two kinds of settings, kept in two places:
- frozen ones ([benchmark], [paths], [noise]) decide the score; they live in the
  workspace's loopwright.toml, their canonical hash is part of the frozen
  manifest, so changing them mid-campaign is tamper;
- operational ones ([campaign], [budget], [[schedule]], [slack], [jira],
  [webhook], [executor]) are the human's: they live in the state directory's settings.toml,
  out of the agent's reach, changed with `loopwright config set` (settings.py).
  Copies of them found in loopwright.toml (old workspaces) are imported once and
  then ignored with a warning.
Secrets never appear in either file: only the *names* of environment variables.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Literal, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CONFIG_NAME = "loopwright.toml"
FROZEN_SECTIONS = ("benchmark", "paths", "noise", "target")   # [target]: only in a target workspace
# Fields of the frozen sections added after the first release, in the order they were added (append only).
# A workspace made before one existed has a lock whose hash never saw it (and a pinned loopwright.toml
# without it): at its default, the integrity check must not call that tampering after an upgrade.
LATE_FROZEN_FIELDS: tuple[tuple[str, str], ...] = (
    ("noise", "sigma_prior"), ("noise", "prior_pairs"), ("noise", "rotate_every"), ("noise", "early_stop"),
    ("benchmark", "clock"), ("benchmark", "budget_tokens"), ("noise", "large_effect_sigmas"),
    ("noise", "first_seed"), ("noise", "pairs"), ("noise", "min_pairs"), ("noise", "max_pairs"),
    ("noise", "spread_alpha"),
)
OPERATIONAL_SECTIONS = ("campaign", "budget", "schedule", "slack", "jira", "webhook", "executor")


class ConfigError(ValueError):
    """A loopwright.toml problem, phrased as what to fix."""


class Section(BaseModel):
    """Base of every config section: an unknown key is an error, not silently ignored."""
    model_config = ConfigDict(extra="forbid")


def tag_problem(tag: str) -> Optional[str]:
    """Why `tag` cannot name a campaign (its branch is loopwright/<tag>; git's ref-name rules), or None."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", tag or ""):
        return (f"campaign tag {tag!r} is not allowed: use 1 to 64 letters, digits, '.', '_' or '-' "
                "(it names the branch loopwright/<tag>), e.g. --tag lr-sweep-2")
    if tag.startswith(".") or tag.endswith(".") or ".." in tag or tag.endswith(".lock"):
        return (f"campaign tag {tag!r} cannot name a git branch (loopwright/{tag}): git refuses names that start "
                "or end with '.', contain '..' or end with '.lock'; e.g. --tag lr-sweep-2")
    return None


class CampaignConfig(Section):
    tag: str = Field(default="main")

    @field_validator("tag")
    @classmethod
    def _valid_tag(cls, v: str) -> str:
        problem = tag_problem(v)
        if problem:
            raise ValueError(problem)
        return v

    agent: Literal["claude", "codex", "builtin"] = "builtin"
    # the autonomy slider (operational: the human's to change): who closes each cycle
    autonomy: Literal["closed", "approve-keeps", "approve-runs"] = "closed"
    keep_timeout_hours: Optional[float] = Field(default=24.0, gt=0, description="a keep waiting longer is rejected")
    run_timeout_hours: Optional[float] = Field(default=24.0, gt=0, description="a run waiting longer is rejected")
    max_waiting: int = Field(default=3, ge=1, description="the agent may stop once this many keeps wait on a person")
    slack_approvers: list[str] = Field(default_factory=list, description="Slack user ids allowed to decide")
    jira_approvers: list[str] = Field(default_factory=list, description="Jira accountIds (or names) allowed to decide")


CPU_WALL_FACTOR = 4.0   # = bench/gpt/prepare.py's: cpu/steps clocks get this many budgets of wall clock


# anything else is a PATH to the user's text. stdlib-hidden (the default): val/test are stdlib modules that
# train.py's sandbox hides (bench/gpt/prepare.py HELDOUT_STDLIB); stdlib: val/test any Python can read
NAMED_CORPORA = ("stdlib-hidden", "stdlib", "tinystories", "climbmix")
DEFAULT_CORPUS = "stdlib-hidden"


class BenchmarkConfig(Section):
    time_budget: float = Field(default=30.0, gt=0, le=24 * 3600, description="training seconds per experiment")
    grace_seconds: float = Field(default=60.0, ge=0, description="startup/export/eval allowance before the hard kill")
    # The budget clock (read by prepare.py's TrainingBudget): wall seconds, the run's own CPU seconds, or a
    # fixed number of training tokens; auto = cpu without a GPU, wall with one.
    clock: Literal["auto", "wall", "cpu", "steps"] = "auto"
    budget_tokens: int = Field(default=204_800, ge=1, description="training tokens per run on the steps clock")
    seq_len: int = Field(default=256, ge=8, le=65536)
    eval_tokens: int = Field(default=131072, ge=1024)
    metric: Literal["val_bpb"] = "val_bpb"
    corpus: str = DEFAULT_CORPUS
    tokenizer: Literal["byte", "bpe"] = "byte"
    eval_timeout: float = Field(default=600.0, gt=0)

    @field_validator("clock", mode="before")
    @classmethod
    def _known_clock(cls, v: object) -> object:
        if v not in ("auto", "wall", "cpu", "steps"):
            raise ValueError(f"clock {v!r} is not a budget clock; use \"wall\" (seconds of wall clock), \"cpu\" "
                             "(the run's own CPU seconds), \"steps\" (budget_tokens training tokens) or \"auto\" "
                             "(cpu without a GPU, wall with one)")
        return v

    def hard_limit_seconds(self) -> float:
        """Wall-clock seconds after which the runner kills train.py (prepare.hard_limit_seconds()):
        budget + grace on the wall clock; CPU_WALL_FACTOR budgets + grace on the others, which do
        not advance while other jobs hold the CPU (auto: the larger, the device being unknown here)."""
        factor = 1.0 if self.clock == "wall" else CPU_WALL_FACTOR
        return factor * self.time_budget + self.grace_seconds


NOISE_KINDS = ("seeded", "repeat", "deterministic")


class TargetConfig(Section):
    """A user's own target (docs/targets.md): the commands that build, gate and score a candidate. Frozen: the
    evaluator's command is as much a part of the score as its file. A leading `python` is the interpreter
    loopwright runs on; commands are split like a shell would (shlex), never run through one."""
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    run: str = Field(min_length=1, description="the candidate's command, sandboxed, on the committed tree")
    gate: Optional[str] = Field(default=None, description="a correctness command run first; failing = discard")
    evaluate: str = Field(min_length=1, description="the frozen scorer: prints one JSON line {ok, metric, ...}")
    metric: str = Field(default="metric", min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    direction: Literal["minimize", "maximize"] = "minimize"
    noise: Literal["seeded", "repeat", "deterministic"] = Field(default="seeded", description=(
        "seeded: the run reads LOOPWRIGHT_SEED (paired seeds); repeat: independent repeats, candidate and "
        "reference interleaved; deterministic: the metric never varies (a keep needs noise.min_delta)"))
    time_budget: float = Field(default=60.0, gt=0, le=24 * 3600, description="wall seconds each command may run")

    @field_validator("run", "gate", "evaluate")
    @classmethod
    def _splits(cls, v: Optional[str]) -> Optional[str]:
        import shlex

        if v is None:
            return v
        try:
            argv = shlex.split(v)
        except ValueError as e:
            raise ValueError(f"command {v!r} does not split into words ({e}); quote it as a shell would") from None
        if not argv:
            raise ValueError("the command is empty; give the program and its arguments, e.g. \"python harness.py\"")
        return v

    def sign(self) -> float:
        """The loop minimises: a maximised metric is stored negated, and shown with its own sign."""
        return -1.0 if self.direction == "maximize" else 1.0


class PathsConfig(Section):
    editable: list[str] = Field(default_factory=lambda: ["train.py"], min_length=1)
    frozen: list[str] = Field(default_factory=lambda: [
        "prepare.py", "evaluate.py", "pt2audit.py", "program.md", "loopwright.toml", "loopwright.lock", "AGENTS.md",
        "CLAUDE.md", ".mcp.json", ".claude/**", ".codex/**", ".gitignore", ".git/**",
    ])
    hidden: list[str] = Field(default_factory=lambda: [".loopwright/data/test.bin"])
    state_dir: str = ".loopwright"

    @field_validator("editable", "frozen", "hidden")
    @classmethod
    def _relative(cls, v: list[str]) -> list[str]:
        for p in v:
            if p.startswith("/") or ".." in Path(p).parts:
                raise ValueError(f"path {p!r} must be relative to the workspace and must not contain '..'")
        return v

    @model_validator(mode="after")
    def _editable_not_frozen(self) -> "PathsConfig":
        both = set(self.editable) & set(self.frozen)
        if both:
            raise ValueError(f"{sorted(both)} listed as both editable and frozen; keep each path in one list")
        return self


class NoiseConfig(Section):
    baseline_seeds: int = Field(default=3, ge=1, le=50)
    k_sigma: float = Field(default=2.0, ge=0)
    min_delta: float = Field(default=0.002, ge=0)
    sigma_floor: float = Field(default=0.0005, ge=0)
    retest_band: float = Field(default=0.5, ge=0, lt=1,
                               description="gains in [(1-band)*threshold, threshold) get a retest verdict")
    max_confirms: int = Field(default=2, ge=1, le=10)
    # paired verdicts (mcp_server/loop/verdict.py)
    # Measured on the bundled benchmark at the demo's cost (100 steps; BENCHMARKS.md "What a pair's noise
    # is"): 0.06 for the one-constant changes an agent tries. A gentle late-schedule change had shown
    # 0.008-0.019, and a prior that low kept about one null change in five before the campaign's own
    # pairs took over; too high costs power only until they do.
    sigma_prior: float = Field(default=0.06, ge=0, description="prior SD of a paired difference (bits/byte)")
    prior_pairs: float = Field(default=3.0, ge=0, description="how many pairs' worth of evidence the prior is")
    rotate_every: int = Field(default=6, ge=0, description="candidates per seed set before a fresh one (0 = never)")
    first_seed: int = Field(default=1001, ge=0, le=2**31 - 1,
                            description="the campaign's first seed; each fresh seed set continues after the highest used")
    early_stop: bool = Field(default=True, description="fixed pairs: stop after the first pair when it is "
                               "clearly worse (adaptive pairs stop by their own test)")
    large_effect_sigmas: float = Field(
        default=5.0, ge=0, description="comparisons whose mean paired difference is beyond this many sigma_d are "
        "left out of sigma_d (0 = none): a big effect's spread over seeds says how that effect varies with the "
        "seed, not how noisy the measurement of a small change is")
    spread_alpha: float = Field(
        default=0.0, ge=0, lt=0.5, description="a keep also needs the candidate's own pairs to clear a one-sided t "
        "test at this level (their own spread, at least 2 pairs; 0 = off; adaptive pairs test at 2/3 of it after each "
        "pair): a change noisier than "
        "sigma_d is not kept on the pooled sigma_d alone (sequential.spread_bound). Off by default: it makes a low "
        "sigma_prior safe, so a benchmark's noise.toml that declares one sets it with it (0.015 for bench/gpt)")
    # adaptive pairs (mcp_server/loop/sequential.py). The default stays "fixed" so that a workspace made before
    # this field existed keeps the verdict rule its lock was made for (BENCHMARKS.md "Adaptive pairs" compares them).
    pairs: Literal["adaptive", "fixed"] = Field(default="fixed", description=(
        "adaptive: a sequential test after each pair, more pairs only while the call is close (up to max_pairs); "
        "fixed: the whole seed set, then retests near the bar"))
    min_pairs: int = Field(default=1, ge=1, le=50, description="adaptive pairs: pairs before any verdict")
    max_pairs: int = Field(default=6, ge=1, le=50, description="adaptive pairs: the most pairs a candidate "
                           "gets (the seed set, then fresh-seed confirm pairs); the test decides at this many")

    @model_validator(mode="after")
    def _pairs_bounds(self) -> "NoiseConfig":
        if self.min_pairs > self.max_pairs:
            raise ValueError(f"noise.min_pairs ({self.min_pairs}) is more than noise.max_pairs ({self.max_pairs}); "
                             "set min_pairs <= max_pairs (e.g. min_pairs = 1, max_pairs = 6)")
        if self.pairs == "adaptive" and self.spread_alpha > 0 and self.max_pairs < 3:
            raise ValueError(f"noise.spread_alpha ({self.spread_alpha:g}) needs noise.max_pairs >= 3 under adaptive "
                             f"pairs (it is {self.max_pairs}): a keep must clear a t test on its own pairs, which "
                             "one or two pairs almost never do; raise max_pairs (default 6) or set spread_alpha = 0")
        return self


class BudgetConfig(Section):
    max_experiments: Optional[int] = Field(default=50, ge=1, description=(
        "training runs, not experiments (the name is kept): an experiment is one run per seed, plus confirm runs"))
    max_hours: Optional[float] = Field(default=8.0, gt=0)
    max_cost_usd: Optional[float] = Field(default=20.0, ge=0)
    target_metric: Optional[float] = None


class ScheduleConfig(Section):
    cron: str
    agent: Literal["claude", "codex", "builtin"] = "claude"
    level: Literal["inner", "outer"] = Field(default="inner", description="outer: a session that improves the "
                                             "search mechanisms (launch --level outer)")
    timezone: str = "UTC"
    max_session_minutes: float = Field(default=120, gt=0)
    grace_minutes: float = Field(default=60, ge=0, description="a missed fire older than this is skipped")

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, v: str) -> str:
        from croniter import croniter

        if len(v.split()) != 5 or not croniter.is_valid(v, strict=True):
            raise ValueError(f"{v!r} is not a valid 5-field cron expression (e.g. '0 1 * * *' = 01:00 daily)")
        return v

    @field_validator("timezone")
    @classmethod
    def _valid_tz(cls, v: str) -> str:
        from zoneinfo import ZoneInfo

        try:
            ZoneInfo(v)
        except Exception:
            raise ValueError(f"unknown timezone {v!r}; use an IANA name such as 'UTC' or 'Europe/Berlin'") from None
        return v


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOKEN_PREFIX = re.compile(r"^(xox[a-z]-|xapp-|ghp_|gho_|ghs_|github_pat_|glpat-|sk-|ATATT)")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")


def looks_like_token(value: str) -> bool:
    """A secret pasted where the *name* of its environment variable belongs (Slack xoxb-/xoxp-/xapp- and
    other known prefixes, or a long random-looking string; a variable name is short words in one case)."""
    v = str(value).strip()
    if _TOKEN_PREFIX.match(v):
        return True
    if len(v) < 20:
        return False
    mixed = bool(re.search(r"[a-z]", v) and re.search(r"[A-Z]", v) and re.search(r"[0-9]", v))
    return mixed or (len(v) >= 32 and bool(re.search(r"[a-z]", v) and re.search(r"[0-9]", v)))


def check_env_name(key: str, value: str) -> str:
    if looks_like_token(value):
        raise ValueError(f"{key} looks like a token, not the name of an environment variable: secrets are never "
                         "stored in the settings. Export the token (e.g. `export SLACK_BOT_TOKEN=...` where "
                         f"loopwright runs) and set {key} to the variable's NAME")
    if not _ENV_NAME.match(value or ""):
        raise ValueError(f"{key} must be the name of an environment variable (letters, digits and _, not "
                         f"starting with a digit, e.g. SLACK_BOT_TOKEN); got {value!r}")
    return value


def check_token_url(key: str, value: str) -> str:
    """A URL a token is sent to: http(s) with a host; https unless the host is this machine."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(value.strip())
        host = u.hostname
    except ValueError:
        host, u = None, None
    if u is None or u.scheme not in ("http", "https") or not host:
        raise ValueError(f"{key} {value!r} is not an http(s) URL with a host (e.g. https://slack.example.com/api/)")
    if u.scheme == "http" and host not in LOOPBACK_HOSTS:
        raise ValueError(f"{key} {value!r} is plain http: the token would travel unencrypted; use https (plain "
                         f"http only for a server on this machine: {', '.join(LOOPBACK_HOSTS)})")
    return value


class SlackConfig(Section):
    channel: Optional[str] = None
    token_env: str = "SLACK_BOT_TOKEN"
    webhook_url_env: str = "SLACK_WEBHOOK_URL"
    base_url: Optional[str] = None  # override for tests / Slack-compatible servers
    upload_plot: bool = True
    crash_streak: int = Field(default=3, ge=1)


class JiraConfig(Section):
    server: str
    project: str
    auth: Literal["cloud", "token"] = "cloud"
    email_env: str = "JIRA_EMAIL"
    token_env: str = "JIRA_API_TOKEN"
    issue_type: str = "Task"
    done_transition: str = "Done"


class WebhookConfig(Section):
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=1, le=65535)
    github_secret_env: str = "LOOPWRIGHT_GITHUB_SECRET"
    slack_signing_secret_env: str = "SLACK_SIGNING_SECRET"
    jira_secret_env: str = "LOOPWRIGHT_JIRA_SECRET"
    generic_secret_env: str = "LOOPWRIGHT_WEBHOOK_SECRET"
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    timestamp_window_s: int = Field(default=300, ge=10)
    agent: Literal["claude", "codex", "builtin"] = "claude"


_RAY_ADDRESS = re.compile(r"^(auto|local|(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5})$")


class ExecutorConfig(Section):
    """Where runs happen (operational: the cluster's address and the parallelism are the human's, not the
    score's -- results on the `steps` clock do not depend on them). `loopwright config set executor.kind ray`."""
    kind: Literal["local", "ray"] = Field(default="local", description="local: this machine; ray: a Ray cluster")
    parallel: int = Field(default=1, ge=1, le=1024, description="runs in flight at once (asynchronous experiments, "
                          "paired seeds, references)")
    address: str = Field(default="auto", description='ray only: "auto" (the cluster this machine belongs to), '
                         '"ray://host:port" (Ray Client) or "host:port" (the head\'s GCS address)')
    num_cpus: float = Field(default=1.0, ge=0, description="ray only: CPUs per run")
    num_gpus: float = Field(default=0.0, ge=0, description="ray only: GPUs per run (1 = one GPU per experiment)")
    memory: Optional[int] = Field(default=None, ge=1 << 20, description="ray only: bytes of memory per run")

    @field_validator("address")
    @classmethod
    def _address(cls, v: str) -> str:
        if not _RAY_ADDRESS.match(v.strip()):
            raise ValueError(f"address {v!r} is not a Ray address; use \"auto\", \"ray://host:port\" or \"host:port\"")
        return v.strip()


class LoopwrightConfig(Section):
    campaign: CampaignConfig = Field(default_factory=CampaignConfig)
    benchmark: BenchmarkConfig = Field(default_factory=BenchmarkConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    noise: NoiseConfig = Field(default_factory=NoiseConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    schedule: list[ScheduleConfig] = Field(default_factory=list)
    slack: Optional[SlackConfig] = None
    jira: Optional[JiraConfig] = None
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    target: Optional[TargetConfig] = None    # None: the bundled GPT benchmark

    def frozen_hash(self, leave_out: Sequence[tuple[str, str]] = ()) -> str:
        """SHA-256 of the score-deciding sections, canonical JSON (whitespace/comments don't matter);
        leave_out: (section, field) pairs not hashed."""
        # [target] is hashed only where there is one: a GPT workspace's hash is what its lock recorded
        data = {name: getattr(self, name).model_dump(mode="json") for name in FROZEN_SECTIONS
                if getattr(self, name) is not None}
        for section, name in leave_out:
            data[section].pop(name, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def frozen_hashes(self) -> set[str]:
        """The hashes a lock may hold for this configuration: today's, and the one an older loopwright wrote
        before the last k LATE_FROZEN_FIELDS existed -- only while every one of those is at its default."""
        out = {self.frozen_hash()}
        for k in range(len(LATE_FROZEN_FIELDS) - 1, -1, -1):
            late = LATE_FROZEN_FIELDS[k:]
            section, name = late[0]
            sect = getattr(self, section)
            if getattr(sect, name) != type(sect).model_fields[name].get_default(call_default_factory=True):
                break   # set by the workspace's own toml: it was made when this field existed
            out.add(self.frozen_hash(late))
        return out


def format_error(path: Path | str, err: ValidationError) -> str:
    """A pydantic ValidationError as one readable message: the file, then each bad key and why."""
    lines = [f"{path}: invalid configuration ({err.error_count()} problem(s)):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check the spelling (see docs/configuration.md)"
        elif e["type"] == "missing":
            msg = "required key is missing; add it"
        lines.append(f"  - {key}: {msg}")
    return "\n".join(lines)


def parse_config(text: str, path: Path | str = CONFIG_NAME) -> LoopwrightConfig:
    path = Path(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the syntax or restore it with "
                          f"`git checkout <pinned> -- {path.name}`") from None
    try:
        return LoopwrightConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_error(path, e)) from None


_CACHE: dict[str, tuple[tuple[int, int, int], LoopwrightConfig]] = {}


def load_config(root: Path | str) -> LoopwrightConfig:
    path = Path(root) / CONFIG_NAME
    try:
        st = path.stat()
    except OSError:
        raise ConfigError(f"{path} not found; is {root} a loopwright workspace? "
                          "Create one with `loopwright init DIR`") from None
    # The server opens the config on every tool call: re-parse only when the file changed.
    key = (st.st_mtime_ns, st.st_size, st.st_ctime_ns)
    hit = _CACHE.get(str(path))
    if hit and hit[0] == key:
        return hit[1].model_copy(deep=True)
    cfg = parse_config(path.read_text(encoding="utf-8"), path)
    _CACHE[str(path)] = (key, cfg)
    return cfg.model_copy(deep=True)


def toml_text(data: dict) -> str:
    """TOML for plain data, with None values and empty top-level lists dropped: TOML has no null, and an
    empty `schedule = []` would make a later `[[schedule]]` table invalid TOML (issue 15)."""
    import tomli_w

    def clean(v):
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if x is not None}
        if isinstance(v, list):
            return [clean(x) for x in v]
        return v

    # empty lists inside a section stay (`hidden = []` is not the default list); a top-level one (the array of
    # tables `schedule`) goes
    return tomli_w.dumps({k: clean(x) for k, x in data.items() if x is not None and x != []})


def dump_config(cfg: LoopwrightConfig, sections: tuple[str, ...] = FROZEN_SECTIONS) -> str:
    """TOML text for the given sections of a config (default: the frozen ones, what loopwright.toml holds)."""
    data = cfg.model_dump(mode="json", exclude_none=True)
    return toml_text({k: data[k] for k in sections if k in data})


def operational_data(text: str) -> dict:
    """The operational sections present in a loopwright.toml text ({} when none or unparsable)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return {}
    return {k: data[k] for k in OPERATIONAL_SECTIONS if k in data}
