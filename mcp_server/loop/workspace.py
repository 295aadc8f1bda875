"""Workspaces: `loopwright init DIR` and the paths inside one.

A workspace is a git repository whose first commit (the *pinned commit*) holds
the frozen evaluator, the editable train.py, the spec and the config. The
git-ignored `.loopwright/` directory holds the ledger, the data and the runs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from mcp_server.loop import config as cfgmod
from mcp_server.loop import gitops
from mcp_server.ledger.store import Ledger

LOCK_NAME = "loopwright.lock"   # committed manifest of what decides the score
# Every tool through which an agent can write or read files, in either client (as hooks/hooks.json).
HOOK_MATCHER = ("Edit|Write|MultiEdit|NotebookEdit|Bash|Read|Grep|Glob|EnterWorktree|apply_patch|shell|"
                "exec_command|local_shell|write_stdin")
BENCH_FILES = ("prepare.py", "train.py", "program.md")


class WorkspaceError(RuntimeError):
    """A workspace problem, phrased as what to do about it."""


def bench_source_dir(name: str = "gpt") -> Path:
    """Where the bundled benchmark files live (source checkout or installed data files)."""
    candidates = [Path(__file__).resolve().parents[2] / "bench" / name]   # a source checkout
    try:   # an installed wheel: the benchmark is package data of mcp_server._bench
        from importlib.resources import files
        candidates.append(Path(str(files("mcp_server._bench"))) / name)
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    for c in candidates:
        if all((c / f).is_file() for f in BENCH_FILES):
            return c
    raise WorkspaceError(f"bundled benchmark '{name}' not found (looked in {', '.join(map(str, candidates))}); "
                         "reinstall loopwright")


@dataclass
class Workspace:
    root: Path
    cfg: cfgmod.LoopwrightConfig

    @classmethod
    def open(cls, root: Path | str) -> "Workspace":
        root = Path(root).expanduser().resolve()
        cfg = cfgmod.load_config(root)
        if not (root / ".git").exists():
            raise WorkspaceError(f"{root} has a loopwright.toml but is not a git repository; "
                                 "create workspaces with `loopwright init DIR`")
        return cls(root, cfg)

    @classmethod
    def find(cls, start: Path | str | None = None) -> "Workspace":
        """The workspace containing `start` (default: $LOOPWRIGHT_WORKSPACE or the cwd)."""
        start = Path(start or os.environ.get("LOOPWRIGHT_WORKSPACE") or Path.cwd()).expanduser().resolve()
        for d in (start, *start.parents):
            if (d / cfgmod.CONFIG_NAME).is_file():
                return cls.open(d)
        raise WorkspaceError(f"no loopwright.toml in {start} or its parents; run `loopwright init DIR` "
                             "or pass --workspace DIR")

    # -- paths ----------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.root / self.cfg.paths.state_dir

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def runs_dir(self) -> Path:
        return self.state_dir / "runs"

    @property
    def reports_dir(self) -> Path:
        return self.state_dir / "reports"

    @property
    def db_path(self) -> Path:
        return self.state_dir / "state.db"

    def run_dir(self, experiment_id: int) -> Path:
        return self.runs_dir / f"{experiment_id:05d}"

    def ledger(self) -> Ledger:
        return Ledger(self.db_path)

    def reload_config(self) -> None:
        self.cfg = cfgmod.load_config(self.root)


# ---------------------------------------------------------------------------
# init

def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def agent_pointer(kind: str) -> str:
    who = "Claude Code" if kind == "claude" else "Codex"
    return (f"# loopwright workspace ({who})\n\n"
            "Read `program.md` first and follow it on every run: it is the spec of this research loop.\n\n"
            "- Only `train.py` may be edited. `prepare.py`, `loopwright.toml`, the data and `.loopwright/` are "
            "frozen and guarded.\n"
            "- Work through the loopwright MCP tools: `state_read`, `run_experiment`, `score`, `revert`, "
            "`budget_check`, `note`, `suggest_next`.\n"
            "- Never stop to ask whether to continue: the loop runs until `budget_check` says should_stop.\n")


def client_configs(root: Path, python: str) -> dict[str, str]:
    """Workspace-level MCP + hook configs for people who do not install the plugin."""
    serve = [python, "-m", "mcp_server.cli", "serve", "--workspace", str(root)]
    guard = f"{python} -m mcp_server.guard"
    mcp_json = {"mcpServers": {"loopwright": {"command": serve[0], "args": serve[1:]}}}

    def hook(event: str, timeout: int = 15) -> list[dict]:
        return [{"type": "command", "command": f"{guard} {event}", "timeout": timeout}]

    settings = {"hooks": {
        "PreToolUse": [{"matcher": HOOK_MATCHER,
                        "hooks": hook("pre-tool-use")}],
        "Stop": [{"hooks": hook("stop", 30)}],
        "SessionStart": [{"matcher": "startup|resume|compact", "hooks": hook("session-start", 30)}],
    }}
    q = json.dumps
    codex = "\n".join([
        "# loopwright: MCP server and hooks for Codex (copy into $CODEX_HOME/config.toml or trust this project)",
        "[mcp_servers.loopwright]",
        f"command = {q(serve[0])}",
        f"args = {q(serve[1:])}",
        "startup_timeout_sec = 60",
        "tool_timeout_sec = 3600  # an experiment trains for minutes",
        "required = true          # wait for the server before the first turn",
        "",
        "[[hooks.PreToolUse]]",
        f"matcher = {q(HOOK_MATCHER)}",
        "[[hooks.PreToolUse.hooks]]",
        'type = "command"',
        f"command = {q(guard + ' pre-tool-use')}",
        "",
        "[[hooks.Stop]]",
        "[[hooks.Stop.hooks]]",
        'type = "command"',
        f"command = {q(guard + ' stop')}",
        "",
        "[[hooks.SessionStart]]",
        "[[hooks.SessionStart.hooks]]",
        'type = "command"',
        f"command = {q(guard + ' session-start')}",
        "",
    ])
    return {".mcp.json": json.dumps(mcp_json, indent=2) + "\n",
            ".claude/settings.json": json.dumps(settings, indent=2) + "\n",
            ".codex/config.toml": codex}


def prepare_data(root: Path, data_dir: Path, corpus: Optional[str] = None, prepare_py: Optional[Path] = None,
                 timeout: float = 1800) -> dict:
    """Run the workspace's prepare.py to build (or rebuild) the data; returns meta.json."""
    cmd = [sys.executable, str(prepare_py or root / "prepare.py"), "prepare", "--data-dir", str(data_dir)]
    if corpus:
        cmd += ["--corpus", corpus]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout)[-1500:]
        raise WorkspaceError(f"data preparation failed (exit {proc.returncode}):\n{tail}")
    meta = data_dir / "meta.json"
    if not meta.is_file():
        raise WorkspaceError(f"prepare.py did not write {meta}")
    return json.loads(meta.read_text())


