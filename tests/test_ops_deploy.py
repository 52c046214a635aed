"""The deployment files of ``deploy/`` hold together (Docker does not run here).

The compose file is parsed with PyYAML and checked at the schema level:
the services docs/deployment.md lists, images or builds, references between
services and volumes, loopback-only ports, credentials from the
environment. scrapyd's config, the systemd units and the Grafana dashboard
are checked against what the code provides.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pymongo
import pytest
import redis
import yaml

from crawler.metrics import StatusCollector
from crawler.status import StatusReader

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"

#: The services docs/deployment.md says the compose file has.
README_SERVICES = {"redis", "mongodb", "scrapyd1", "scrapyd2", "metrics"}


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def test_compose_file_names_every_service_the_readme_lists() -> None:
    assert set(compose()["services"]) == README_SERVICES


def test_compose_services_are_well_formed() -> None:
    data = compose()
    services = data["services"]
    volumes = set(data.get("volumes") or {})
    allowed = {
        "image", "build", "command", "environment", "ports", "volumes", "depends_on",
        "healthcheck", "restart", "hostname",
    }  # fmt: skip
    for name, service in services.items():
        assert isinstance(service, dict), name
        assert set(service) <= allowed, (name, set(service) - allowed)
        assert "image" in service or "build" in service, name
        if "build" in service:
            assert (ROOT / service["build"]["context"].replace("..", ".")).is_dir()
            assert (ROOT / service["build"]["dockerfile"]).is_file()
        for dependency in service.get("depends_on", {}):
            assert dependency in services, (name, dependency)
        for mount in service.get("volumes", []):
            source = mount.split(":", 1)[0]
            assert source in volumes, (name, source)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)  # loopback only
        if isinstance(service.get("command"), list):
            assert all(isinstance(part, str) for part in service["command"]), name
    assert "--appendonly" in services["redis"]["command"]
    assert services["redis"]["command"][services["redis"]["command"].index("--appendonly") + 1] == (
        "yes"
    )
    assert "ports" not in services["redis"] and "ports" not in services["mongodb"]
    for node in ("scrapyd1", "scrapyd2"):
        environment = services[node]["environment"]
        assert environment["SCRAPYD_USERNAME"].startswith("${SCRAPYD_USERNAME:?")
        assert environment["SCRAPYD_PASSWORD"].startswith("${SCRAPYD_PASSWORD:?")
        assert environment["REDIS_URL"] == "redis://redis:6379/0"
        assert services[node]["command"][0] == "deploy/scrapyd-node"
    assert services["metrics"]["command"][:3] == ["python", "-m", "crawler.metrics"]


def test_scrapyd_conf_binds_loopback_and_holds_no_credentials() -> None:
    config = configparser.ConfigParser()
    config.read(DEPLOY / "scrapyd.conf")
    assert config.get("scrapyd", "bind_address") == "127.0.0.1"
    assert config.get("scrapyd", "username") == ""
    assert config.get("scrapyd", "password") == ""


@pytest.mark.workers
def test_scrapyd_node_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCRAPYD_")}
    result = subprocess.run(
        ["sh", str(DEPLOY / "scrapyd-node"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert result.returncode == 2
    assert "SCRAPYD_USERNAME" in result.stderr
    assert not (tmp_path / "scrapyd.conf").exists()


def test_systemd_units_run_the_project_without_inline_credentials() -> None:
    for unit in ("crawler-worker@.service", "scrapyd.service", "crawler-metrics.service"):
        text = (DEPLOY / "systemd" / unit).read_text()
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(text)
        service = parser["Service"]
        assert service["EnvironmentFile"].startswith("/etc/crawler/"), unit
        assert "ExecStart" in service and "PASSWORD" not in service["ExecStart"], unit
        assert parser.has_section("Install"), unit
    worker = configparser.ConfigParser(strict=False, interpolation=None)
    worker.read(DEPLOY / "systemd" / "crawler-worker@.service")
    assert worker["Service"]["ExecStart"].endswith("deploy/crawler-worker %i")
    assert worker["Service"]["KillSignal"] == "SIGTERM"


def test_grafana_dashboard_uses_only_exported_metrics(
    redis_url: str, mongo_uri: str, mongo_db: str
) -> None:
    reader = StatusReader(
        redis.Redis.from_url(redis_url),
        pymongo.MongoClient(mongo_uri, connect=False),
        mongo_db,
        ["quotes"],
    )
    try:
        names = set()
        for family in StatusCollector(reader).collect():
            names.add(family.name)
            names.add(f"{family.name}_total" if family.type == "counter" else family.name)
    finally:
        reader.close()
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used.update(re.findall(r"\bcrawler_[a-z_]+", target["expr"]))
    assert used, "the dashboard queries no metric"
    assert used <= names, used - names
    assert {"crawler_pages_crawled_total", "crawler_workers_live"} <= used


def test_deploy_targets_read_credentials_from_the_environment() -> None:
    config = configparser.ConfigParser(interpolation=None)
    config.read(DEPLOY.parent / "scrapy.cfg")
    targets = [s for s in config.sections() if s.startswith("deploy:")]
    assert len(targets) >= 3
    for section in targets:
        assert config[section]["password"] == "${SCRAPYD_PASSWORD}"
        assert config[section]["url"].startswith("http://127.0.0.1:")


@pytest.mark.workers
def test_the_deployed_egg_carries_the_crawler_alone(tmp_path: Path) -> None:
    # The development and demo machinery (devtools/) stays out of the egg
    # scrapyd installs on every node; the Lua scripts go in.
    import zipfile

    from deploy.cluster import build_egg

    egg = build_egg(tmp_path, "1")
    names = zipfile.ZipFile(egg).namelist()
    tops = {name.split("/")[0] for name in names} - {"EGG-INFO"}
    assert tops == {"crawler"}, tops
    assert "crawler/frontier/lua/commit.lua" in names
    assert not [n for n in names if n.split("/")[-1] in {"replay.py", "embedded.py", "demo.py"}]
