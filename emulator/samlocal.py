"""``make sam-local``: the gateway and scaler Lambdas under ``sam local``, against the emulator, with no AWS account
and no image registry (emulator/README.md, "sam local"). The HTTP API's authorizer runs as in AWS: before the gateway
on every route but the public ones, with the emulator's development key.

One command starts, in order, and on Ctrl-C or SIGTERM stops in reverse order:

1. a Docker engine: the one given (``--docker-host`` or ``DOCKER_HOST``, or ``/var/run/docker.sock`` answering),
   or a private dockerd with a bridge of its own (:mod:`emulator.dockerd`, needs root);
2. the Lambda base image, built offline by ``emulator/sam-base-image.sh`` (cached);
3. ``sam build`` into ``--data-dir/sam/build`` for this machine's architecture (the deployed template stays arm64:
   only the built copy says x86_64, and only it declares ``AWS_ENDPOINT_URL``, which points the functions at moto);
4. ``inferq up`` with Valkey and moto listening on the address the containers reach this machine at (the bridge's
   address; on Docker Desktop, 127.0.0.1, reached as ``host.docker.internal``) and its ECS agent's mock workers;
5. ``sam local start-api --skip-pull-image`` with an env-vars file written from the emulator's real addresses.

The scaler: ``--scaler emulator`` (default) keeps ``inferq up``'s loop (the real handler in a host process, every
``INFERQ_SCALER_INTERVAL_S``); ``--scaler lambda`` runs ``sam local invoke ScalerFunction`` every
``--scaler-every`` seconds instead; ``--scaler none`` leaves it to you:
``python -m emulator.samlocal invoke ScalerFunction`` (``make sam-invoke``) runs one invocation with the
running stack's engine, template and environment.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .dockerd import EngineUnavailable, which
from .sambuild import SAM, sam_build
from .samdocker import Docker, die_with_parent, say
from .valkey import free_port

ROOT = Path(__file__).resolve().parents[1]
BASE_IMAGE_SCRIPT = ROOT / "emulator" / "sam-base-image.sh"
STATE_FILE = "sam-local.json"
WAKE_EVENT = {"source": "inferq.sam-local", "detail-type": "manual invoke"}
"""Not EventBridge's scheduled event: the scaler evaluates once and returns (a scheduled one loops for a minute)."""
SECRETS_KEY = "alias/inferq-webhook-secrets"
"""INFERQ_WEBHOOK_SECRETS_KEY of the Lambdas and of the ``inferq up`` behind them: one KMS key in the emulator's moto
(``inferq up`` makes it), which the containers reach as they reach moto's S3. ``inferq up``'s own default, a key
file on this machine, is out of the containers' sight; and sam local would hand the template's ``!GetAtt
WebhookSecretsKey.Arn`` over as a made-up Lambda ARN, which the settings refuse."""
MOTO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m emulator.samlocal",
                                     description="The gateway and scaler Lambdas under `sam local`, against the "
                                     "emulator. `invoke FUNCTION` runs one `sam local invoke` against a running one.")
    parser.add_argument("command", nargs="*", help="empty to start; or: invoke FUNCTION [sam local invoke options]")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq/sam-local"),
                        help="emulator data, build, env-vars file (default .inferq/sam-local)")
    parser.add_argument("--host", default="127.0.0.1", help="address `sam local start-api` listens on")
    parser.add_argument("--api-port", type=int, default=3000, help="port of `sam local start-api` (default 3000)")
    parser.add_argument("--port", type=int, default=0,
                        help="port of the emulator's own gateway (default: a free one)")
    parser.add_argument("--docker-host", default=os.environ.get("DOCKER_HOST"),
                        help="the engine to use (default DOCKER_HOST, else /var/run/docker.sock, else a private one)")
    parser.add_argument("--private-engine", action="store_true",
                        help="always start a private dockerd with its own bridge (root), even if one is running")
    parser.add_argument("--container-host",
                        help="address the Lambda containers reach this machine at (default: the engine's bridge "
                        "address on Linux, host.docker.internal on Docker Desktop)")
    parser.add_argument("--service-host",
                        help="address Valkey and moto listen on (default: the container host's address on Linux, "
                        "127.0.0.1 on Docker Desktop)")
    parser.add_argument("--skip-base-image", action="store_true", default=sys.platform != "linux",
                        help="use the public.ecr.aws/lambda/python:3.13 image the engine has (pulled) instead of "
                        "building one with emulator/sam-base-image.sh (the default off Linux)")
    parser.add_argument("--warm-containers", choices=["EAGER", "LAZY"],
                        help="keep function containers between requests (sam's --warm-containers)")
    parser.add_argument("--scaler", choices=["emulator", "lambda", "none"], default="emulator",
                        help="who sizes the fleet: the emulator's loop (default), `sam local invoke ScalerFunction` "
                        "every --scaler-every seconds, or nobody until you run `make sam-invoke`")
    parser.add_argument("--scaler-every", type=float, default=10.0, help="seconds between scaler invocations")
    return parser.parse_args(argv)


