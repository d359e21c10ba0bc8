"""spec.router parsed (operator/routing/spec.py): its defaults, its problems, and the CRD agreeing with both."""

from pathlib import Path

import jsonschema
import pytest
import yaml

from pagedinfer.contracts.routing.policies import POLICIES
from pagedinfer.operator.routing.spec import RouterSpec, RouterSpecError, parse_router_spec

CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
ROUTER = VERSION["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["router"]


@pytest.mark.parametrize(
    "raw, max_replicas, enabled",
    [
        (None, None, False),
        (None, 1, False),
        (None, 2, True),
        ({"enabled": False}, 8, False),
        ({"enabled": True}, 1, True),
    ],
)
def test_the_router_is_on_by_default_exactly_when_the_engines_can_be_more_than_one(raw, max_replicas, enabled):
    assert parse_router_spec(raw, max_replicas).enabled is enabled


@pytest.mark.parametrize(
    "raw, problem",
    [
        ({"enabled": "yes"}, "spec.router.enabled: must be true or false, got 'yes'"),
        ({"replicas": 17}, "spec.router.replicas: must be an integer from 1 to 16, got 17"),
        ({"replicas": True}, "spec.router.replicas: must be an integer from 1 to 16, got True"),
        ({"policy": "random"}, "spec.router.policy: must be one of prefix, least-load, round-robin, got 'random'"),
        ({"image": "a b"}, "spec.router.image: must be an image reference"),
        (
            {"resources": {"requests": {"cpu": "lots"}}},
            "spec.router.resources.requests.cpu: must be a Kubernetes quantity",
        ),
        (
            {"resources": {"requests": {"nvidia.com/gpu": "1"}}},
            "spec.router.resources.requests.nvidia.com/gpu: the router",
        ),
        ({"resources": {"claims": []}}, "spec.router.resources.claims: unknown field"),
        ({"replica": 2}, "spec.router: unknown field(s) replica"),
        ({"warmup": {"prefixes": -1}}, "spec.router.warmup.prefixes: must be an integer from 0 to 1024, got -1"),
        ({"warmup": {"tokenBudget": "lots"}}, "spec.router.warmup.tokenBudget: must be an integer from 0 to 16777216"),
        ({"warmup": {"k": 1}}, "spec.router.warmup: unknown field(s) k"),
        ("on", "spec.router: must be an object, got str"),
    ],
)
def test_each_problem_names_its_field(raw, problem):
    with pytest.raises(RouterSpecError) as err:
        parse_router_spec(raw, 4)
    assert problem in str(err.value)


def test_the_crd_defaults_and_enum_are_the_parsers():
    props = ROUTER["properties"]
    default = RouterSpec()
    assert props["replicas"]["default"] == default.replicas and props["policy"]["default"] == default.policy
    assert tuple(props["policy"]["enum"]) == POLICIES
    assert props["resources"]["default"] == {k: dict(v) for k, v in default.resources.items()}
    warmup = props["warmup"]["properties"]
    assert (warmup["prefixes"]["default"], warmup["tokenBudget"]["default"]) == (
        default.warmup.prefixes,
        default.warmup.token_budget,
    )
    assert "default" not in props["enabled"]  # its default depends on maxReplicas: the operator resolves it


@pytest.mark.parametrize(
    "raw",
    [
        {"policy": "random"},
        {"replicas": 0},
        {"resources": {"requests": {"cpu": "x"}}},
        {"queue": {"maxRequests": 0}},
        {"queue": {"timeoutSeconds": 0}},
        {"warmup": {"prefixes": 1025}},
        {"warmup": {"tokenBudget": -1}},
    ],
)
def test_the_crd_refuses_what_the_parser_refuses(raw):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(ROUTER).validate(raw)
    with pytest.raises(RouterSpecError):
        parse_router_spec(raw, 4)


def test_the_routing_printer_column_reads_status_routing_policy():
    (column,) = [c for c in VERSION["additionalPrinterColumns"] if c["name"] == "Routing"]
    assert column["jsonPath"] == ".status.routing.policy"
