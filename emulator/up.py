"""``inferq up``: the whole stack on one machine (docs/architecture.md), supervised by one asyncio process.

Children and their roles: Valkey (``valkey``, restarted if it dies), the gateway under uvicorn (``gateway``), the
scaler loop around the real Lambda handler (``scaler``), and the workers the ECS agent starts (``worker-N``).
moto (ECS and CloudWatch) and the agent run inside this process; see ``emulator.ecs`` for why.

Stopping (Ctrl-C, SIGTERM): the gateway and scaler stop, workers drain (SIGTERM, SIGKILL after the stop timeout),
Valkey stops last so the drain can hand work back. Children die with this process even if it is SIGKILLed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from inferq.config.registry import Registry
from inferq.config.registry import load as load_registry
from inferq.config.settings import Settings, SettingsError, load_or_exit

from .host import aws_env, bind_error, create_bucket, create_key_alias, dev_api_key, lock_data_dir
from .httpd import get_status
from .procs import Child, LogSink
from .valkey import ValkeyProcess, free_port

EMULATOR_SCALER_INTERVAL_S = "2"
EMULATOR_SCALE_DEFAULTS = {"INFERQ_SCALE_BOOT_S": "0"}
DEFAULT_VALKEY_PORT = 6380
DEFAULT_FILES_BUCKET = "inferq-files"
READY_TIMEOUT_S = 60.0
ENDPOINTS_FILE = "endpoints.json"
WEBHOOK_SECRETS_KEY_FILE = "webhook-secrets.key"
"""The local master key of the tenants' webhook secrets (inferq/webhooks/envelope.py), made on first use, mode 0600."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferq up", description="Run the whole inferq stack on this machine.")
    parser.add_argument("--host", default="127.0.0.1", help="address the gateway listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--data-dir", type=Path, default=Path(".inferq"), help="Valkey data, dev key (default .inferq)")
    parser.add_argument("--redis-url", help="use this Redis/Valkey instead of starting the embedded Valkey")
    parser.add_argument("--valkey-port", type=int, default=None,
                        help=f"port of the embedded Valkey (default {DEFAULT_VALKEY_PORT}, or a free one when that is "
                        "taken; 0 always picks a free one)")
    parser.add_argument("--service-host", default="127.0.0.1",
                        help="address Valkey and moto listen on (default 127.0.0.1); `make sam-local` gives the "
                        "address its Lambda containers reach this machine at")
    parser.add_argument("--no-scaler", action="store_true",
                        help="run no scaler loop: something else sizes the fleet (`sam local invoke ScalerFunction`)")
    return parser.parse_args(argv)




