"""Secret-looking values never reach what dslaunch prints unless --show-secrets (issue 18, point 1)."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from launcher.cli import command
from launcher.planning.redact import REDACTED, Scrubber, is_secret, secret_patterns

TOKEN = "hf_unit_test_value_123"
WANDB = "wandb_unit_test_value_456"


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True),
    ("GOOGLE_APPLICATION_CREDENTIALS", True), ("hf_token", True), ("NCCL_DEBUG", False), ("PATH", False),
    ("HF_HOME", False), ("MASTER_PORT", False),
])
def test_which_names_look_secret(name, secret):
    assert is_secret(name, secret_patterns()) is secret


def test_user_patterns_extend_the_list():
    patterns = secret_patterns(" *_PAT , my_auth")
    assert is_secret("GITHUB_PAT", patterns) and is_secret("MY_AUTH", patterns)
    assert not is_secret("GITHUB_PAT", secret_patterns())


def test_scrubber_replaces_values_inside_text_and_leaves_short_ones():
    scrub = Scrubber([TOKEN, "1"])
    assert scrub(f"Bearer {TOKEN}, rank 1") == f"Bearer {REDACTED}, rank 1"


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("launcher.planning.hostfile.DEFAULT_HOSTFILE", str(tmp_path / "no-default"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("WANDB_API_KEY", WANDB)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts").write_text("worker-0 slots=2\nworker-1 slots=1\n")

    def invoke(*args):
        return CliRunner().invoke(command, ["-H", "hosts", "--master_addr", "10.0.0.1", *args])
    return invoke


@pytest.mark.parametrize("launcher", ["ssh", "pdsh", "openmpi", "slurm"])
def test_dry_run_text_shows_no_secret_value(run, launcher):
    result = run("--launcher", launcher, "--dry-run", "train.py")
    assert result.exit_code == 0, result.output
    assert TOKEN not in result.output and WANDB not in result.output
    assert f"HF_TOKEN={REDACTED}" in result.output and f"WANDB_API_KEY={REDACTED}" in result.output


def test_dry_run_json_shows_no_secret_value_on_any_rank(run):
    result = run("--launcher", "pdsh", "--dry-run", "--json", "--env", "MY_SECRET=from-the-flag", "train.py")
    assert result.exit_code == 0, result.output
    envs = [r["env"] for node in json.loads(result.stdout)["nodes"] for r in node["ranks"]]
    assert len(envs) == 3
    assert all(e["HF_TOKEN"] == REDACTED and e["MY_SECRET"] == REDACTED for e in envs)
    assert "from-the-flag" not in result.stdout and TOKEN not in result.stdout


def test_show_secrets_shows_them(run):
    result = run("--launcher", "pdsh", "--dry-run", "--json", "--show-secrets", "train.py")
    envs = [r["env"] for node in json.loads(result.stdout)["nodes"] for r in node["ranks"]]
    assert {e["HF_TOKEN"] for e in envs} == {TOKEN}


def test_extra_patterns_from_the_environment(run, monkeypatch):
    monkeypatch.setenv("DSLAUNCH_SECRET_PATTERNS", "HF_ENDPOINT")
    result = run("--launcher", "ssh", "--dry-run", "--env", "HF_ENDPOINT=https://mirror.internal", "train.py")
    assert "mirror.internal" not in result.output and f"HF_ENDPOINT={REDACTED}" in result.output


def test_failing_local_rank_report_shows_no_value(tmp_path):
    """A real local launch: the rank prints its token and fails; dslaunch's output hides it."""
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('token', os.environ['HF_TOKEN'], flush=True)\n"
                      "sys.exit(f'bad token {os.environ[\"HF_TOKEN\"]}')\n")
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": TOKEN}
    shown = subprocess.run([sys.executable, "-m", "launcher", str(script)], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=60)
    assert shown.returncode == 1, shown.stderr
    assert "last lines of rank 0" in shown.stderr and REDACTED in shown.stderr
    assert TOKEN not in shown.stdout + shown.stderr
    revealed = subprocess.run([sys.executable, "-m", "launcher", "--show-secrets", str(script)],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert TOKEN in revealed.stderr
