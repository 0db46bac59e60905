"""The chart's scrape token and ServiceMonitor: ``metrics.token`` (or ``metrics.existingSecret``)
reaches the API as ``FEDTUNE_METRICS_TOKEN`` from a Secret, and the ServiceMonitor scrapes the API
Service's ``/metrics`` sending that Secret's token, so Prometheus gets the per-project series
that a scrape without it never sees (``tests/service/test_metrics_scope.py``)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy.conftest import NAMESPACE, RELEASE, container_env, find, one

FULLNAME = f"{RELEASE}-fedtune"
SCRAPE = "scrape-token-set-by-the-chart-test"


def _api_env(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    deployment = one(manifests, "Deployment", FULLNAME)
    return container_env(deployment["spec"]["template"]["spec"]["containers"][0])


def test_by_default_no_scrape_token_and_no_service_monitor(render) -> None:
    manifests = render({})
    assert "FEDTUNE_METRICS_TOKEN" not in _api_env(manifests)
    assert find(manifests, "ServiceMonitor") == []
    assert find(manifests, "Secret", f"{FULLNAME}-metrics") == []


def test_the_token_reaches_the_api_and_the_service_monitor_sends_it(render) -> None:
    from fedtune.service.settings import load_settings

    values = {
        "metrics": {
            "token": SCRAPE,
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prom"}},
        }
    }
    manifests = render(values)
    secret = one(manifests, "Secret", f"{FULLNAME}-metrics")
    assert secret["stringData"] == {"metrics-token": SCRAPE}
    ref = _api_env(manifests)["FEDTUNE_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": f"{FULLNAME}-metrics", "key": "metrics-token"}
    assert load_settings(metrics_token=secret["stringData"][ref["key"]]).metrics_token
    monitor = one(manifests, "ServiceMonitor", FULLNAME)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == NAMESPACE
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # it selects the API Service, and only it, by a port name the Service has
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [
        s for s in find(manifests, "Service") if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == [FULLNAME]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "15s")
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": f"{FULLNAME}-metrics", "key": "metrics-token"},
    }
    assert SCRAPE not in str(monitor)  # by reference only


def test_an_existing_secret_is_read_where_it_is(render) -> None:
    values = {
        "metrics": {
            "token": "ignored-when-an-existing-secret-is-given",
            "existingSecret": "prom-scrape",
            "existingSecretKey": "token",
            "serviceMonitor": {"enabled": True},
        }
    }
    manifests = render(values)
    assert find(manifests, "Secret", f"{FULLNAME}-metrics") == []
    wanted = {"name": "prom-scrape", "key": "token"}
    assert _api_env(manifests)["FEDTUNE_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"] == wanted
    endpoint = one(manifests, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"]["credentials"] == wanted


def test_a_service_monitor_without_a_token_scrapes_the_aggregate_series(render) -> None:
    manifests = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    [endpoint] = one(manifests, "ServiceMonitor")["spec"]["endpoints"]
    assert "authorization" not in endpoint and endpoint["interval"] == "30s"
    assert "FEDTUNE_METRICS_TOKEN" not in _api_env(manifests)


@pytest.mark.parametrize("token", ["too-short", "has a space in the token"])
def test_a_weak_token_fails_the_render_naming_the_value(helm, render, token: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape("metrics.token")):
        render({"metrics": {"token": token}})


@pytest.mark.parametrize(
    ("values", "path"),
    [
        ({"metrics": {"tokn": "x"}}, "/metrics"),
        ({"metrics": {"serviceMonitor": {"interval": "soon"}}}, "/metrics/serviceMonitor/interval"),
    ],
)
def test_the_schema_names_a_wrong_value(helm, chart, values: dict, path: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart.validate_schema(values)
    assert path in str(caught.value)