def env_vars(endpoints: dict[str, Any], container_host: str, api_key: str | None) -> dict[str, dict[str, str]]:
    """``sam local``'s env-vars file: each function's variables, pointing at the emulator's services by the
    address its containers reach them at."""
    def reachable(url: str) -> str:
        host = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        return url.replace(f"://{host}:", f"://{container_host}:", 1)

    api_keys = f"dev:{api_key}" if api_key else os.environ.get("INFERQ_API_KEYS", "")
    log_levels = {"INFERQ_LOG_LEVEL": "INFO", "POWERTOOLS_LOG_LEVEL": "INFO"}
    common = {
        "INFERQ_REDIS_URL": reachable(endpoints["redis_url"]),
        "INFERQ_FILES_BUCKET": endpoints["files_bucket"],
        "AWS_ENDPOINT_URL": reachable(endpoints["aws_endpoint"]),
        "INFERQ_WEBHOOK_SECRETS_KEY": SECRETS_KEY,
        **log_levels,
    }
    return {
        "GatewayFunction": {
            **common,
            "INFERQ_API_KEYS_SECRET": "",
            "INFERQ_API_KEYS": api_keys,
            # no wake-up: the scaler runs on its own cadence here (`sam local` has no asynchronous invoke)
            "INFERQ_SCALER_FUNCTION": "",
            # as `inferq up`: every local tenant is an operator (the stack's default names one operator tenant)
            "INFERQ_ADMIN_TENANTS": os.environ.get("INFERQ_ADMIN_TENANTS", ""),
        },
        "ScalerFunction": {
            **common,
            "INFERQ_ECS_CLUSTER": endpoints["ecs_cluster"],
            "INFERQ_ECS_SERVICE": endpoints["ecs_service"],
            # no Spot here, so no on-demand fallback service beside the emulator's (as under `inferq up`); the
            # stack's SpotFallbackSeconds would have the scaler size one that does not exist
            "INFERQ_SCALE_SPOT_FALLBACK_S": "0",
        },
        # the HTTP API's authorizer runs before the gateway on every non-public route, with the same keys; no edge
        # here (no CloudFront in front of sam local): no origin header to require
        "AuthorizerFunction": {**log_levels, "INFERQ_API_KEYS_SECRET": "", "INFERQ_API_KEYS": api_keys,
                               "INFERQ_EDGE_ORIGIN_SECRET": ""},
    }


def sam_env(docker_env: dict[str, str]) -> dict[str, str]:
    """``sam``'s own environment: this engine, moto's credentials (sam hands them to the containers), no profile."""
    env = {k: v for k, v in docker_env.items() if not k.startswith("AWS_")}
    return {**env, **MOTO_CREDENTIALS, "SAM_CLI_TELEMETRY": "0"}


