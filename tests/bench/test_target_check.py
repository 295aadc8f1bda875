"""`loopwright target check`: the contract's checks on a target folder, and the full checks (gate, run,
evaluator, noise, hidden files) on workspaces made from one, with real git and the real sandbox."""
from __future__ import annotations

import json
import re
import shutil
import textwrap

import pytest

from mcp_server.cli.main import main
from mcp_server.loop.setup import init_workspace
from mcp_server.loop.workspace import bundled_targets


def _check(capsys, *argv: str) -> tuple[int, str]:
    code = main(["target", "check", *argv])
    return code, capsys.readouterr().out


def _lines(out: str) -> dict[str, str]:
    """{check name: 'ok' | 'FAIL'} from the report's lines."""
    return {m.group(2): m.group(1) for m in re.finditer(r"^(ok|FAIL)\s+([a-z ]+):", out, re.M)}


def _dice(root, noise: str):
    """A tiny target whose run writes a random number and whose evaluator reports it as the metric."""
    root.mkdir()
    (root / "loopwright.toml").write_text(textwrap.dedent(f"""\
        [target]
        name = "dice"
        run = "python run.py"
        evaluate = "python evaluate.py"
        metric = "score"
        noise = "{noise}"
        time_budget = 10

        [paths]
        editable = ["knob.py"]
        frozen = ["run.py", "evaluate.py"]
        """))
    (root / "knob.py").write_text("K = 1\n")
    (root / "run.py").write_text("import os, random\n"
                                 "open(os.path.join(os.environ['LOOPWRIGHT_OUTPUT'], 'value.txt'), 'w')"
                                 ".write(repr(random.SystemRandom().random()))\n")
    (root / "evaluate.py").write_text("import json, os\n"
                                      "v = float(open(os.path.join(os.environ['LOOPWRIGHT_OUTPUT'], 'value.txt')).read())\n"
                                      "print(json.dumps({'ok': True, 'metric': v}))\n")
    return root


def test_a_folder_whose_editable_glob_matches_nothing_fails_and_says_which(tmp_path, capsys):
    src = tmp_path / "squeeze"
    shutil.copytree(bundled_targets()["squeeze"], src)
    toml = src / "loopwright.toml"
    toml.write_text(toml.read_text().replace('editable = ["compressor.py"]', 'editable = ["nothere/*.py"]'))
    code, out = _check(capsys, str(src))
    assert code == 1
    assert _lines(out) == {"contract": "ok", "editable globs": "FAIL", "frozen globs": "ok", "hidden globs": "ok"}
    assert "'nothere/*.py' matches no file of" in out and "[paths] editable" in out
    # a folder is not a workspace yet: the rest is for later, and said how
    assert f"loopwright init WS --target {src}" in out and "--workspace WS" in out


def test_a_bundled_name_passes_the_folder_checks(capsys):
    code, out = _check(capsys, "fastsum")
    assert code == 0, out
    assert _lines(out) == {"contract": "ok", "editable globs": "ok", "frozen globs": "ok", "hidden globs": "ok",
                           "init would accept it": "ok", "frozen config": "ok"}
    assert "hidden/reference.py" in out


def test_a_folder_without_a_target_section_fails_the_contract(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "loopwright.toml").write_text("[paths]\neditable = [\"a.py\"]\n")
    code, out = _check(capsys, str(tmp_path / "t"))
    assert code == 1 and _lines(out) == {"contract": "FAIL"} and "no [target] section" in out


@pytest.mark.slow
@pytest.mark.parametrize("name, metric", [("fastsum", "cpu_seconds"), ("squeeze", "compressed_bytes")])
def test_the_bundled_targets_workspaces_pass_every_check(tmp_path, capsys, name, metric):
    ws = init_workspace(tmp_path / "ws", target=name)
    code, out = _check(capsys, "--workspace", str(ws.root))
    assert code == 0, out
    assert _lines(out) == dict.fromkeys(["contract", "frozen config", "editable globs", "frozen globs", "hidden globs", "gate", "run",
                                         "evaluator", "noise", "hidden files"], "ok")
    if name == "squeeze":     # declared deterministic, and it is: one figure on both seeds
        m = re.search(rf"deterministic: {metric} is ([0-9.]+) on seeds \d+ and \d+", out)
        assert m and float(m.group(1)) > 0, out
    else:                     # repeat: both figures and their spread
        m = re.search(rf"repeat: {metric} is ([0-9.]+) on seed \d+ and ([0-9.]+) on seed \d+ \(spread ", out)
        assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, out
    # the check's runs are removed, and none went to a shared temp dir
    assert not any((ws.state_dir / "target-check").iterdir())


