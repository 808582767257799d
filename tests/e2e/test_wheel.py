"""The distribution a user installs: the wheel built from this repository, installed into a fresh venv (no repository
on its path), gives the client and the CLI against a running ``inferq up``, installs only ``inferq*`` import names,
and ``import inferq.client`` loads no Redis library (none is installed: the queue's dependencies are extras)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, Emulator

pytestmark = pytest.mark.slow

UNTRACKED = (".git", ".venv", ".tools", ".inferq", ".aws-sam", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
             ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", "out")
SERVER_ONLY = {"redis", "hiredis", "orjson", "yaml", "fastapi", "starlette", "boto3", "botocore", "mangum", "uvicorn"}


class Installed:
    """A fresh venv holding the built wheel and its dependencies; commands run outside the repository."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / "venv" / "bin"
        self.cwd = root / "elsewhere"
        self.cwd.mkdir()
        # nothing of the repository or the dev venv leaks in: no PYTHONPATH, no INFERQ_* of the caller
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("INFERQ_", "PYTHON", "VIRTUAL_ENV"))}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120)
        if check:
            assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done

    def python(self, code: str) -> str:
        return self.run(str(self.bin / "python"), "-c", code).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    # from a copy of the tree as a clone has it: setuptools' build/ of an earlier build in the checkout would leak
    # stale files into the wheel
    source = root / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*UNTRACKED))
    # the dev venv has setuptools and wheel (make install): no build isolation, so the build needs no index
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(dist), str(source)],
                   check=True, capture_output=True, timeout=120, cwd=root)
    [wheel] = dist.glob("inferq-*.whl")
    venv.create(root / "venv", with_pip=False)
    target = Installed(root)
    # the dev venv's pip installs into the fresh venv (--python): the wheel and what it declares, nothing else
    target.run(sys.executable, "-m", "pip", "--python", str(target.bin / "python"), "install", "--quiet",
               "--disable-pip-version-check", str(wheel))
    yield target


def test_wheel_installs_only_inferq_import_names(installed: Installed) -> None:
    names = json.loads(installed.python(
        "import importlib.metadata as m, json\n"
        "files = m.distribution('inferq').files\n"
        "tops = {f.parts[0].removesuffix('.py') for f in files if not f.parts[0].endswith('.dist-info')"
        " and f.parts[0] not in ('..', '__pycache__')}\n"
        "print(json.dumps(sorted(tops)))"))
    assert names, "the wheel installed no files"
    assert all(name.startswith("inferq") for name in names), f"the wheel installs non-inferq import names: {names}"
    assert names == ["inferq"], f"the wheel installs more than one import name: {names}"
    data = json.loads(installed.python(
        "import importlib.metadata as m, json\n"
        "print(json.dumps(sorted(str(f) for f in m.distribution('inferq').files if f.suffix in ('.lua', '.typed'))))"))
    assert "inferq/py.typed" in data and "inferq/queue/scripts/enqueue.lua" in data, data  # the protocol's scripts ship
    assert any(path.startswith("inferq/queue/scripts/includes/") for path in data), data
    for repo_only in ("functions", "gpu_worker", "emulator", "bench"):
        found = installed.python(f"import importlib.util; print(importlib.util.find_spec({repo_only!r}) is not None)")
        assert found.strip() == "False", f"{repo_only} is importable from the installed wheel"


def test_wheel_declares_the_client_dependencies_and_the_server_extras(installed: Installed) -> None:
    meta = json.loads(installed.python(
        "import importlib.metadata as m, json\n"
        "md = m.metadata('inferq')\n"
        "print(json.dumps({'extras': md.get_all('Provides-Extra'), 'requires': md.get_all('Requires-Dist')}))"))
    assert {"queue", "gateway", "scaler", "worker", "emulator", "vllm", "dev"} <= set(meta["extras"])
    base = sorted(r.split(">")[0].split("<")[0].split("=")[0].strip() for r in meta["requires"] if "extra ==" not in r)
    assert base == ["httpx", "rich", "standardwebhooks"], base
    redis = [r for r in meta["requires"] if r.startswith("redis")]
    assert redis and all('extra == "queue"' in r for r in redis), redis


def test_client_import_loads_no_redis(installed: Installed) -> None:
    loaded = json.loads(installed.python(
        "import sys, json\n"
        "import inferq.client, inferq.cli.main\n"
        "from inferq.client import Client, AsyncClient, verify_webhook\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"))
    assert "inferq" in loaded
    assert not SERVER_ONLY & set(loaded), f"import inferq.client loaded server libraries: {SERVER_ONLY & set(loaded)}"
    # and the client's install did not pull them in at all
    present = json.loads(installed.python(
        "import importlib.util, json\n"
        f"print(json.dumps([n for n in {sorted(SERVER_ONLY)!r} if importlib.util.find_spec(n) is not None]))"))
    assert present == [], f"pip install inferq installed server libraries: {present}"


def test_client_and_cli_against_inferq_up(installed: Installed, stack: Emulator) -> None:
    key = (stack.data_dir / "dev-api-key").read_text().strip()
    installed.env.update({"INFERQ_URL": stack.url, "INFERQ_API_KEY": key})
    inferq = str(installed.bin / "inferq")

    submitted = installed.run(inferq, "submit", "hello from the wheel", "--wait", "--json", "--timeout", "60")
    job = json.loads(submitted.stdout)
    assert job["status"] == "succeeded", submitted.stdout
    status = json.loads(installed.run(inferq, "status", job["id"], "--json").stdout)
    assert status["id"] == job["id"] and status["status"] == "succeeded"

    # the Python client, as a user imports it: one job that ends, one that hangs, one that fails every attempt
    ids = installed.python(
        "import os\n"
        "from inferq.client import Client\n"
        "def body(text, **mock):\n"
        "    return {'model': 'mock', 'messages': [{'role': 'user', 'content': text}], 'mock': mock}\n"
        "with Client(os.environ['INFERQ_URL'], os.environ['INFERQ_API_KEY']) as c:\n"
        "    job = c.submit(body('hi'))\n"
        "    done = c.wait(job.id, timeout=60)\n"
        "    hung = c.submit(body('hang', hang=True))\n"
        "    doomed = c.submit(body('doomed', fail_attempts=99))\n"
        "    dead = c.wait(doomed.id, timeout=60)\n"
        "    print(done.status.value, hung.id, dead.id, dead.status.value)\n").split()
    assert ids[0] == "succeeded" and ids[3] == "failed", ids
    hung_id, dead_id = ids[1], ids[2]

    cancelled = json.loads(installed.run(inferq, "cancel", hung_id, "--json").stdout)
    assert cancelled["id"] == hung_id and cancelled["status"] in {"running", "cancelled"}  # running: the worker ends it
    waited = installed.run(inferq, "wait", hung_id, "--json", "--timeout", "60", check=False)
    assert waited.returncode == 1, waited.stderr  # 1: a job that did not succeed
    assert json.loads(waited.stdout)["status"] == "cancelled"

    dlq = [json.loads(line) for line in installed.run(inferq, "dlq", "--json").stdout.splitlines()]
    assert dead_id in {job["id"] for job in dlq}, dlq
    redriven = json.loads(installed.run(inferq, "redrive", dead_id, "--json").stdout)
    assert redriven["id"] == dead_id and redriven["status"] in {"queued", "running"}, redriven  # back in the queue
    assert redriven["dead_lettered"] is False

    # inferq up needs the repository: a clear message, not a traceback
    up = installed.run(inferq, "up", check=False)
    assert up.returncode == 2
    assert "clone of the inferq repository" in up.stderr and "Traceback" not in up.stderr
