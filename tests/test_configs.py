"""The shipped config files are valid: Serve's schema, our AppConfig, the cluster launcher."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from serve_app.config import AppConfig

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = {"Router", "AuthService", "DecisionScorer", "EditModel", "FimModel"}


@pytest.mark.parametrize("name", ["local.yaml", "prod.yaml"])
def test_serve_config_is_valid(name):
    from ray.serve.schema import ServeDeploySchema

    document = yaml.safe_load((ROOT / "configs" / name).read_text())
    ServeDeploySchema.model_validate(document)
    (application,) = document["applications"]
    assert application["import_path"] == "serve_app.app:build_app"
    config = AppConfig.model_validate(application["args"])
    overridden = {deployment["name"] for deployment in application["deployments"]}
    assert overridden == DEPLOYMENTS
    for deployment in application["deployments"]:
        assert "autoscaling_config" in deployment and "ray_actor_options" in deployment
    if name == "prod.yaml":
        assert all(model.dtype == "bfloat16" for model in config.models)
        models = [
            d for d in application["deployments"] if d["name"] not in {"Router", "AuthService"}
        ]
        assert all(d["ray_actor_options"]["num_gpus"] == 1 for d in models)
    else:
        total_cpus = sum(d["ray_actor_options"]["num_cpus"] for d in application["deployments"])
        assert total_cpus <= 2.0, "the local graph must schedule on a 2-core machine"


def test_cluster_launcher_file_is_valid():
    from ray.autoscaler._private.util import prepare_config, validate_config

    document = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(document))
    assert document["available_node_types"]["gpu_worker"]["resources"]["GPU"] == 1


def test_unknown_config_keys_fail_loudly():
    with pytest.raises(ValueError):
        AppConfig.model_validate({"engine": {"max_batchsize": 4}})
    with pytest.raises(ValueError, match="unknown model"):
        AppConfig.model_validate({"roles": {"fim": "missing"}})
    two = [{"id": "a", "aliases": ["x"]}, {"id": "b", "aliases": ["x"]}]
    with pytest.raises(ValueError, match="unique"):
        AppConfig.model_validate(
            {"models": two, "roles": {"fim": "a", "edit": "a", "decisions": "a"}}
        )


def test_role_engines_change_only_their_deployments_engine():
    config = AppConfig.model_validate(
        {"engine": {"max_batch_size": 4}, "role_engines": {"fim": {"prompt_weights": "dense"}}}
    )
    fim = config.engine_for("fim")
    assert (fim.prompt_weights, fim.max_batch_size) == ("dense", 4)
    assert config.engine_for("edit") == config.engine
    scoring = config.engine_for("decisions")
    assert (scoring.task, scoring.max_batch_size) == ("score", 1)
    assert scoring == config.engine.for_scoring(config.limits.decision_max_scored_tokens)
    assert config.engine.prompt_weights == "auto"
    for wrong in ({"fim": {"prompt_weight": "dense"}}, {"fim": {"prompt_weights": "fp8"}}):
        with pytest.raises(ValueError, match="role_engines.fim"):
            AppConfig.model_validate({"role_engines": wrong})
    with pytest.raises(ValueError):
        AppConfig.model_validate({"role_engines": {"chat": {"max_batch_size": 2}}})


def test_the_engine_task_follows_the_role_never_the_yaml():
    for settings in (
        {"engine": {"task": "score"}},
        {"role_engines": {"fim": {"score_columns": 9}}},
    ):
        with pytest.raises(ValidationError, match="set by each role"):
            AppConfig.model_validate(settings)


def test_grafana_dashboard_queries_only_documented_metrics():
    """Every series the dashboard plots is one docs/operations.md documents (test_metrics checks
    export)."""
    import json
    import re

    dashboard = json.loads((ROOT / "configs" / "grafana" / "serve_app.json").read_text())
    operations = (ROOT / "docs" / "operations.md").read_text()
    documented = set(re.findall(r"^\| `(ray_serve_app_\w+)`", operations, re.MULTILINE))
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"ray_serve_app_\w+", target["expr"]):
                queried.add(re.sub(r"_(bucket|sum|count)$", "", name))
    assert len(documented) == 11
    assert queried == documented  # nothing plotted that is not exported, nothing left out


def test_listing_metadata_follows_the_model_source():
    """A model's listing describes what is served unless the config names it explicitly."""
    from serve_app.config import ModelConfig
    from serve_app.http.model_cards import model_card

    larger = model_card(ModelConfig(id="coder", source="embedded:qwen2.5-coder-1.5b"))
    assert larger.name == "Qwen2.5-Coder 1.5B Instruct" and "1.5B" in larger.description
    hub = model_card(ModelConfig(id="big", source="Qwen/Qwen2.5-Coder-7B-Instruct"))
    assert hub.name == "big" and "Qwen/Qwen2.5-Coder-7B-Instruct" in hub.description
    assert model_card(ModelConfig(id="x", source="tiny", name="Mine")).name == "Mine"


def test_prod_scaling_fits_the_cluster_and_the_engine_batch():
    """The rules docs/operations.md derives configs/prod.yaml's numbers from: a generating
    replica scales out at 3/4 of its engine batch and admits at most two batches; the model
    replicas' min and max add up to cluster.yaml's GPU workers; Router and AuthService fit the
    head's `ingress` slots, which no GPU worker has."""
    document = yaml.safe_load((ROOT / "configs" / "prod.yaml").read_text())
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    (application,) = document["applications"]
    batch = AppConfig.model_validate(application["args"]).engine.max_batch_size
    deployments = {d["name"]: d for d in application["deployments"]}
    for name in ("FimModel", "EditModel"):
        scaling = deployments[name]["autoscaling_config"]
        assert scaling["target_ongoing_requests"] == batch * 3 // 4
        assert deployments[name]["max_ongoing_requests"] == 2 * batch
        assert scaling["upscale_delay_s"] < scaling["downscale_delay_s"]
    models = [d for d in deployments.values() if d["ray_actor_options"].get("num_gpus")]
    gpu = cluster["available_node_types"]["gpu_worker"]
    assert sum(d["autoscaling_config"]["max_replicas"] for d in models) == gpu["max_workers"]
    assert sum(d["autoscaling_config"]["min_replicas"] for d in models) == gpu["min_workers"]
    ingress = [deployments["Router"], deployments["AuthService"]]
    assert all(d["ray_actor_options"]["resources"] == {"ingress": 1} for d in ingress)
    head = cluster["available_node_types"]["head"]["resources"]
    assert sum(d["autoscaling_config"]["max_replicas"] for d in ingress) <= head["ingress"]
    assert "ingress" not in gpu["resources"] and "GPU" not in head
    assert document["proxy_location"] == "HeadOnly"


def test_make_run_prepares_the_models_local_yaml_serves():
    """`make run` installs and converts exactly the embedded models the deployments load:
    each role's model and its draft model, not a model only listed."""
    from serve_app.prepare import served_embedded_models

    assert served_embedded_models(str(ROOT / "configs" / "local.yaml")) == [
        ("qwen2.5-coder-0.5b", None),
        ("qwen2.5-coder-1.5b", None),
    ]
    listed = {"id": "listed", "source": "embedded:qwen2.5-coder-1.5b"}
    drafted = {"id": "d", "source": "tiny", "draft_model": "small"}
    small = {"id": "small", "source": "embedded:qwen2.5-coder-0.5b"}
    config = AppConfig.model_validate(
        {"models": [listed, drafted, small], "roles": {"fim": "d", "edit": "d", "decisions": "d"}}
    )
    assert [model.id for model in config.served_models()] == ["d", "small"]
