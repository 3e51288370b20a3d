"""project/settings.py, as Django runs it: in a process of its own, configured by its environment.

With DEBUG off (nothing set) the demo's settings refuse to run without a secret key of their own,
and a production environment passes ``check --deploy`` with nothing to report; ``make demo``
runs with DEBUG on and the demo's public key.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEMO_KEY = "demo-only-not-secret-change-me"
PRODUCTION = {
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
    "DJANGO_ALLOWED_HOSTS": "chat.example.com",
}
SHOW_SETTINGS = (
    "import json, project.settings as s; print(json.dumps({name: getattr(s, name, None) for name"
    " in ('DEBUG', 'SECRET_KEY', 'SECURE_SSL_REDIRECT', 'SESSION_COOKIE_SECURE',"
    " 'CSRF_COOKIE_SECURE', 'SECURE_HSTS_SECONDS')}))"
)


def _environment(tmp_path: Path, values: dict[str, str]) -> dict[str, str]:
    """This process's environment without the settings it chose (the test run's settings module,
    its database and layer), plus ``values``."""
    inherited = {name: value for name, value in os.environ.items()
                 if not name.startswith(("DJANGO_", "CHATSTREAM_"))
                 and name not in ("DATABASE_URL", "REDIS_URL", "SQLITE_PATH")}
    return {**inherited, "SQLITE_PATH": str(tmp_path / "demo.sqlite3"), **values}


def _check_deploy(tmp_path: Path, **values: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=_environment(tmp_path, values), capture_output=True, text=True, timeout=120)


def _settings(env: dict[str, str]) -> dict[str, object]:
    """Some of the settings project/settings.py makes in the environment ``env``."""
    shown = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return dict(json.loads(shown.stdout))


@pytest.mark.parametrize("debug", [{}, {"DJANGO_DEBUG": "0"}], ids=["debug-unset", "debug-0"])
def test_public_demo_key_is_refused_with_debug_off(tmp_path, debug):
    result = _check_deploy(tmp_path, **{**PRODUCTION, **debug, "DJANGO_SECRET_KEY": DEMO_KEY})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "public" in result.stderr and "Set DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.parametrize("key", [None, "", "  "], ids=["missing", "empty", "blank"])
def test_missing_or_empty_key_is_refused_with_debug_off(tmp_path, key):
    values = {**PRODUCTION, "DJANGO_SECRET_KEY": key}
    if key is None:
        del values["DJANGO_SECRET_KEY"]
    result = _check_deploy(tmp_path, **values)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DJANGO_SECRET_KEY is not set" in result.stderr
    assert "Set DJANGO_SECRET_KEY" in result.stderr


@pytest.mark.parametrize("services", [
    {},
    {"DATABASE_URL": "postgres://chat@db.internal:5432/chat",
     "REDIS_URL": "redis://redis.internal:6379/0"},
], ids=["sqlite", "postgres-redis"])
def test_production_environment_passes_check_deploy_with_no_issues(tmp_path, services):
    result = _check_deploy(tmp_path, **PRODUCTION, **services)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "System check identified no issues (0 silenced)."
    assert result.stderr == ""


def test_https_settings_are_on_with_debug_off_unless_turned_off(tmp_path):
    on = _settings(_environment(tmp_path, PRODUCTION))
    assert on["DEBUG"] is False
    assert on["SECURE_SSL_REDIRECT"] and on["SESSION_COOKIE_SECURE"] and on["CSRF_COOKIE_SECURE"]
    assert on["SECURE_HSTS_SECONDS"] == 31536000
    off = _settings(_environment(tmp_path, {**PRODUCTION, "DJANGO_HTTPS": "0"}))
    assert not (off["SECURE_SSL_REDIRECT"] or off["SESSION_COOKIE_SECURE"]
                or off["CSRF_COOKIE_SECURE"] or off["SECURE_HSTS_SECONDS"])


def test_make_demo_runs_with_debug_on_and_the_demo_key(tmp_path):
    """The processes ``make demo`` starts, with nothing set, run clean with the demo's key.

    A stand-in virtualenv records each command the target runs, with its environment; the real
    settings are then checked in the environment the target gave its server.
    """
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.jsonl"
    recorder = venv / "bin" / "python"
    recorder.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}) + '\\n')\n")
    recorder.chmod(0o755)
    installed = venv / ".installed-6.1"  # the Makefile's mark of a ready virtualenv
    installed.touch()
    newer = (ROOT / "pyproject.toml").stat().st_mtime + 1
    os.utime(installed, (newer, newer))
    made = subprocess.run(["make", "-s", "demo", f"VENV={venv}", "DJANGO=6.1"],
                          cwd=ROOT, env=_environment(tmp_path, {}), capture_output=True,
                          text=True, timeout=60,
                          start_new_session=True)  # the target ends with `kill 0`: its group
    assert calls.exists(), made.stdout + made.stderr
    runs = [json.loads(line) for line in calls.read_text().splitlines()]
    server = next(run for run in runs if run["argv"][:2] == ["-m", "uvicorn"])
    assert [run["argv"][:2] for run in runs if run["argv"][0] == "manage.py"][:2] == [
        ["manage.py", "migrate"], ["manage.py", "chatstream_demo_user"]]
    settings_env = {(run["env"].get("DJANGO_DEBUG"), run["env"].get("DJANGO_SECRET_KEY"))
                    for run in runs}
    assert len(settings_env) == 1  # every process the target starts gets the same
    env = {**server["env"], "SQLITE_PATH": str(tmp_path / "demo.sqlite3")}
    shown = _settings(env)
    assert shown["DEBUG"] is True and shown["SECRET_KEY"] == DEMO_KEY
    check = subprocess.run([sys.executable, "manage.py", "check", "--fail-level", "WARNING"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stderr
    assert "no issues" in check.stdout
