"""docker/: the compose file, the service's ferry.toml and the Dockerfile are consistent (Docker cannot run here)."""

from __future__ import annotations

from pathlib import Path

import yaml

from ferry.service.config import load_config

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_has_two_minio_clusters_and_the_service() -> None:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = doc["services"]
    assert {"minio-east", "minio-west", "buckets", "ferry"} <= set(services)
    for name in ("minio-east", "minio-west"):
        assert services[name]["image"].startswith("minio/minio:")
    ferry = services["ferry"]
    assert ferry["build"]["dockerfile"] == "docker/Dockerfile"
    assert "8765:8765" in ferry["ports"]
    assert "./ferry.toml:/etc/ferry/ferry.toml:ro" in ferry["volumes"]
    assert ferry["depends_on"]["buckets"]["condition"] == "service_completed_successfully"
    env = ferry["environment"]
    assert {"EAST_ACCESS_KEY", "EAST_SECRET_KEY", "WEST_ACCESS_KEY", "WEST_SECRET_KEY", "FERRY_API_TOKEN"} <= set(env)


def test_service_config_loads_and_points_at_both_minio_servers() -> None:
    env = {"EAST_ACCESS_KEY": "a", "EAST_SECRET_KEY": "b", "WEST_ACCESS_KEY": "c", "WEST_SECRET_KEY": "d"}
    cfg = load_config(DOCKER / "ferry.toml", env=env)
    assert set(cfg.clusters) == {"east", "west"}
    assert cfg.clusters["east"].storage_options["client_kwargs"]["endpoint_url"] == "http://minio-east:9000"
    assert cfg.clusters["west"].storage_options["client_kwargs"]["endpoint_url"] == "http://minio-west:9000"
    assert cfg.links() == [("east", "west")]
    assert (cfg.api.host, cfg.api.port, cfg.api.token_env) == ("0.0.0.0", 8765, "FERRY_API_TOKEN")
    text = (DOCKER / "ferry.toml").read_text()
    assert 'secret = "$EAST_SECRET_KEY"' in text and "minioadmin" not in text  # credentials only by reference


def test_dockerfile_is_slim_and_serves_the_config() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    assert '".[service,s3]"' in text
    assert "torch" not in text.replace("without torch", "").replace("no torch", "")
    assert 'ENTRYPOINT ["ferry", "serve", "--config", "/etc/ferry/ferry.toml"]' in text
    assert "USER ferry" in text and "EXPOSE 8765" in text
