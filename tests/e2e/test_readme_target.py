"""The README's "Your own target" example stays a working target: its one code block, split into files at
each `# myproj/...` comment, passes `loopwright init`'s checks, and its gate, run and evaluator give a
verdict line by hand, where raising the tuned constant is a gain the example's min_delta keeps.
(The full campaign, `loopwright init` + `loopwright run --agent builtin`, was run by hand: 3 keeps in 5.)"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def _example(dest: Path) -> Path:
    text = README.read_text()
    section = text[text.index("\n## Your own target"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"```python\n(.*?)\n```", section, re.S).group(1)
    files: dict[str, list[str]] = {}
    current = None
    for line in block.splitlines():
        m = re.search(r"# (myproj/\S+?):?(\s|$)", line)
        if m:      # a file's first line names it
            current = m.group(1)
            files[current] = []
        assert current is not None, f"the block starts with a line that names no file: {line!r}"
        files[current].append(line)
    for rel, lines in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text("\n".join(lines) + "\n")
    return dest / "myproj"


def _run(root: Path, command: str, env: dict) -> subprocess.CompletedProcess:
    words = shlex.split(command)
    if words[0] == "python":
        words[0] = sys.executable
    return subprocess.run(words, cwd=root, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def _score(root: Path, cfg, tmp_path: Path, seed: int = 1001) -> dict:
    out = Path(tempfile.mkdtemp(prefix="output-", dir=tmp_path))
    env = {"LOOPWRIGHT_SEED": str(seed), "LOOPWRIGHT_OUTPUT": str(out)}
    gate = _run(root, cfg.target.gate, env)
    assert gate.returncode == 0, gate.stderr
    run = _run(root, cfg.target.run, env)
    assert run.returncode == 0, run.stderr
    measured = out.with_suffix(".run.json")
    measured.write_text(json.dumps({"seed": seed, "exit_code": 0, "cpu_seconds": 0.05, "wall_seconds": 0.06}))
    ev = _run(root, cfg.target.evaluate, {"LOOPWRIGHT_OUTPUT": str(out), "LOOPWRIGHT_RUN": str(measured)})
    assert ev.returncode == 0, ev.stderr
    return json.loads(ev.stdout.strip().splitlines()[-1])


@pytest.mark.unit
def test_the_readme_example_is_a_target_whose_tuned_constant_can_be_kept(tmp_path):
    from mcp_server.loop import targets

    root = _example(tmp_path / "src")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "evaluate.py", "harness.py", "loopwright.toml", "solution.py", "tests/test_root.py"]
    src = targets.resolve_source(str(root))      # what `loopwright init --target` checks first
    cfg = src.cfg
    assert cfg.target is not None and cfg.paths.editable == ["solution.py"]
    assert targets.matches("tests/test_root.py", cfg.paths.frozen)

    base = _score(root, cfg, tmp_path)
    assert base["ok"] is True
    assert base["metric"] == pytest.approx(-2.158, abs=1e-3)   # log10 |1.41667^2 - 2| after 2 Newton steps

    solution = root / "solution.py"
    text, n = re.subn(r"^STEPS = 2\b", "STEPS = 3", solution.read_text(), flags=re.M)
    assert n == 1, "the example's tuned constant is a top-level UPPER_CASE literal"
    solution.write_text(text)
    better = _score(root, cfg, tmp_path)
    gain = (base["metric"] - better["metric"]) * cfg.target.sign()
    assert better["ok"] is True and gain > cfg.noise.min_delta

    # a candidate the gate refuses: with no Newton step root2() is 1.0, far from sqrt(2)
    solution.write_text(re.sub(r"^STEPS = 3\b", "STEPS = 0", solution.read_text(), flags=re.M))
    gate = _run(root, cfg.target.gate, {"LOOPWRIGHT_OUTPUT": str(tmp_path)})
    assert gate.returncode != 0 and "test_close" in gate.stderr
