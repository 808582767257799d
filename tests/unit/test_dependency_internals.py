"""The internals of dependencies inferq relies on (docs/development.md, "Private APIs of dependencies"), each checked
on the installed release: a release that renamed or reshaped one fails here, naming the range pyproject.toml pins,
instead of breaking the gateway or the worker at run time. Raise a bound in pyproject.toml only with these passing.

- redis-py: inferq/redis/fastpack.py reads a connection's ``_writer`` and ``_parser`` (its hiredis ``_reader``,
  built with ``redis._parsers.hiredis.NOT_ENOUGH_DATA``, ``_connected``, ``_hiredis_PushNotificationType``).
- Starlette: functions/gateway/hotpath.py hands a route's handler the app's exception handlers in the scope key
  ``starlette.exception_handlers``, as Starlette's exception middleware does.
- FastAPI: functions/gateway/hotpath.py runs a declined request's route under ``AsyncExitStackMiddleware`` (as
  FastAPI's app does), and finds the routes of included routers with ``fastapi.routing.iter_route_contexts``;
  functions/gateway/gateway.py parses ``Authorization`` with ``fastapi.security.utils``.
- moto (the emulator only): emulator/ecs.py drives ``moto.ecs.models.ecs_backends`` (documented backend models).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from inferq.config.settings import Settings
from inferq.redis.connection import connect

ROOT = Path(__file__).resolve().parents[2]


def pinned(name: str) -> str:
    """The range pyproject.toml gives ``name`` (in any extra), e.g. ``<9,>=5.0.1``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"].values()
    requirements = [*project["dependencies"], *(line for extra in extras for line in extra)]
    for line in requirements:
        requirement = Requirement(line)
        if requirement.name == name and str(requirement.specifier):
            return str(requirement.specifier)
    raise AssertionError(f"pyproject.toml gives {name} no version range")


def installed_within(name: str) -> str:
    """The installed version of ``name``, asserted to be in the pinned range; returns the message prefix."""
    version = importlib.metadata.version(name)
    spec = pinned(name)

    assert SpecifierSet(spec).contains(version, prereleases=True), (
        f"{name} {version} is outside the range pyproject.toml pins ({spec})")
    return f"{name} {version} (pinned {spec} in pyproject.toml, for inferq's use of its internals)"


