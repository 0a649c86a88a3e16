"""Deployment defaults that are safe to expose (issue 15, finding 7).

A config that says nothing creates no account; only configs/local.yaml bootstraps one, whose
key goes to a 0600 file and to the terminal of ``make run``, never to a replica's output
(Ray copies that into its log files). The cluster file keeps the dashboard on localhost,
turns Ray's token auth on and names no database password. The replicas that hold no model
(router, auth) never load torch.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serve_app.config import AppConfig, resolve_auth_db

ROOT = Path(__file__).resolve().parent.parent


def serve_args(config: str) -> dict:
    document = yaml.safe_load((ROOT / "configs" / config).read_text())
    return document["applications"][0]["args"]


def test_only_the_local_config_bootstraps_an_account():
    assert AppConfig().auth.bootstrap_local_key is False
    assert AppConfig(**serve_args("local.yaml")).auth.bootstrap_local_key is True
    assert AppConfig(**serve_args("prod.yaml")).auth.bootstrap_local_key is False


def test_one_default_location_for_the_auth_store(monkeypatch, tmp_path):
    monkeypatch.delenv("SERVE_APP_AUTH_DB", raising=False)
    monkeypatch.delenv("SERVE_APP_DATA_DIR", raising=False)
    assert AppConfig().auth_db == resolve_auth_db()
    monkeypatch.setenv("SERVE_APP_DATA_DIR", str(tmp_path))
    assert AppConfig().auth_db == resolve_auth_db() == str(tmp_path / "auth.sqlite3")


def test_cluster_dashboard_is_local_and_ray_needs_a_token():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    head = " ".join(cluster["head_start_ray_commands"])
    workers = " ".join(cluster["worker_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    assert "RAY_AUTH_MODE=token" in head and "RAY_AUTH_MODE=token" in workers
    assert "~/.ray/auth_token" in cluster["file_mounts"]


def test_cluster_database_dsn_names_no_password():
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    dsn_lines = [c for c in cluster["setup_commands"] if "SERVE_APP_AUTH_DB=" in c]
    assert dsn_lines
    for line in dsn_lines:
        userinfo = line.split("postgresql://", 1)[1].split("@", 1)[0]
        assert ":" not in userinfo  # user only: libpq takes the password from ~/.pgpass
    assert "~/.pgpass" in cluster["file_mounts"]


def bootstrap(data_dir: Path, config: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVE_APP_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    env.pop("SERVE_APP_API_KEY", None)
    env.pop("SERVE_APP_AUTH_DB", None)
    command = [sys.executable, "-m", "serve_app.prepare", "local-key", "--config"]
    return subprocess.run(
        [*command, str(ROOT / "configs" / config)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


def test_make_run_prints_a_new_local_key_once_and_keeps_it_0600(tmp_path):
    first = bootstrap(tmp_path, "local.yaml")
    key_file = tmp_path / "local-api-key"
    key = key_file.read_text().strip()
    assert key.startswith("sk-") and key in first.stdout
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    second = bootstrap(tmp_path, "local.yaml")
    assert key not in second.stdout + second.stderr
    assert str(key_file) in second.stderr


def test_prod_config_bootstraps_nothing(tmp_path):
    result = bootstrap(tmp_path, "prod.yaml")
    assert "sk-" not in result.stdout and not (tmp_path / "local-api-key").exists()


def test_a_replica_never_prints_the_key(tmp_path, monkeypatch, capfd):
    from deployments.auth import AuthService

    monkeypatch.delenv("SERVE_APP_API_KEY", raising=False)
    monkeypatch.delenv("SERVE_APP_AUTH_DB", raising=False)
    config = AppConfig(data_dir=str(tmp_path), auth={"bootstrap_local_key": True})
    AuthService(config)
    key = (tmp_path / "local-api-key").read_text().strip()
    captured = capfd.readouterr()
    assert key not in captured.out + captured.err


@pytest.mark.parametrize("docs", ["key", "open", "off"])
def test_docs_setting_is_validated(docs):
    assert AppConfig(auth={"docs": docs}).auth.docs == docs


def test_replicas_without_a_model_never_load_torch():
    """Ray imports a deployment's module in its replica: the router's and the auth service's
    leave torch and transformers out (~150 MB of each process; docs/operations.md, "Memory")."""
    code = (
        "import sys, deployments.router, deployments.auth;"
        "print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