def data_hashes(meta: dict) -> dict[str, str]:
    return dict(sorted(meta.get("files", {}).items()))


def init_workspace(directory: Path | str, tag: str = "main", corpus: str = "stdlib",
                   time_budget: Optional[float] = None, force: bool = False,
                   overrides: Optional[dict] = None, bench_dir: Optional[Path] = None) -> Workspace:
    """Create a workspace (or a new campaign in an existing one) and return it.

    `bench_dir` holds prepare.py, train.py and program.md (default: the bundled GPT benchmark).

    Refuses an existing tag, and a dirty or foreign repository unless force=True.
    """
    root = Path(directory).expanduser().resolve()
    cfgmod.CampaignConfig(tag=tag)  # validates the tag early, with a clear message
    existing = (root / cfgmod.CONFIG_NAME).is_file()
    if existing:
        return _new_campaign(Workspace.open(root), tag, force)

    src = Path(bench_dir) if bench_dir else bench_source_dir()
    missing = [f for f in BENCH_FILES if not (src / f).is_file()]
    if missing:
        raise WorkspaceError(f"benchmark folder {src} lacks {', '.join(missing)}")
    if corpus not in ("stdlib", "tinystories", "climbmix"):
        if not Path(corpus).expanduser().exists():
            raise WorkspaceError(f"--corpus {corpus!r}: no such file or folder; use stdlib, tinystories, climbmix "
                                 "or a path to text files")
        corpus = str(Path(corpus).expanduser().resolve())
    fresh = not root.exists() or not any(root.iterdir())
    if not fresh:
        if (root / ".git").exists() and not force:
            raise WorkspaceError(f"{root} is an existing git repository that is not a loopwright workspace; "
                                 "choose an empty directory, or pass --force to add a workspace to it")
        if not force:
            raise WorkspaceError(f"{root} is not empty; choose a new directory or pass --force")
        if (root / ".git").exists() and gitops.is_dirty(root):
            raise WorkspaceError(f"{root} has uncommitted changes; commit or stash them first")
    existed = root.exists()
    try:
        return _create(root, src, tag, corpus, time_budget, overrides)
    except BaseException:
        # A half-made workspace would block the next `init`: remove what this call created.
        if fresh:
            shutil.rmtree(root, ignore_errors=True)
            if existed:
                root.mkdir(parents=True, exist_ok=True)
        raise


