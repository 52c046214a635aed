"""Deploy the crawler to every scrapyd node, start K workers of a spider on each, stop them.

Built on scrapyd-client (``scrapyd-deploy`` builds and uploads the egg,
``ScrapydClient`` talks to scrapyd's JSON API). Run it from the project root
with the project's virtualenv::

    export SCRAPYD_USERNAME=crawler SCRAPYD_PASSWORD=...      # as on the nodes
    python deploy/cluster.py deploy                          # every [deploy:*] target
    python deploy/cluster.py start quotes -k 4 -s MAX_IDLE_TIME_BEFORE_CLOSE=60
    python deploy/cluster.py jobs
    python deploy/cluster.py stop quotes

Nodes are, in order of precedence: ``--node URL`` (repeatable), ``$SCRAPYD_NODES``
(comma-separated URLs), or the ``[deploy:NAME]`` targets of ``scrapy.cfg``
(all of them, or those named with ``--target NAME``). Credentials come from
``$SCRAPYD_USERNAME``/``$SCRAPYD_PASSWORD`` (the variables scrapyd itself
reads), or from a target's ``username``/``password``, which may be written
``${SCRAPYD_PASSWORD}`` (scrapyd-client expands environment variables).
Credentials are never printed or written to disk.

The egg carries only the ``crawler`` package: it is built from a copy of
``crawler/`` with a ``setup.py`` of its own, so the project needs none and
tests stay out. Dependencies are installed on each node with ``pip install -r
requirements.txt`` in scrapyd's environment, as scrapyd's documentation
recommends.

Settings given with ``-s`` apply to the workers of that ``start`` only.
``FRONTIER_SHARDS`` must be the same for every worker of a crawl (a worker
with another count than the crawl recorded in ``{<spider>}:shards`` stops
with a configuration error): set it in ``crawler/settings.py`` and deploy,
or pass the same ``-s FRONTIER_SHARDS=N`` to every ``start`` of the crawl;
``scrapy frontier clear SPIDER --yes`` (workers stopped) starts a crawl
afresh with another count.

It needs scrapyd-client, an extra of the package: ``pip install '.[deploy]'``
(in a checkout, ``pip install -r requirements-deploy.txt``); without it, it
says so in one line and exits 1.

Exit status: 0 on success, 1 when a node refused or failed a request.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    from scrapyd_client.pyclient import ScrapydClient
    from scrapyd_client.utils import get_config
except ImportError as exc:  # the deploy tools are an extra of the package
    sys.exit(
        f"deploy/cluster.py needs scrapyd-client ({exc}): run pip install '.[deploy]' "
        "(or, in a checkout, pip install -r requirements-deploy.txt)"
    )

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "crawler"

SETUP_PY = """\
from setuptools import find_packages, setup

setup(
    name={name!r},
    version={version!r},
    packages=find_packages(include=[{package!r}, {package!r} + ".*"]),
    package_data={{{package!r}: ["*.lua", "**/*.lua"]}},
    entry_points={{"scrapy": ["settings = {package}.settings"]}},
    zip_safe=False,
)
"""


@dataclass
class Node:
    """One scrapyd node: a name, its URL and credentials (never printed)."""

    name: str
    url: str
    username: str
    password: str
    project: str

    def client(self) -> ScrapydClient:
        """A scrapyd-client API client for this node."""
        return ScrapydClient(self.url.rstrip("/"), self.username or None, self.password or None)


def nodes_from(opts: argparse.Namespace) -> list[Node]:
    """The nodes named by ``--node``, ``$SCRAPYD_NODES`` or scrapy.cfg targets."""
    username = os.environ.get("SCRAPYD_USERNAME", "")
    password = os.environ.get("SCRAPYD_PASSWORD", "")
    cfg = get_config()
    default_project = opts.project or (
        cfg.get("deploy", "project") if cfg.has_option("deploy", "project") else PACKAGE
    )
    urls = opts.node or [u for u in os.environ.get("SCRAPYD_NODES", "").split(",") if u.strip()]
    if urls:
        return [
            Node(f"node{i}", url.strip(), username, password, default_project)
            for i, url in enumerate(urls, 1)
        ]
    nodes = []
    for section in cfg.sections():
        if not section.startswith("deploy:"):
            continue
        name = section.removeprefix("deploy:")
        if opts.target and name not in opts.target:
            continue
        target = dict(cfg.items(section))
        nodes.append(
            Node(
                name,
                target["url"],
                target.get("username") or username,
                target.get("password") or password,
                opts.project or target.get("project") or default_project,
            )
        )
    if not nodes:
        sys.exit("no scrapyd nodes: use --node URL, $SCRAPYD_NODES or [deploy:NAME] in scrapy.cfg")
    return nodes


def build_egg(workdir: Path, version: str) -> Path:
    """Build the egg of the ``crawler`` package with ``scrapyd-deploy --build-egg``.

    :returns: the egg's path, inside ``workdir``.
    :raises subprocess.CalledProcessError: the build failed.
    """
    stage = workdir / "stage"
    shutil.copytree(
        ROOT / PACKAGE, stage / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (stage / "setup.py").write_text(
        SETUP_PY.format(name=PACKAGE, version=version, package=PACKAGE), encoding="utf-8"
    )
    (stage / "scrapy.cfg").write_text(
        f"[settings]\ndefault = {PACKAGE}.settings\n\n[deploy]\nproject = {PACKAGE}\n",
        encoding="utf-8",
    )
    egg = workdir / f"{PACKAGE}-{version}.egg"
    subprocess.run(
        [_tool("scrapyd-deploy"), "--build-egg", str(egg)],
        cwd=stage,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return egg


def upload(node: Node, egg: Path, version: str, workdir: Path) -> bool:
    """Upload ``egg`` to ``node`` with ``scrapyd-deploy --egg`` (addversion.json).

    The target is written to a scrapy.cfg in ``workdir`` with the URL only;
    credentials reach scrapyd-deploy through the environment.
    """
    cfg_dir = workdir / f"target-{node.name}"
    cfg_dir.mkdir()
    (cfg_dir / "scrapy.cfg").write_text(
        f"[settings]\ndefault = {PACKAGE}.settings\n\n"
        f"[deploy:{node.name}]\nurl = {node.url}\nproject = {node.project}\n"
        "username = ${CLUSTER_DEPLOY_USERNAME}\npassword = ${CLUSTER_DEPLOY_PASSWORD}\n",
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "CLUSTER_DEPLOY_USERNAME": node.username,
        "CLUSTER_DEPLOY_PASSWORD": node.password,
    }
    result = subprocess.run(
        [_tool("scrapyd-deploy"), node.name, "--egg", str(egg), "--version", version],
        cwd=cfg_dir,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        print(f"{node.name}: deploy failed: {result.stdout.strip()}", file=sys.stderr)
        return False
    print(f"{node.name}: deployed {node.project} {version}: {result.stdout.strip()}")
    return True


def _tool(name: str) -> str:
    """Path of a console script of this interpreter's environment."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def cmd_deploy(nodes: list[Node], opts: argparse.Namespace) -> int:
    version = opts.version or time.strftime("%Y%m%d%H%M%S")
    with tempfile.TemporaryDirectory(prefix="crawler-deploy-") as tmp:
        egg = build_egg(Path(tmp), version)
        ok = [upload(node, egg, version, Path(tmp)) for node in nodes]
    return 0 if all(ok) else 1


