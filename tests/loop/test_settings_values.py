"""Settings values checked up front: connector settings that cannot work (or would put a secret on
disk) and tags git would refuse are refused with a message."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mcp_server.loop import settings as setmod
from mcp_server.loop.config import tag_problem


def cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "mcp_server.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)




# -- D: connector settings that cannot work -------------------------------------------------------

@pytest.mark.parametrize("key, value, expect", [
    ("slack.token_env", "xoxb-1234-abcd", "looks like a token"),
    ("slack.token_env", "xapp-1-A0-1-abc", "looks like a token"),
    ("jira", '{server = "https://j.example", project = "X", token_env = "ATATT3xFfGF0aB9cD8eF7gH6iJ5kL4mN3"}',
     "looks like a token"),
    ("slack.webhook_url_env", "https://hooks.slack.com/services/T0/B0/x", "looks like a token|name of an env"),
    ("slack.token_env", "MY TOKEN", "name of an environment variable"),
    ("webhook.github_secret_env", "9LIVES", "name of an environment variable"),
    ("slack.base_url", "notaurl", "not an http\\(s\\) URL"),
    ("slack.base_url", "ftp://x", "not an http\\(s\\) URL"),
    ("slack.base_url", "http://slack.example.com/api/", "plain http"),
    ("jira", '{server = "http://evil.example", project = "X"}', "plain http"),
])
def test_connector_values_that_cannot_work_are_refused(key, value, expect):
    with pytest.raises(setmod.SettingsError, match=expect) as e:
        setmod.set_value(setmod.Settings(), key, value)
    if "looks like a token" in str(e.value):   # the secret is not echoed either
        assert "xoxb-1234" not in str(e.value) and "ATATT3x" not in str(e.value) and "xapp-1" not in str(e.value)


@pytest.mark.parametrize("key, value", [
    ("slack.token_env", "MY_SLACK_TOKEN"), ("slack.base_url", "https://slack.example.com/api/"),
    ("slack.base_url", "http://127.0.0.1:9/api/"), ("slack.base_url", "http://localhost:8080/api/"),
    ("slack.base_url", "http://[::1]:8080/api/"), ("jira", '{server = "https://jira.example", project = "X"}'),
    ("webhook.github_secret_env", "_GH_SECRET_2"),
])
def test_connector_values_that_work_are_kept(key, value):
    setmod.set_value(setmod.Settings(), key, value)


def test_config_get_of_an_unknown_key_says_so():
    with pytest.raises(setmod.SettingsError, match="unknown key 'budget.nope'"):
        setmod.get(setmod.Settings(), "budget.nope")
    with pytest.raises(setmod.SettingsError, match="is not set"):
        setmod.get(setmod.Settings(), "slack.channel")     # a real key, no [slack] section yet
    assert setmod.get(setmod.Settings(), "budget.max_experiments") == 50


# -- E: tags git would refuse -----------------------------------------------------------------------

@pytest.mark.parametrize("tag", ["a..b", "x.lock", ".hidden", "end.", "bad tag..", ""])
def test_tags_git_refuses_are_refused_up_front(tag):
    assert tag_problem(tag)
    with pytest.raises(setmod.SettingsError, match="campaign tag"):
        setmod.set_value(setmod.Settings(), "campaign.tag", f'"{tag}"')


def test_good_tags_pass():
    for tag in ("main", "lr-sweep_2", "v1.2"):
        assert tag_problem(tag) is None


def test_init_refuses_bad_input_with_a_message(tmp_path):
    a_file = tmp_path / "passwd"
    a_file.write_text("x")
    r = cli("init", str(a_file), "--debug")            # --debug after the command is accepted too
    assert r.returncode == 2 and "not a directory" in r.stderr and "Traceback" not in r.stderr
    for tag in ("bad tag..", "a..b", "x.lock", ".hidden"):
        r = cli("init", str(tmp_path / "ws"), "--tag", tag)
        assert r.returncode == 2 and "campaign tag" in r.stderr, r.stderr
        assert "pydantic" not in r.stderr and "Invalid reference" not in r.stderr
    assert not (tmp_path / "ws").exists()
