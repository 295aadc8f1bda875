"""Record the hook payloads the real Claude Code and Codex send, for tests/guard/test_guard.py.

    python tests/guard_payloads/record.py        # needs: npm install --prefix tests/realclients

Each client runs offline against the scripted fake model server (tests/realclients) in a
throwaway workspace, with a hook that only logs its stdin and allows everything. The
payloads are saved with the workspace path replaced by "{WS}" (and the per-run temp
dir by "{RUN}") as claude_code.json and codex.json next to this file.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))                     # tests/ -> realclients

from realclients.fake_anthropic import ToolUse  # noqa: E402
from realclients.fake_openai import ApplyPatch, FunctionCall  # noqa: E402
from realclients.harness import command_hook, python_cmd, run_claude, run_codex  # noqa: E402

LOG_HOOK = "import json, sys\nopen(sys.argv[1], 'a').write(json.dumps(json.load(sys.stdin)) + '\\n')\n"
NOTEBOOK = {"cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "source": ["x = 1\n"],
                       "outputs": [], "execution_count": None}],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def make_workspace(ws: Path):
    ws.mkdir(parents=True)
    (ws / "loopwright.toml").write_text('[paths]\neditable = ["train.py"]\n')
    (ws / "prepare.py").write_text("X = 1\n")
    (ws / "train.py").write_text("LR = 0.01\n")
    (ws / "nb.ipynb").write_text(json.dumps(NOTEBOOK))
    (ws / ".loopwright" / "data").mkdir(parents=True)
    (ws / ".loopwright" / "data" / "test.bin").write_bytes(b"\x00\x01")


def hooks(hook: Path, log: Path) -> dict:
    cmd = python_cmd(hook, log)
    return {"PreToolUse": [command_hook(cmd, matcher=".*", timeout=30)],
            "Stop": [command_hook(cmd, timeout=30)],
            "SessionStart": [command_hook(cmd, matcher="startup|resume|compact", timeout=30)]}


def claude_script(ws: Path) -> list:
    p = lambda name: str(ws / name)  # noqa: E731
    return [
        ToolUse("Read", {"file_path": p("prepare.py")}),
        ToolUse("Edit", {"file_path": p("prepare.py"), "old_string": "X = 1", "new_string": "X = 2"}),
        ToolUse("Read", {"file_path": p("loopwright.toml")}),
        ToolUse("Write", {"file_path": p("loopwright.toml"), "content": "[paths]\n"}),
        ToolUse("MultiEdit", {"file_path": p("prepare.py"), "edits": [{"old_string": "X", "new_string": "Y"}]}),
        ToolUse("Read", {"file_path": p("nb.ipynb")}),
        ToolUse("NotebookEdit", {"notebook_path": p("nb.ipynb"), "cell_id": "c1", "new_source": "x = 2"}),
        ToolUse("Bash", {"command": "echo 1 > prepare.py", "description": "overwrite"}),
        ToolUse("Grep", {"pattern": "X", "path": p(".loopwright")}),
        ToolUse("Glob", {"pattern": "**/*.bin", "path": p(".loopwright")}),
        ToolUse("Read", {"file_path": p(".loopwright/data/test.bin")}),
        ToolUse("Read", {"file_path": p("train.py")}),
        ToolUse("Edit", {"file_path": p("train.py"), "old_string": "0.01", "new_string": "0.02"}),
        "done",
        "done again",
    ]


def codex_script(parent: Path) -> list:
    patch = lambda body: "*** Begin Patch\n" + body + "*** End Patch"  # noqa: E731
    return [
        FunctionCall("exec_command", {"cmd": "echo 1 > prepare.py"}),
        FunctionCall("exec_command", {"cmd": "cat ws/prepare.py", "workdir": str(parent)}),
        FunctionCall("exec_command", {"cmd": "print(1)", "shell": "python3"}),
        FunctionCall("write_stdin", {"session_id": 1, "chars": "rm prepare.py\n"}),
        ApplyPatch(patch("*** Update File: prepare.py\n@@\n-X = 1\n+X = 2\n")),
        ApplyPatch(patch("*** Add File: notes.txt\n+hello\n")),
        ApplyPatch(patch("*** Update File: train.py\n*** Move to: prepare.py\n@@\n-LR = 0.01\n+LR = 0.02\n")),
        ApplyPatch(patch("*** Delete File: loopwright.toml\n")),
        "done",
        "done again",
    ]


def normalise(payloads: list[dict], ws: Path, run_dirs: list[Path]) -> list[dict]:
    text = json.dumps(payloads).replace(str(ws.resolve()), "{WS}").replace(str(ws), "{WS}")
    for d in run_dirs:
        text = text.replace(str(d.resolve()), "{RUN}").replace(str(d), "{RUN}")
    return json.loads(text)


def record(client: str) -> list[dict]:
    tmp = Path(tempfile.mkdtemp(prefix=f"lw-record-{client}-"))
    try:
        ws = tmp / "ws"
        make_workspace(ws)
        hook, log = tmp / "hook.py", tmp / "hook.jsonl"
        hook.write_text(LOG_HOOK)
        if client == "claude":
            run = run_claude(ws, claude_script(ws), hooks=hooks(hook, log), run_dir=tmp / "run", timeout=120)
        else:
            run = run_codex(ws, codex_script(tmp), hooks=hooks(hook, log), run_dir=tmp / "run", timeout=120)
        print(client, run, file=sys.stderr)
        payloads = [json.loads(line) for line in log.read_text().splitlines()]
        return normalise(payloads, ws, [tmp / "run", tmp])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    for client, name in (("claude", "claude_code.json"), ("codex", "codex.json")):
        payloads = record(client)
        (HERE / name).write_text(json.dumps(payloads, indent=1) + "\n")
        print(f"{name}: {len(payloads)} payloads:",
              [p.get("tool_name") or p.get("hook_event_name") for p in payloads], file=sys.stderr)


if __name__ == "__main__":
    main()