def deployed() -> list[Requirement]:
    """Every requirement of the wheel and of its extras but ``dev`` (the test tools): what a user's client, a
    Lambda, a worker image or ``inferq up`` installs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [lines for extra, lines in project["optional-dependencies"].items() if extra != "dev"]
    lines = [*project["dependencies"], *(line for extra in extras for line in extra)]
    return [r for r in map(Requirement, lines) if r.name != project["name"]]


@pytest.mark.parametrize("requirement", deployed(), ids=str)
def test_every_deployed_dependency_has_an_upper_bound(requirement: Requirement) -> None:
    bounded = [s for s in requirement.specifier if s.operator in ("<", "<=", "==", "~=")]
    assert bounded, f"{requirement} has no upper bound in pyproject.toml: any release could break inferq"
    try:
        importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return  # an extra this environment does not install (vllm)
    installed_within(requirement.name)


async def test_redis_py_connection_internals_fastpack_uses(valkey: Any) -> None:
    what = installed_within("redis")
    import redis._parsers.hiredis as hiredis_parser  # the guard itself: these are the names inferq relies on

    assert hasattr(hiredis_parser, "NOT_ENOUGH_DATA"), f"{what}: redis._parsers.hiredis.NOT_ENOUGH_DATA is gone"
    client = connect(Settings.from_env({"INFERQ_REDIS_URL": valkey.url}))
    try:
        pool = client.connection_pool
        assert await client.ping()
        [connection] = pool._available_connections
        assert isinstance(connection._writer, asyncio.StreamWriter), f"{what}: Connection._writer changed"
        parser = connection._parser
        reader = getattr(parser, "_reader", None)
        import hiredis

        assert isinstance(reader, hiredis.Reader), f"{what}: the parser's _reader is no longer a hiredis.Reader"
        assert reader.gets() is hiredis_parser.NOT_ENOUGH_DATA, (
            f"{what}: the hiredis reader no longer answers NOT_ENOUGH_DATA for a reply still to come")
        assert getattr(parser, "_connected", None) is True, f"{what}: the parser's _connected flag is gone"
        assert hasattr(parser, "_hiredis_PushNotificationType"), f"{what}: _hiredis_PushNotificationType is gone"
        params = list(inspect.signature(type(connection).read_response).parameters)
        assert params[:3] == ["self", "disable_decoding", "timeout"] and {"disconnect_on_error", "push_request"} <= set(
            params), f"{what}: Connection.read_response's signature changed: {params}"
        assert list(inspect.signature(type(connection).send_packed_command).parameters) == [
            "self", "command", "check_health"], f"{what}: Connection.send_packed_command's signature changed"
        dispatcher = pool._event_dispatcher
        if dispatcher is not None:
            assert isinstance(getattr(dispatcher, "_event_listeners_mapping", None), dict), (
                f"{what}: EventDispatcher._event_listeners_mapping is gone")
    finally:
        await client.aclose()


async def test_starlette_routes_read_the_exception_handlers_scope_key_hotpath_sets() -> None:
    what = installed_within("starlette")
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    class Refused(Exception):
        pass

    async def endpoint(request: Request) -> PlainTextResponse:
        raise Refused

    async def on_refused(request: Request, exc: Exception) -> PlainTextResponse:
        return PlainTextResponse("handled", status_code=418)

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/x", "root_path": "", "headers": [],
                             "query_string": b"", "app": None,
                             "starlette.exception_handlers": ({Refused: on_refused}, {})}
    await Route("/x", endpoint).handle(scope, receive, send)
    assert sent and sent[0]["status"] == 418, (
        f"{what}: a route no longer answers with the handlers in scope['starlette.exception_handlers'], which "
        "functions/gateway/hotpath.py sets for a request its fast path declines")


async def test_fastapi_helpers_the_gateway_imports() -> None:
    what = installed_within("fastapi")
    from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
    from fastapi.security.utils import get_authorization_scheme_param

    assert get_authorization_scheme_param("Bearer k3y") == ("Bearer", "k3y"), f"{what}: get_authorization_scheme_param"
    seen: dict[str, Any] = {}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope)

    await AsyncExitStackMiddleware(app)({"type": "http"}, None, None)  # type: ignore[arg-type]
    assert seen.get("type") == "http", (
        f"{what}: AsyncExitStackMiddleware no longer runs the app it wraps")


def test_fastapi_lists_the_routes_of_included_routers_in_dispatch_order() -> None:
    """functions/gateway/hotpath.py finds submit and get, which sit in an included router, through
    ``fastapi.routing.iter_route_contexts``, and checks that the app's router would pick them first."""
    what = installed_within("fastapi")
    from fastapi import APIRouter, FastAPI
    from fastapi.routing import APIRoute, iter_route_contexts

    first, second = APIRouter(), APIRouter()
    first.add_api_route("/a", lambda: None, name="a")
    second.add_api_route("/b", lambda: None, name="b")
    app = FastAPI()
    app.include_router(first)
    app.include_router(second)
    names = [c.original_route.name for c in iter_route_contexts(app.router.routes)
             if isinstance(c.original_route, APIRoute)]
    assert names == ["a", "b"], f"{what}: iter_route_contexts lists {names}"


def test_moto_ecs_backend_model_the_emulator_drives() -> None:
    what = installed_within("moto")
    from moto.ecs.models import ecs_backends

    backend = ecs_backends["123456789012"]["us-east-1"]
    for method in ("create_cluster", "register_task_definition", "create_service", "run_task", "stop_task"):
        assert callable(getattr(backend, method, None)), f"{what}: the ECS backend has no {method} (emulator/ecs.py)"


@pytest.mark.parametrize("function", ["gateway", "scaler"])
def test_the_lambda_requirements_are_bounded_as_pyproject_is(function: str) -> None:
    lines = (ROOT / "functions" / function / "requirements.txt").read_text().splitlines()
    for line in (line.split("#")[0].strip() for line in lines):
        if not line:
            continue
        requirement = Requirement(line)
        assert "<" in str(requirement.specifier), f"functions/{function}/requirements.txt: {line} has no upper bound"
        assert str(requirement.specifier) == pinned(requirement.name), (
            f"functions/{function}/requirements.txt: {line} differs from pyproject.toml's {pinned(requirement.name)}")
