"""The HTTP contract says what the server does.

* ``OPTIONS`` on every documented path answers 204 with ``Allow`` = the methods the OpenAPI
  document gives that path (+ OPTIONS); it used to be a 405 listing only the first route's
  methods (``OPTIONS /v1/studies``: ``GET`` without ``POST``). A 405 lists them all too.
* The study spec's JSON schema (what ``POST /v1/studies`` documents) accepts what the validators
  accept and refuses what they refuse: ``task: {}`` was schema-valid but refused, ``task: NAME``
  refused by the schema but valid; ``tradeoff.pareto_target: "0.5"`` or ``true`` was documented
  as a number but accepted.
"""

from __future__ import annotations

import re

import jsonschema
import pytest
from fastapi.testclient import TestClient

from fedtune.errors import ConfigError
from fedtune.service.api.app import create_app
from fedtune.tuning.spec import StudySpec

TOKEN = "contract-token-0123456789"


@pytest.fixture
def client(make_settings):
    app = create_app(make_settings(api_token=TOKEN), schedule=False)
    with TestClient(app) as tc:
        yield tc


def test_options_and_405_list_every_method_of_every_documented_path(client) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/v1/studies" in paths
    for path, operations in paths.items():
        documented = {m.upper() for m in operations} | {"OPTIONS"}
        concrete = re.sub(r"\{[^}]+\}", "x1", path)
        answer = client.options(concrete)  # no token: it says which methods, nothing more
        assert answer.status_code == 204, (path, answer.status_code)
        assert set(answer.headers["allow"].split(", ")) == documented, path
    refused = client.put("/v1/studies", headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 405
    assert {"GET", "POST"} <= set(refused.headers["allow"].split(", "))
    assert client.options("/no/such/path").status_code == 404


_BASE = {
    "name": "s",
    "task": {"name": "quadratic", "clients": 4, "dim": 2},
    "algorithm": "fedavg",
    "train": {"rounds": 30},
}


@pytest.mark.parametrize(
    ("change", "valid"),
    [
        ({"task": {}}, False),
        ({"task": {"clients": 4}}, False),
        ({"task": "quadratic"}, True),
        ({"tradeoff": {"pareto_target": 0.5}}, True),
        ({"tradeoff": {"pareto_target": 1}}, True),
        ({"tradeoff": {"pareto_target": "0.5"}}, False),
        ({"tradeoff": {"pareto_target": True}}, False),
        ({"tradeoff": {"targets": ["1"]}}, False),
    ],
)
def test_the_spec_schema_and_the_validators_agree(change, valid) -> None:
    spec = {**_BASE, **change}
    schema = StudySpec.model_json_schema()
    schema_ok = jsonschema.Draft202012Validator(schema).is_valid(spec)
    try:
        StudySpec.from_dict(spec)
        validator_ok = True
    except ConfigError:
        validator_ok = False
    assert (schema_ok, validator_ok) == (valid, valid)