def invoke_command(state: dict[str, Any], function: str, *extra: str) -> list[str]:
    command = [str(SAM), "local", "invoke", function, "--template-file", state["template"], "--env-vars",
               state["env_vars"], "--skip-pull-image"]
    if not any(arg in ("-e", "--event", "--no-event") for arg in extra):
        command += ["--event", state["wake_event"]]
    return command + list(extra)


# ---------------------------------------------------------------------------------------------------- the run


class SamLocal:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.data_dir: Path = args.data_dir.resolve()
        self.docker = Docker(args)
        self.emulator: subprocess.Popen[bytes] | None = None
        self.api: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.state: dict[str, Any] = {}

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.stopping.set())
        code = 0
        try:
            self._start()
            while not self.stopping.wait(0.5):
                for name, process in (("inferq up", self.emulator), ("sam local start-api", self.api)):
                    if process is not None and process.poll() is not None:
                        say(f"{name} exited with {process.returncode}; stopping")
                        code = 1
                        self.stopping.set()
        except (EngineUnavailable, RuntimeError, TimeoutError, OSError) as exc:
            if not self.stopping.is_set():
                say(f"could not start: {exc}")
                code = 1
        finally:
            self.stopping.set()
            self._stop()
        return code

    def _start(self) -> None:
        started = time.monotonic()
        if not SAM.exists():
            raise RuntimeError(f"{SAM} is missing: run `make sam-tools`")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / STATE_FILE).unlink(missing_ok=True)
        self.docker.start()
        self._check_stop()
        if not self.args.skip_base_image:
            # pip of this Python (it has one: it installed the project) fetches the runtime's wheels
            script_env = {**self.docker.env, "SAM_VENV": str(SAM.parents[1]), "PYTHON": sys.executable}
            base = subprocess.run([str(BASE_IMAGE_SCRIPT)], env=script_env, capture_output=True, text=True,
                                  check=False)
            if base.returncode != 0:
                raise RuntimeError(f"emulator/sam-base-image.sh exited {base.returncode}:\n{base.stderr[-3000:]}")
            say(f"base image {base.stdout.strip()} ready")
        self._check_stop()
        template = sam_build(self.data_dir / "sam" / "build")
        self._check_stop()
        endpoints = self._start_emulator()
        api_key = None
        if endpoints.get("api_key_file"):
            api_key = Path(endpoints["api_key_file"]).read_text().strip()
        variables = env_vars(endpoints, self.docker.container_host, api_key)
        env_file = self.data_dir / "sam" / "env.json"
        env_file.write_text(json.dumps(variables, indent=2) + "\n")
        wake_event = self.data_dir / "sam" / "scaler-event.json"
        wake_event.write_text(json.dumps(WAKE_EVENT) + "\n")
        self.state = {
            "docker_host": self.docker.env["DOCKER_HOST"], "template": str(template), "env_vars": str(env_file),
            "wake_event": str(wake_event), "api": f"http://{self._probe_host()}:{self.args.api_port}",
            "api_key": api_key, "container_host": self.docker.container_host, "endpoints": endpoints,
            "pid": os.getpid(),
        }
        self._start_api(template, env_file)
        assert self.api is not None and self.emulator is not None
        self.state["children"] = {"sam local start-api": self.api.pid, "inferq up": self.emulator.pid}
        if self.docker.private:
            self.state["private_engine"] = str(self.docker.private.state)
        (self.data_dir / STATE_FILE).write_text(json.dumps(self.state, indent=2) + "\n")
        if self.args.scaler == "lambda":
            threading.Thread(target=self._scaler_loop, name="scaler", daemon=True).start()
        self._announce(time.monotonic() - started)

    def _check_stop(self) -> None:
        if self.stopping.is_set():
            raise RuntimeError("stopped while starting")

    def _probe_host(self) -> str:
        return "127.0.0.1" if self.args.host in ("0.0.0.0", "") else self.args.host

    def _start_emulator(self) -> dict[str, Any]:
        emulator_dir = self.data_dir / "emulator"
        endpoints_file = emulator_dir / "endpoints.json"
        endpoints_file.unlink(missing_ok=True)
        port = self.args.port or free_port()
        command = [sys.executable, "-m", "emulator.up", "--port", str(port), "--data-dir", str(emulator_dir),
                   "--service-host", self.docker.service_host, "--valkey-port", "0"]
        if self.args.scaler != "emulator":
            command.append("--no-scaler")
        say(f"starting the emulator: {' '.join(command[2:])}")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")},
               "INFERQ_WEBHOOK_SECRETS_KEY": SECRETS_KEY}
        self.emulator = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True,
                                         preexec_fn=die_with_parent)
        deadline = time.monotonic() + 120
        while not endpoints_file.exists():
            if self.emulator.poll() is not None:
                raise RuntimeError(f"inferq up exited with {self.emulator.returncode} (its log is above)")
            if time.monotonic() > deadline:
                raise TimeoutError("inferq up was not ready within 120 s")
            self._check_stop()
            time.sleep(0.2)
        return dict(json.loads(endpoints_file.read_text()))

    def _start_api(self, template: Path, env_file: Path) -> None:
        command = [str(SAM), "local", "start-api", "--template-file", str(template), "--env-vars", str(env_file),
                   "--skip-pull-image", "--host", self.args.host, "--port", str(self.args.api_port)]
        if self.args.warm_containers:
            command += ["--warm-containers", self.args.warm_containers]
        say("starting: sam local start-api " + " ".join(command[3:]))
        self.api = subprocess.Popen(command, cwd=self.data_dir, env=sam_env(self.docker.env),
                                    start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self._probe_host(), self.args.api_port), 1):
                break
            if self.api.poll() is not None:
                raise RuntimeError(f"sam local start-api exited with {self.api.returncode} (its log is above)")
            if time.monotonic() > deadline:
                raise TimeoutError("sam local start-api did not listen within 120 s")
            self._check_stop()
            time.sleep(0.3)
        # one request through a Lambda container, the whole chain: container -> Valkey and moto's S3
        first = time.monotonic()
        status = http_status(f"{self.state['api']}/readyz", timeout=120)
        say(f"first request through the Lambda (GET /readyz {status}, cold: sam builds its image on the base the "
            f"first time): {time.monotonic() - first:.1f}s")
        if status != 200:
            raise RuntimeError(f"GET /readyz through the Lambda answered {status}: the container does not reach "
                               f"Valkey or moto at {self.docker.container_host} (see emulator/README.md, networking)")

    def _scaler_loop(self) -> None:
        command = invoke_command(self.state, "ScalerFunction")
        while not self.stopping.wait(self.args.scaler_every):
            result = subprocess.run(command, cwd=self.data_dir, env=sam_env(self.docker.env), capture_output=True,
                                    text=True, check=False, preexec_fn=die_with_parent)
            answer = result.stdout.strip().splitlines()[-1:] or [f"exit {result.returncode}"]
            say(f"ScalerFunction: {answer[0]}")

    def _announce(self, took: float) -> None:
        api, key = self.state["api"], self.state["api_key"] or "<one of your INFERQ_API_KEYS>"
        say(f"ready in {took:.0f}s: the gateway Lambda on {api} (sam local start-api)")
        say(f"env-vars file {self.state['env_vars']}; built template {self.state['template']}")
        say("submit a job, then wait for it:")
        body = json.dumps({"body": {"model": "mock", "messages": [{"role": "user", "content": "Hello"}]}})
        say(f"  curl -s {api}/v1/jobs -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' -d '{body}'")
        say(f"  curl -s '{api}/v1/jobs/<id>?wait=20' -H 'Authorization: Bearer {key}'")
        say("run the scaler Lambda once: make sam-invoke   (python -m emulator.samlocal invoke ScalerFunction)")

    def _stop(self) -> None:
        say("stopping")
        started = time.monotonic()
        for name, process in (("sam local start-api", self.api), ("inferq up", self.emulator)):
            if process is None or process.poll() is not None:
                continue
            say(f"stopping {name} ({time.monotonic() - started:.1f}s)")
            process.send_signal(signal.SIGTERM)  # sam removes its containers; inferq up drains its workers
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                say(f"{name} did not stop in 60 s; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        with contextlib.suppress(Exception):
            self._remove_sam_containers()
        (self.data_dir / STATE_FILE).unlink(missing_ok=True)
        say(f"stopping the engine ({time.monotonic() - started:.1f}s)")
        self.docker.stop()
        say(f"stopped ({time.monotonic() - started:.1f}s)")

    def _remove_sam_containers(self) -> None:
        """Containers sam left (it removes its own on SIGTERM; a killed sam does not): those of our images."""
        if self.docker.private:
            return  # the whole engine goes
        listing = subprocess.run([self.docker.docker, "ps", "-a", "--format", "{{.ID}} {{.Image}}"],
                                 env=self.docker.env, capture_output=True, text=True, check=False).stdout
        ids = [line.split()[0] for line in listing.splitlines()
               if "public.ecr.aws/lambda/python" in line or "samcli/lambda" in line]
        if ids:
            subprocess.run([self.docker.docker, "rm", "--force", *ids], env=self.docker.env, capture_output=True,
                           check=False)


def http_status(url: str, *, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (a local URL of ours)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def invoke(args: argparse.Namespace) -> int:
    """``invoke FUNCTION [sam options]``: ``sam local invoke`` against the stack ``--data-dir`` holds."""
    state_file = args.data_dir.resolve() / STATE_FILE
    if not state_file.exists():
        print(f"sam-local: nothing running with --data-dir {args.data_dir} (start it with `make sam-local`)",
              file=sys.stderr)
        return 1
    state = json.loads(state_file.read_text())
    function = args.command[1] if len(args.command) > 1 else "ScalerFunction"
    env = sam_env({**os.environ, "DOCKER_HOST": state["docker_host"]})
    # in the caller's directory: an --event path is relative to it
    return subprocess.run(invoke_command(state, function, *args.command[2:]), env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    args, unknown = parse_args_with_passthrough(list(sys.argv[1:] if argv is None else argv))
    if args.command[:1] == ["invoke"]:
        args.command += unknown
        return invoke(args)
    if args.command or unknown:
        print(f"sam-local: unknown arguments {' '.join(args.command + unknown)}", file=sys.stderr)
        return 2
    if which("dockerd") is None and not args.docker_host and not Path("/var/run/docker.sock").exists():
        print("sam-local: no Docker engine: install Docker (Debian: apt-get install docker.io debootstrap), or give "
              "--docker-host", file=sys.stderr)
        return 1
    if not args.skip_base_image and which("debootstrap") is None:
        print("sam-local: the Lambda base image is built with debootstrap: install it (Debian: apt-get install "
              "debootstrap), or pull public.ecr.aws/lambda/python:3.13-<arch> and pass --skip-base-image",
              file=sys.stderr)
        return 1
    return SamLocal(args).run()


def parse_args_with_passthrough(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """``invoke`` hands options it does not know to ``sam local invoke`` (``--event``, ``--debug``...)."""
    if argv[:1] == ["invoke"]:
        known = [a for a in argv if a.startswith("--data-dir")]
        rest = [a for a in argv if not a.startswith("--data-dir")]
        if "--data-dir" in rest:
            i = rest.index("--data-dir")
            known += rest[i:i + 2]
            del rest[i:i + 2]
        args = parse_args(known)
        args.command = rest[:2]
        return args, rest[2:]
    return parse_args(argv), []


if __name__ == "__main__":
    raise SystemExit(main())
