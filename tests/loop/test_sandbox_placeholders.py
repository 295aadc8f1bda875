"""The client sandbox's empty placeholder files do not block an honest agent; planted files still do."""
from __future__ import annotations

import subprocess

import pytest


# -- issue 24 item 11: the client sandbox's placeholder files do not block an honest agent ---------
def _repo_with_train(root):
    from mcp_server.loop import gitops

    (root / ".claude").mkdir(parents=True)
    (root / ".claude" / "settings.json").write_text("{}\n")
    (root / "train.py").write_text("LR = 0.01\n")
    gitops.init_repo_and_pin(root, "pin")
    (root / "train.py").write_text("LR = 0.02\n")
    return gitops


@pytest.mark.unit
def test_empty_sandbox_placeholders_are_ignored_and_stay_out_of_the_commit(tmp_path):
    gitops = _repo_with_train(tmp_path)
    # what Claude Code's bubblewrap sandbox leaves while a command runs in the background: it mounts /dev/null
    # over each write-denied path that does not exist, and bwrap makes the mount point on the host (the
    # client removes them once no sandboxed command runs; bwrap alone leaves them, so it makes them here)
    rels = (".bashrc", ".bash_profile", ".profile", ".gitmodules", ".mcp.json", ".claude/agents",
            ".claude/commands", ".claude/settings.local.json", ".vscode")
    import shutil

    if shutil.which("bwrap"):
        binds = [a for rel in rels for a in ("--ro-bind", "/dev/null", str(tmp_path / rel))]
        subprocess.run(["bwrap", "--bind", "/", "/", "--dev", "/dev", *binds, "true"], check=True, timeout=60)
    else:
        for rel in rels:
            (tmp_path / rel).write_bytes(b"")
    assert all((tmp_path / rel).is_file() for rel in rels)
    sha, _ = gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")
    assert sha
    changed = subprocess.run(["git", "-C", str(tmp_path), "show", "--name-only", "--format=", sha],
                             capture_output=True, text=True, check=True).stdout.split()
    assert changed == ["train.py"]          # the placeholders are not committed, so no run ever sees them


@pytest.mark.unit
@pytest.mark.parametrize("rel,content", [
    (".bashrc", b"python -c 'import os'\n"),     # a planted profile with content
    (".claude/agents/evil.md", b""),             # inside the placeholder's name, not the placeholder
    ("torch.py", b""),                           # an empty module file shadows an import
    ("prepare/__init__.py", b""),
    (".bashrc.d", b""),
])
def test_planted_files_are_still_refused(tmp_path, rel, content):
    gitops = _repo_with_train(tmp_path)
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_bytes(content)
    with pytest.raises(gitops.GitError, match="untracked files in the workspace"):
        gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")


@pytest.mark.unit
def test_a_symlink_at_a_placeholder_name_is_refused(tmp_path):
    gitops = _repo_with_train(tmp_path)
    (tmp_path / ".bashrc").symlink_to("/dev/null")
    with pytest.raises(gitops.GitError, match=r"\.bashrc"):
        gitops.commit_editable(tmp_path, ["train.py"], ".loopwright", "LR")