def _create(root: Path, src: Path, tag: str, corpus: str, time_budget: Optional[float],
            overrides: Optional[dict]) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    for name in BENCH_FILES:
        shutil.copyfile(src / name, root / name)

    data: dict = {"campaign": {"tag": tag}, "benchmark": {"corpus": corpus}}
    if time_budget is not None:
        data["benchmark"]["time_budget"] = float(time_budget)
    for section, values in (overrides or {}).items():
        data.setdefault(section, {}).update(values)
    cfg = cfgmod.LoopwrightConfig.model_validate(data)
    _write(root / cfgmod.CONFIG_NAME, _config_header() + cfgmod.dump_config(cfg))
    _write(root / "AGENTS.md", agent_pointer("codex"))
    _write(root / "CLAUDE.md", agent_pointer("claude"))
    for rel, text in client_configs(root, sys.executable).items():
        _write(root / rel, text)
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.exists() else []
    for entry in (f"/{cfg.paths.state_dir}/", "__pycache__/", "*.pt2"):
        if entry not in lines:
            lines.append(entry)
    _write(gitignore, "\n".join(lines) + "\n")

    ws = Workspace(root, cfg)
    meta = prepare_data(root, ws.data_dir, corpus)
    lock = {"prepare.py": gitops.file_sha256(root / "prepare.py"), "config_frozen": cfg.frozen_hash(),
            "data": data_hashes(meta), "tokenizer": meta.get("tokenizer"), "corpus": meta.get("corpus")}
    _write(root / LOCK_NAME, json.dumps(lock, indent=2, sort_keys=True) + "\n")

    pinned = gitops.init_repo_and_pin(root, f"loopwright: pin evaluator and baseline ({tag})")
    branch = gitops.campaign_branch(tag)
    gitops.create_branch(root, branch, pinned, checkout=True)
    with ws.ledger() as ledger:
        cid = ledger.create_campaign(tag, branch, pinned)
        ledger.add_event(cid, "campaign_start", {"tag": tag, "pinned_commit": pinned}, sinks=sinks_for(cfg))
    return ws


def sinks_for(cfg: cfgmod.LoopwrightConfig) -> list[str]:
    return [name for name in ("slack", "jira") if getattr(cfg, name) is not None]


def _new_campaign(ws: Workspace, tag: str, force: bool) -> Workspace:
    with ws.ledger() as ledger:
        if ledger.campaign(tag=tag) is not None:
            raise WorkspaceError(f"campaign tag {tag!r} already exists in {ws.root}; choose another --tag "
                                 f"(existing: {', '.join(c for c in _tags(ledger))})")
        if gitops.is_dirty(ws.root) and not force:
            raise WorkspaceError(f"{ws.root} has uncommitted changes to tracked files; revert them "
                                 "(`loopwright revert`) or pass --force")
        first = ledger.conn.execute("SELECT pinned_commit FROM campaigns ORDER BY id LIMIT 1").fetchone()
        pinned = first[0] if first else gitops.root_commit(ws.root)
        branch = gitops.campaign_branch(tag)
        gitops.create_branch(ws.root, branch, pinned, checkout=True)
        cid = ledger.create_campaign(tag, branch, pinned)
        ledger.add_event(cid, "campaign_start", {"tag": tag, "pinned_commit": pinned}, sinks=sinks_for(ws.cfg))
    return ws


def _tags(ledger: Ledger) -> list[str]:
    return [r[0] for r in ledger.conn.execute("SELECT tag FROM campaigns ORDER BY id")]


def _config_header() -> str:
    return ("# loopwright workspace configuration.\n"
            "# [benchmark], [paths] and [noise] decide the score: they are frozen at `loopwright init` and\n"
            "# any change is treated as tampering. [campaign], [budget], [[schedule]], [slack], [jira] and\n"
            "# [webhook] are yours to change between sessions. Secrets go in environment variables; this\n"
            "# file only names them.\n\n")
