"""``/metrics`` names no project to a scrape without the scrape token (``FEDTUNE_METRICS_TOKEN``):
two projects with sentinel names, studies in both, then the scrape without a token, with the
token, with another token, and on a service that has no scrape token."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from fedtune.service.api import create_app
from fedtune.service.settings import Settings

from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec

SCRAPE = "scrape-token-of-the-metrics-tests-0123"
#: project names that appear nowhere else in an exposition
SENTINELS = ("zq-sentinel-alpha", "zq-sentinel-beta")
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def _world(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        for project in SENTINELS:
            made = client.post("/v1/projects", json={"name": project}, headers=ADMIN)
            assert made.status_code == 201, made.text
            sent = client.post(
                "/v1/studies", json=tiny_spec(name=f"s-{project}", project=project), headers=ADMIN
            )
            assert sent.status_code == 201, sent.text
        yield client


@pytest.fixture
def scraped(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    yield from _world(make_settings(api_token=TOKEN, metrics_token=SCRAPE))


def test_a_scrape_without_the_token_names_no_project(scraped: TestClient) -> None:
    answer = scraped.get("/metrics")
    assert answer.status_code == 200
    text = answer.text
    assert 'fedtune_studies{state="queued"} 2.0' in text  # the aggregate series are there
    assert "fedtune_queue_length 2.0" in text
    assert not any(name in text for name in SENTINELS), text
    assert "project=" not in text and "fedtune_project_" not in text


def test_the_scrape_token_adds_the_per_project_series(scraped: TestClient) -> None:
    text = scraped.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE}"}).text
    for name in SENTINELS:
        assert f'fedtune_project_studies_queued{{project="{name}"}} 1.0' in text
    assert 'fedtune_studies{state="queued"} 2.0' in text  # and the aggregate ones still


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN}", f"Bearer {SCRAPE}x", "Basic c2NyYXBlOnRva2Vu", "Bearer "],
    ids=["the-api-token", "a-wrong-token", "not-bearer", "empty"],
)
def test_another_credential_is_refused_without_echoing_it(scraped: TestClient, header: str) -> None:
    answer = scraped.get("/metrics", headers={"Authorization": header})
    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert answer.json()["error"]["code"] in ("unauthorized", "invalid_token")
    assert not any(name in answer.text for name in SENTINELS)
    secret = header.partition(" ")[2].strip()
    assert not secret or secret not in answer.text


def test_without_a_scrape_token_no_scrape_sees_project_names(
    make_settings: Callable[..., Settings],
) -> None:
    for client in _world(make_settings(api_token=TOKEN)):
        assert not any(name in client.get("/metrics").text for name in SENTINELS)
        refused = client.get("/metrics", headers={"Authorization": f"Bearer {SCRAPE}"})
        assert refused.status_code == 401
        assert "FEDTUNE_METRICS_TOKEN" in refused.json()["error"]["message"]


@pytest.mark.parametrize("value", ["s3cr3t-tok", "changethis", "has white space in it 0123"])
def test_a_weak_scrape_token_is_refused_naming_the_variable(
    make_settings: Callable[..., Settings], value: str
) -> None:
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        make_settings(metrics_token=value)
    assert "FEDTUNE_METRICS_TOKEN" in str(caught.value)
    assert value not in str(caught.value)
