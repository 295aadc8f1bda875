"""The README's set-up commands and plugin order agree with the code; it stays a short front page."""
from __future__ import annotations

import pytest


# -- issue 24 item 8: the README's set-up commands and plugin order agree with the code -------------
@pytest.mark.unit
def test_readme_setup_and_plugin_order_agree_with_the_code():
    import re
    from pathlib import Path

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    repo = Path(__file__).resolve().parents[2]
    readme = (repo / "README.md").read_text()
    clients = (repo / "docs" / "clients.md").read_text()     # the walk-throughs moved out of the README

    def section(title, text=readme):
        start = text.index(f"\n## {title}")
        end = text.find("\n## ", start + 1)
        return text[start:end if end >= 0 else len(text)]

    demo, tests = re.findall(r"```bash\n(.*?)\n```", section("Set up"), re.S)[:2]
    assert demo.endswith("loopwright demo") and "download.pytorch.org/whl/cpu" in demo
    # the README's test command runs pytest as CI does (.ci/run: the same workers and distribution)
    readme_pytest = tests.rsplit("&& ", 1)[-1]
    ci_pytest = next(line for line in (repo / ".ci" / "run").read_text().splitlines()
                     if line.startswith("python3 -m pytest"))
    assert '".[dev]"' in tests and readme_pytest.startswith("python -m pytest -q")
    assert set(readme_pytest.split()[3:]) <= set(ci_pytest.split()[3:]), (readme_pytest, ci_pytest)
    assert "-n 2" in readme_pytest and "-n 2" in ci_pytest
    dev = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("ray[client]") for d in dev)       # tests/executors/test_ray_cluster.py connects by ray://
    for needed in ("Python ≥ 3.10", "bubblewrap socat", "python -m pytest -m unit -q"):
        assert needed in " ".join(section("Set up").split()), needed
    # init wires each client once (auto: the plugin where it is installed), so the plugin comes first
    for title, where in (("The first hour", clients), ("Using it from Claude Code", clients),
                         ("Using it from Codex", clients), ("Using it from Claude Code", readme),
                         ("Using it from Codex", readme)):
        text = section(title, where)
        installs = [m.start() for m in re.finditer(r"(claude|codex) plugin (install|add) loopwright@", text)]
        assert installs and installs[0] < text.index("loopwright init ~/lw"), title


@pytest.mark.unit
def test_readme_is_a_short_front_page_and_every_doc_link_resolves():
    """Issue 25 item 8: the README stays a product page (detail lives in docs/), and a moved section leaves
    no link pointing at a file that is gone."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    assert len((repo / "README.md").read_text().splitlines()) <= 250
    pages = [repo / "README.md", repo / "BENCHMARKS.md", repo / "AGENTS.md", *sorted((repo / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(repo)} -> {target}")
    assert not broken, broken