@pytest.mark.slow
def test_a_deterministic_declared_target_whose_metric_varies_fails_with_the_figures(tmp_path, capsys):
    ws = init_workspace(tmp_path / "ws", target=str(_dice(tmp_path / "dice", "deterministic")))
    code, out = _check(capsys, "--workspace", str(ws.root))
    assert code == 1
    lines = _lines(out)
    assert lines.pop("noise") == "FAIL" and set(lines.values()) == {"ok"}, out
    m = re.search(r"declared deterministic but the metric varies: ([0-9.e-]+) vs ([0-9.e-]+); "
                  r"declare noise = \"repeat\" or \"seeded\"", out)
    assert m and float(m.group(1)) != float(m.group(2)), out


@pytest.mark.slow
def test_the_same_target_declared_repeat_passes_and_shows_the_spread(tmp_path, capsys):
    ws = init_workspace(tmp_path / "ws", target=str(_dice(tmp_path / "dice", "repeat")))
    code, out = _check(capsys, "--workspace", str(ws.root))
    assert code == 0, out
    assert re.search(r"ok\s+noise: repeat: score is \S+ on seed \d+ and \S+ on seed \d+ \(spread ", out)
    assert "hidden files: none declared" in out


@pytest.mark.slow
def test_the_probe_catches_a_hidden_file_the_sandbox_shows(tmp_path, capsys):
    """The probe, in the run's real sandbox, reads what it can: a 'hidden' file that is in fact in the run's
    tree (run.py) is reported as readable, the state directory's copies as not."""
    from mcp_server.cli.commands import target
    from mcp_server.loop import gitops, sandbox

    ws = init_workspace(tmp_path / "ws", target=str(_dice(tmp_path / "dice", "repeat")))
    pinned = ws.pinned_commit
    tree = {rel: gitops.blob_bytes(ws.root, pinned, rel) for rel in gitops.tracked_files(ws.root, pinned)}
    (ws.data_dir / "run.py").parent.mkdir(parents=True, exist_ok=True)
    (ws.data_dir / "run.py").write_bytes(tree["run.py"])
    rep = target.Report()
    target._check_hidden(ws, {"data": {"run.py": "x"}}, tree, ws.state_dir / "probe-test", sandbox.require(), rep)
    out = capsys.readouterr().out
    assert rep.failed == 1, out
    assert f"{ws.root / 'run.py'} (workspace)" in out
    assert str(ws.data_dir / "run.py") not in out   # the state directory stays hidden


def test_a_frozen_section_edited_since_the_pin_fails_with_the_restore_command(tmp_path, capsys):
    """The loop would restore it and record a tamper event before any run: said before the first run."""
    from mcp_server.cli.commands import target

    ws = init_workspace(tmp_path / "ws", target=str(_dice(tmp_path / "dice", "repeat")))
    toml = ws.root / "loopwright.toml"
    rep = target.Report()
    lock = json.loads((ws.root / "loopwright.lock").read_text())
    target._check_frozen_config(ws, ws.pinned_commit, lock, rep)
    assert rep.failed == 0, capsys.readouterr().out
    toml.write_text(toml.read_text().replace("time_budget = 10.0", "time_budget = 11.0"))
    target._check_frozen_config(ws, ws.pinned_commit, lock, rep)
    out = capsys.readouterr().out
    assert rep.failed == 1 and "edited since the pin" in out
    assert f"checkout {ws.pinned_commit[:10]} -- loopwright.toml" in out