class Supervisor:
    def __init__(self, args: argparse.Namespace, settings: Settings, env: dict[str, str],
                 registry: Registry | None = None) -> None:
        from .ecs import MotoEcs, Names

        self.args = args
        self.settings = settings
        self.env = env
        self.registry = registry
        """With a model registry: one ECS service, agent and fleet per model."""
        self.data_dir: Path = args.data_dir.resolve()
        self.sink = LogSink()
        self.stop_event = asyncio.Event()
        self.valkey: ValkeyProcess | None = None
        self.redis_url = args.redis_url or ""
        self.names = Names(settings.ecs_cluster or "inferq", settings.ecs_service or "inferq-workers")
        self.stop_timeout_s = float(min(settings.drain_s + 5, 120))
        services = [m.service for m in registry.models] if registry else []
        self.ecs = MotoEcs(self.names, host=args.service_host, port=free_port(args.service_host),
                           stop_timeout_s=int(self.stop_timeout_s), services=services)
        self.wake_port = free_port()
        self.children: dict[str, Child] = {}
        self.child_env: dict[str, str] = {}
        self.agent: Any = None
        self.agents: list[Any] = []
        self.api_key: str | None = None
        self.ready = False
        self.startup_failure: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ startup

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop_event.set)
        code = 0
        started = asyncio.create_task(self._start())
        stopped = asyncio.create_task(self.stop_event.wait())
        try:
            done, _ = await asyncio.wait({started, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if started in done and started.exception() is None:
                await self.stop_event.wait()
            elif started in done:
                self.sink.say(f"inferq: could not start: {started.exception()}")
                code = 1
            else:
                started.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await started
            if self.startup_failure:
                self.sink.say(f"inferq: could not start: {self.startup_failure}")
                code = 1
        finally:
            stopped.cancel()
            self.sink.say("inferq: stopping")
            await self._shutdown()
            self.sink.say("inferq: stopped")
            self.sink.flush()
        return code

    async def _start(self) -> None:
        t0 = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)
        keys_env: dict[str, str] = {}
        if self.settings.api_keys is None and self.settings.api_keys_secret is None:
            self.api_key = dev_api_key(self.data_dir)
            keys_env["INFERQ_API_KEYS"] = f"dev:{self.api_key}"
        if not self.redis_url:
            self._start_valkey()
        child_env = {
            "INFERQ_WEBHOOK_ALLOW_PRIVATE": "true",  # local receivers are the point here (the shell may say false)
            # the tenants' webhook secrets sealed in Valkey as in AWS, with a local key in place of KMS's
            "INFERQ_WEBHOOK_SECRETS_KEY": f"file:{(self.data_dir / WEBHOOK_SECRETS_KEY_FILE).resolve()}",
            **self.env,
            **aws_env(self.ecs.endpoint),
            **keys_env,
            "INFERQ_REDIS_URL": self.redis_url,
            "INFERQ_ECS_CLUSTER": self.names.cluster,
            "INFERQ_ECS_SERVICE": self.names.service,
            **({} if self.args.no_scaler else {"INFERQ_SCALER_WAKE_URL": f"http://127.0.0.1:{self.wake_port}/wake"}),
            "INFERQ_FILES_BUCKET": self.settings.files_bucket or DEFAULT_FILES_BUCKET,
            "PYTHONUNBUFFERED": "1",
        }
        # the wake goes to this scaler, not to a Lambda function; AWS goes to moto, whatever the shell had set
        for name in ("INFERQ_SCALER_FUNCTION", "AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_ECS"):
            child_env.pop(name, None)
        self.child_env = child_env
        # the gateway imports while moto starts, and uvicorn starts (and listens) only once the files bucket exists
        # (emulator.gateway), so no client ever reaches a gateway whose Files or Batches would answer 503 for want of a
        # bucket
        await self._spawn("gateway", [
            sys.executable, "-m", "emulator.gateway", "uvicorn", "functions.gateway.app:app", "--host", self.args.host,
            "--port", str(self.args.port), "--timeout-graceful-shutdown", "5", "--no-server-header",
            "--no-access-log",  # the gateway logs every request itself, as JSON
        ])
        await asyncio.to_thread(self.ecs.start)
        secrets_key = child_env["INFERQ_WEBHOOK_SECRETS_KEY"]
        if secrets_key.startswith("alias/"):  # a KMS key named (make sam-local): moto's, made before anyone seals
            await asyncio.to_thread(create_key_alias, self.ecs.endpoint, secrets_key)
        await asyncio.to_thread(create_bucket, self.ecs.endpoint, child_env["INFERQ_FILES_BUCKET"])
        # EMF metrics are for CloudWatch: a JSON blob every tick would drown the log (POWERTOOLS_METRICS_DISABLED=false
        # brings them back)
        scaler_env = {"POWERTOOLS_METRICS_DISABLED": self.env.get("POWERTOOLS_METRICS_DISABLED", "true")}
        if not self.args.no_scaler:
            await self._spawn("scaler", [sys.executable, "-m", "emulator.scaler", "--wake-port", str(self.wake_port)],
                              scaler_env)
        from .agent import start_fleets

        worker_env = {k: v for k, v in child_env.items() if k != "INFERQ_SCALER_WAKE_URL"}
        metrics_base = self.settings.metrics_port if "INFERQ_METRICS_PORT" in self.env else 0
        self.agents = await start_fleets(
            self.ecs, self.registry, self.sink, worker_env, stop_timeout_s=self.stop_timeout_s,
            metrics_port_base=metrics_base, log_protection=self.settings.log_level == "DEBUG",
            boot_s=self.settings.emulator_boot_s, interrupt_every_s=self.settings.emulator_interrupt_every_s,
        )
        self.agent = self.agents[0]
        await self._wait_ready()
        self.ready = True
        self._announce(time.monotonic() - t0)
        self._background(self._supervise_valkey())

    def _start_valkey(self) -> None:
        host = self.args.service_host
        port = self.args.valkey_port or free_port(host)
        self.valkey = ValkeyProcess(
            self.data_dir / "valkey", host=host, port=port, appendfsync="everysec",
            log_file=self.data_dir / "valkey.log",
        )
        self.redis_url = self.valkey.url
        self._valkey_start()
        self._background(self._tail_valkey_log(self.data_dir / "valkey.log"))

    def _valkey_start(self) -> None:
        """Start (or restart) Valkey from the main thread with SIGINT blocked: the server inherits the mask, so a
        Ctrl-C does not stop it before the workers have drained, and PR_SET_PDEATHSIG is tied to this thread."""
        assert self.valkey is not None
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.valkey.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        self.sink.line("valkey", f"ready on {self.valkey.url} (pid {self.valkey.pid}, AOF everysec, "
                                 f"data in {self.valkey.data_dir})")

    async def _spawn(self, role: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = await Child(role, argv, {**self.child_env, **(env or {})}, self.sink).start()
        self.children[role] = child
        self._background(self._restart_on_exit(child))
        return child

    async def _restart_on_exit(self, child: Child) -> None:
        """Keep gateway and scaler up (compose's ``restart: always``), with a pause so a crash loop stays quiet."""
        code = await child.wait()
        if self.stop_event.is_set() or self.children.get(child.role) is not child:
            return
        if not self.ready:  # a child that cannot start now will not start in a loop either: say so and stop
            self.startup_failure = f"{child.role} exited with {code} while starting (its log is above)"
            self.stop_event.set()
            return
        lived = time.monotonic() - child.started_at
        delay = 1.0 if lived > 10 else 3.0
        self.sink.line(child.role, f"exited with {code}; restarting in {delay:g}s")
        await asyncio.sleep(delay)
        if not self.stop_event.is_set():
            await self._spawn(child.role, child.argv, child.env)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            # the scaler's wake hook must answer too, or the first submit's wake would be refused
            if await get_status(self._probe_host(), self.args.port, "/readyz") == 200 and (
                self.args.no_scaler or await self._listening("127.0.0.1", self.wake_port)
            ):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"the gateway did not answer 200 on /readyz within {READY_TIMEOUT_S:g}s")

    @staticmethod
    async def _listening(host: str, port: int) -> bool:
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            return False
        writer.close()
        return True

    def _probe_host(self) -> str:
        return "127.0.0.1" if self.args.host in ("0.0.0.0", "") else self.args.host

    def _announce(self, took: float) -> None:
        url = f"http://{self._probe_host()}:{self.args.port}"
        (self.data_dir / "url").write_text(url + "\n")
        self._write_endpoints(url)
        say = self.sink.say
        say(f"inferq: ready on http://{self.args.host}:{self.args.port}")
        say(f"inferq: started in {took:.1f}s")
        key = self.api_key or "<one of your INFERQ_API_KEYS>"
        if self.api_key:
            say(f"inferq: development API key (kept in {self.data_dir / 'dev-api-key'}): {self.api_key}")
        model = self.registry.primary.name if self.registry else "mock"  # a registry refuses unknown models
        option = f" --model {model}" if self.registry else ""
        say("inferq: submit a job:")
        say(f"  curl -s {url}/v1/jobs -H 'Authorization: Bearer {key}' -H 'Content-Type: application/json' \\")
        body = json.dumps({"body": {"model": model, "messages": [{"role": "user", "content": "Hello"}]}})
        say(f"    -d '{body}'")
        say(f"  .venv/bin/inferq submit 'Hello'{option} --wait --data-dir {self.args.data_dir}")
        say(f"  .venv/bin/inferq status --data-dir {self.args.data_dir}")

    def _write_endpoints(self, url: str) -> None:
        """``--data-dir/endpoints.json``: where each service of this stack answers, for tools that run the
        functions elsewhere (``make sam-local`` writes its ``sam local`` environment from it). Removed on stop."""
        endpoints = {
            "gateway": url,
            "redis_url": self.redis_url,
            "aws_endpoint": self.ecs.endpoint,
            "ecs_cluster": self.names.cluster,
            "ecs_service": self.names.service,
            "files_bucket": self.child_env["INFERQ_FILES_BUCKET"],
            "api_key_file": str(self.data_dir / "dev-api-key") if self.api_key else None,
            "scaler": not self.args.no_scaler,
            # each fleet's ECS agent: `inferq interrupt` asks one to interrupt a worker as Spot does
            "agents": {agent.service: f"http://127.0.0.1:{agent.port}" for agent in self.agents},
        }
        path = self.data_dir / ENDPOINTS_FILE
        path.with_suffix(".tmp").write_text(json.dumps(endpoints, indent=2) + "\n")
        path.with_suffix(".tmp").replace(path)

    # ------------------------------------------------------------------ Valkey supervision

    async def _supervise_valkey(self) -> None:
        while self.valkey is not None and not self.stop_event.is_set():
            await asyncio.sleep(0.5)
            if self.valkey.running() or self.stop_event.is_set():
                continue
            code = self.valkey.process.returncode if self.valkey.process else None
            self.sink.line("valkey", f"exited with {code}; restarting (AOF replay)")
            try:
                self._valkey_start()
            except (RuntimeError, TimeoutError, OSError) as exc:
                self.sink.line("valkey", f"restart failed: {exc}; retrying")
                await asyncio.sleep(1.0)

    async def _tail_valkey_log(self, path: Path) -> None:
        position = await asyncio.to_thread(lambda: path.stat().st_size if path.exists() else 0)
        buffered = b""
        while True:
            await asyncio.sleep(0.3)
            try:
                with path.open("rb") as log:
                    log.seek(position)
                    chunk = log.read()
            except FileNotFoundError:
                continue
            position += len(chunk)
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if line.strip():
                    self.sink.line("valkey", line.decode(errors="replace"))

    # ------------------------------------------------------------------ shutdown

    def _background(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _shutdown(self) -> None:
        self.stop_event.set()
        for task in list(self._tasks):
            task.cancel()
        steps: list[Coroutine[Any, Any, Any]] = [c.stop(10.0) for c in self.children.values()]
        steps.extend(agent.shutdown() for agent in self.agents)
        await asyncio.gather(*steps, return_exceptions=True)
        if self.valkey is not None:
            self.valkey.stop()
        self.ecs.stop()
        (self.data_dir / ENDPOINTS_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    env = dict(os.environ)
    env.setdefault("INFERQ_SCALER_INTERVAL_S", EMULATOR_SCALER_INTERVAL_S)
    # workers here start in about a second: no boot forecast unless asked for (`make bench`'s real-loop scenario
    # sets it, with the agent's emulated boot, INFERQ_EMULATOR_BOOT_S)
    for name, value in EMULATOR_SCALE_DEFAULTS.items():
        env.setdefault(name, value)
    settings = load_or_exit(env)
    if settings.models:  # the children may run elsewhere in the tree: give them the file's absolute path
        env["INFERQ_MODELS"] = str(Path(settings.models).resolve())
        settings = settings.replace(models=env["INFERQ_MODELS"])
    try:
        registry = load_registry(settings)
    except SettingsError as exc:
        print(f"inferq: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.redis_url:
        try:
            Settings.from_env({"INFERQ_REDIS_URL": args.redis_url})
        except SettingsError as exc:
            print(f"inferq up: --redis-url {exc.args[0].split(': ', 1)[1]}", file=sys.stderr)
            return 2
    ports = [("--port", args.host, args.port)]
    if args.valkey_port is None:
        # the fixed default lets `sam local` find the emulator's Valkey; a second stack on this machine still starts
        args.valkey_port = DEFAULT_VALKEY_PORT if bind_error(args.service_host, DEFAULT_VALKEY_PORT) is None else 0
    if not args.redis_url and args.valkey_port:
        ports.append(("--valkey-port", args.service_host, args.valkey_port))
    lock = lock_data_dir(args.data_dir)
    if lock is None:
        print(f"inferq up: another inferq up is using {args.data_dir}; stop it or choose another --data-dir",
              file=sys.stderr)
        return 1
    for option, host, port in ports:
        problem = bind_error(host, port)
        if problem:
            print(f"inferq up: {host}:{port} {problem}; choose another with {option}", file=sys.stderr)
            return 1
    try:
        return asyncio.run(Supervisor(args, settings, env, registry).run())
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
