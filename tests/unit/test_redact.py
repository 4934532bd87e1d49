"""One redaction rule (sandbox.redact) for records, explain() and --dry-run (issue 24, item 3)."""

from __future__ import annotations

import os
import subprocess
import sys

import sandbox
from sandbox import Spec
from sandbox.redact import SHOW_SECRETS_ENV, redact, secrets_of
from sandbox.task import records

KEY = "sk-" + "q" * 30
TOKEN = "ghp_" + "z" * 20


def test_the_rule_names_the_variable_and_leaves_short_or_ordinary_values() -> None:
    env = {"OPENAI_API_KEY": KEY, "GH_TOKEN": TOKEN, "SHORT_KEY": "abc", "HOME": "/home/someone-with-a-long-name"}
    assert secrets_of(env) == {KEY: "OPENAI_API_KEY", TOKEN: "GH_TOKEN"}
    text = f"--key={KEY} {TOKEN} abc /home/someone-with-a-long-name"
    assert redact(text, env) == "--key=<OPENAI_API_KEY> <GH_TOKEN> abc /home/someone-with-a-long-name"
    assert records.secrets_of is secrets_of  # the records use this very rule


def test_explain_redacts_the_command_env_and_the_callers_unless_revealed(monkeypatch: object) -> None:
    spec = Spec(env={"MODEL_KEY": KEY, "LANG": "C.UTF-8"})
    text = sandbox.explain(spec, ["python3", f"--token={TOKEN}"])
    assert KEY not in text and "MODEL_KEY=<MODEL_KEY>" in text and "--setenv MODEL_KEY <MODEL_KEY>" in text
    # A value of the caller's environment is redacted too (here it was passed on the command line).
    os.environ["CALLER_SECRET"] = TOKEN
    try:
        assert TOKEN not in sandbox.explain(spec, ["python3", f"--token={TOKEN}"])
        assert "--token=<CALLER_SECRET>" in sandbox.explain(spec, ["python3", f"--token={TOKEN}"])
    finally:
        del os.environ["CALLER_SECRET"]
    shown = sandbox.explain(spec, ["python3"], reveal=True)
    assert f"MODEL_KEY={KEY}" in shown


def _dry_run(extra_env: dict[str, str], *options: str) -> str:
    env = {**os.environ, "OPENAI_API_KEY": TOKEN, **extra_env}
    out = subprocess.run([sys.executable, "-m", "sandbox", "run", "--dry-run", *options, "--ro-bind", "/usr", "/usr",
                          "--setenv", "MODEL_KEY", KEY, "--", "/usr/bin/env"],
                         capture_output=True, text=True, env=env, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_dry_run_redacts_unless_asked_with_the_variable() -> None:
    out = _dry_run({})
    assert KEY not in out and TOKEN not in out
    assert "MODEL_KEY=<MODEL_KEY>" in out and "OPENAI_API_KEY=<OPENAI_API_KEY>" in out
    assert KEY in _dry_run({SHOW_SECRETS_ENV: "1"})


def test_dry_run_shows_values_with_show_secrets() -> None:
    out = _dry_run({}, "--show-secrets")
    assert f"MODEL_KEY={KEY}" in out