def cmd_start(nodes: list[Node], opts: argparse.Namespace) -> int:
    args = [("setting", s) for s in opts.set] + [tuple(a.split("=", 1)) for a in opts.arg]
    status = 0
    for node in nodes:
        client = node.client()
        for _ in range(opts.workers):
            try:
                job = client.schedule(node.project, opts.spider, args)  # type: ignore[arg-type]
            except Exception as exc:  # scrapyd-client raises several types
                print(f"{node.name}: schedule failed: {exc}", file=sys.stderr)
                status = 1
                break
            print(json.dumps({"node": node.name, "spider": opts.spider, "job": job}))
    return status


def cmd_stop(nodes: list[Node], opts: argparse.Namespace) -> int:
    status = 0
    for node in nodes:
        client = node.client()
        try:
            jobs = client.jobs(node.project)
        except Exception as exc:
            print(f"{node.name}: listjobs failed: {exc}", file=sys.stderr)
            status = 1
            continue
        for job in jobs.get("pending", []) + jobs.get("running", []):
            if opts.spider and job.get("spider") != opts.spider:
                continue
            client.cancel(node.project, job["id"])
            cancelled = {"node": node.name, "spider": job.get("spider"), "cancelled": job["id"]}
            print(json.dumps(cancelled))
    return status


def cmd_jobs(nodes: list[Node], opts: argparse.Namespace) -> int:
    status = 0
    for node in nodes:
        try:
            jobs = node.client().jobs(node.project)
        except Exception as exc:
            print(f"{node.name}: listjobs failed: {exc}", file=sys.stderr)
            status = 1
            continue
        for state in ("pending", "running", "finished"):
            for job in jobs.get(state, []):
                print(json.dumps({"node": node.name, "state": state, **job}))
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="deploy/cluster.py", description="Deploy and run the crawler on scrapyd nodes"
    )
    parser.add_argument("--node", action="append", metavar="URL", help="scrapyd URL (repeatable)")
    parser.add_argument(
        "--target", action="append", metavar="NAME", help="scrapy.cfg [deploy:NAME] (repeatable)"
    )
    parser.add_argument("--project", help="scrapyd project (default: scrapy.cfg's, or crawler)")
    sub = parser.add_subparsers(dest="command", required=True)
    deploy = sub.add_parser("deploy", help="build the egg once and upload it to every node")
    deploy.add_argument("--version", help="version to deploy (default: a timestamp)")
    start = sub.add_parser("start", help="schedule K jobs (workers) of SPIDER on every node")
    start.add_argument("spider")
    start.add_argument("-k", "--workers", type=int, default=1, help="jobs per node (default: 1)")
    start.add_argument(
        "-s", "--set", action="append", default=[], metavar="NAME=VALUE", help="Scrapy setting"
    )
    start.add_argument(
        "-a", "--arg", action="append", default=[], metavar="NAME=VALUE", help="spider argument"
    )
    stop = sub.add_parser("stop", help="cancel the pending and running jobs (of SPIDER)")
    stop.add_argument("spider", nargs="?")
    sub.add_parser("jobs", help="list the jobs of every node, one JSON object a line")
    opts = parser.parse_args(argv)
    os.chdir(ROOT)
    nodes = nodes_from(opts)
    commands = {"deploy": cmd_deploy, "start": cmd_start, "stop": cmd_stop, "jobs": cmd_jobs}
    return commands[opts.command](nodes, opts)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except BrokenPipeError:
        # The reader of stdout went away (``cluster.py jobs | grep -q``):
        # stop quietly, as a Unix filter does on SIGPIPE (Python's signal
        # docs, "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
