"""Scale to zero in the spec: `minReplicas: 0` written out turns the idle rule on, needs the router, and every
bad combination is refused naming its field, by the autoscaler's parse and by the whole spec's."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from pagedinfer.operator.autoscaling.idle_spec import DEFAULT_IDLE_SECONDS, IdleRule
from pagedinfer.operator.autoscaling.spec import parse_autoscaling_spec
from pagedinfer.operator.routing.spec import RouterQueue, RouterSpecError, parse_router_spec
from pagedinfer.operator.spec.crd_model import SpecError
from pagedinfer.operator.spec.parser import parse_spec

CRD = yaml.safe_load((Path(__file__).resolve().parents[2] / "crds" / "inferenceservices.yaml").read_text())
AUTOSCALING = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["autoscaling"]
KV = [{"name": "kvCacheUsage", "target": 0.5}]


def zero(max_replicas=3, router=None, **autoscaling):
    spec = {
        "minReplicas": 0,
        "maxReplicas": max_replicas,
        "autoscaling": {"enabled": True, "metrics": KV, **autoscaling},
    }
    return spec if router is None else {**spec, "router": router}


def test_min_replicas_zero_written_out_turns_the_idle_rule_on_with_keda_s_default_window():
    spec = parse_autoscaling_spec(zero())
    assert spec.scale_to_zero and spec.idle == IdleRule(DEFAULT_IDLE_SECONDS) and spec.standby == 0
    assert spec.min_replicas == 1  # the metric rules never go below one replica: only the idle rule does
    assert parse_autoscaling_spec(zero(idle={"afterSeconds": 30})).idle == IdleRule(30)


def test_an_unset_min_replicas_or_disabled_autoscaling_never_scales_to_zero():
    assert not parse_autoscaling_spec({"maxReplicas": 3, "autoscaling": {"enabled": True, "metrics": KV}}).scale_to_zero
    assert not parse_autoscaling_spec({**zero(), "autoscaling": {"enabled": False, "idle": {}}}).scale_to_zero


def test_standby_replicas_are_the_metric_rules_floor():
    spec = parse_autoscaling_spec(zero(max_replicas=4, standby=2))
    assert (spec.standby, spec.min_replicas, spec.max_replicas) == (2, 2, 4)


@pytest.mark.parametrize(
    "spec, problem",
    [
        (zero(max_replicas=1), "spec.minReplicas: 0 needs the router"),
        (zero(router={"enabled": False}), "spec.minReplicas: 0 needs the router"),
        (zero(idle={"afterSeconds": 0}), "spec.autoscaling.idle.afterSeconds must be an integer in [1, 86400]"),
        (zero(idle={"afterSeconds": 1.5}), "spec.autoscaling.idle.afterSeconds"),
        (zero(idle=30), "spec.autoscaling.idle must be an object"),
        (zero(standby=4), "spec.autoscaling.standby must be <= maxReplicas (3), got 4"),
        (zero(standby=-1), "spec.autoscaling.standby must be an integer >= 0"),
        ({**zero(idle={"afterSeconds": 30}), "minReplicas": 1}, "spec.autoscaling.idle needs spec.minReplicas: 0"),
        ({**zero(standby=1), "minReplicas": 1}, "spec.autoscaling.standby needs spec.minReplicas: 0"),
        (
            {**zero(standby=1), "engine": {"apiKeySecretRef": {"name": "key"}}},
            "spec.autoscaling.standby cannot be used with spec.engine.apiKeySecretRef",
        ),
    ],
)
def test_each_bad_combination_names_its_field(spec, problem):
    with pytest.raises(ValueError) as err:
        parse_autoscaling_spec(spec)
    assert problem in str(err.value)
    with pytest.raises(SpecError) as err:  # the reconciler's parse reports the same, once
        parse_spec("svc", spec)
    assert str(err.value).count(problem) == 1


def test_min_replicas_zero_with_the_router_on_explicitly_is_valid_even_with_one_replica_at_most():
    assert parse_spec("svc", zero(max_replicas=1, router={"enabled": True})).autoscaling.scale_to_zero


def test_min_replicas_zero_needs_the_router_whether_or_not_autoscaling_is_on():
    with pytest.raises(SpecError, match="spec.minReplicas: 0 needs the router"):
        parse_spec("svc", {"minReplicas": 0})
    assert parse_spec("svc", {}).min_replicas == 0  # unset reads 0 and needs nothing


def test_the_router_queue_is_passed_only_where_set():
    assert parse_router_spec({"queue": {"maxRequests": 64, "timeoutSeconds": 30}}, 2).queue == RouterQueue(64, 30.0)
    assert parse_router_spec({}, 2).queue == RouterQueue(None, None)


@pytest.mark.parametrize(
    "queue, problem",
    [
        ({"maxRequests": 0}, "spec.router.queue.maxRequests: must be an integer >= 1"),
        ({"maxRequests": True}, "spec.router.queue.maxRequests: must be an integer >= 1"),
        ({"timeoutSeconds": 0}, "spec.router.queue.timeoutSeconds: must be a number of seconds > 0"),
        ({"size": 3}, "spec.router.queue: unknown field(s) size"),
        ([], "spec.router.queue: must be an object"),
    ],
)
def test_a_bad_queue_names_its_field(queue, problem):
    with pytest.raises(RouterSpecError) as err:
        parse_router_spec({"queue": queue}, 2)
    assert problem in str(err.value)


@pytest.mark.parametrize("autoscaling", [{"idle": {"afterSeconds": 0}}, {"standby": -1}])
def test_the_crd_refuses_what_the_parser_refuses(autoscaling):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(AUTOSCALING).validate(autoscaling)
    with pytest.raises(ValueError):
        parse_autoscaling_spec(zero(**autoscaling))
