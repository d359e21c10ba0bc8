"""The router's Role that the operator creates is one the chart's operator may grant, and no wider than the router
needs.

Kubernetes refuses a Role granting anything its creator does not hold itself (RBAC escalation prevention), so
every rule of the router's Role, scale to zero's demand rule included, must be allowed to the operator's
ServiceAccount in the InferenceService's namespace, in both of the chart's RBAC scopes. And the demand rule is
least privilege: `get` and `patch` on its own InferenceService only.
"""

from __future__ import annotations

import pytest
from chart_rbac import Access, RbacPolicy
from helm_chart import NAMESPACE, helm_template

from pagedinfer.operator.children import builders
from pagedinfer.operator.routing import builders as routing
from pagedinfer.operator.spec.parser import parse_spec

pytestmark = pytest.mark.slow
TENANT = "team-a"


def router_role(namespace: str) -> dict:
    spec = parse_spec(
        "llama",
        {
            "minReplicas": 0,
            "maxReplicas": 2,
            "autoscaling": {"enabled": True, "metrics": [{"name": "kvCacheUsage", "target": 0.5}]},
        },
    )
    return routing.build_role(builders.Owner(name="llama", namespace=namespace, uid="u", generation=1), spec)


def granted(role: dict, namespace: str) -> list[Access]:
    """Every access the Role's rules name (one per verb, resource and name)."""
    return [
        Access(verb, group, resource, namespace, name)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames") or [None]
    ]


@pytest.mark.parametrize(("scope", "namespace"), [("cluster", TENANT), ("namespace", NAMESPACE)])
def test_the_operator_holds_everything_the_routers_role_grants(helm, scope, namespace):
    rendered = helm_template(helm, set_values={"rbac.scope": scope})
    account = rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    operator = RbacPolicy.for_service_account(rendered.documents, NAMESPACE, account)
    role = router_role(namespace)
    assert len(role["rules"]) == 3  # EndpointSlices, the warmed readiness gate, and the demand rule
    missing = [a for a in granted(role, namespace) if not operator.allows(a)]
    assert not missing, f"the operator cannot grant what it does not hold: {missing}"


def test_the_router_may_annotate_its_own_inference_service_and_nothing_else():
    role = {**router_role(TENANT), "metadata": {"name": "llama-router", "namespace": TENANT}}
    binding = {
        "kind": "RoleBinding",
        "metadata": {"name": "llama-router", "namespace": TENANT},
        "roleRef": {"kind": "Role", "name": "llama-router"},
        "subjects": [{"kind": "ServiceAccount", "name": "llama-router", "namespace": TENANT}],
    }
    router = RbacPolicy.for_service_account([role, binding], TENANT, "llama-router")
    group = "serving.pagedinfer.dev"
    assert router.allows(Access("patch", group, "inferenceservices", TENANT, "llama"))
    assert router.allows(Access("get", group, "inferenceservices", TENANT, "llama"))
    assert not router.allows(Access("patch", group, "inferenceservices", TENANT, "other"))
    assert not router.allows(Access("list", group, "inferenceservices", TENANT))
    assert not router.allows(Access("patch", group, "inferenceservices", TENANT, "llama", "scale"))
    assert not router.allows(Access("patch", group, "inferenceservices", TENANT, "llama", "status"))
    assert not router.allows(Access("delete", group, "inferenceservices", TENANT, "llama"))
    # the warmed readiness gate: the engine pods' status, patched, and nothing else of a pod
    assert router.allows(Access("patch", "", "pods", TENANT, "llama-engine-1", "status"))
    assert not router.allows(Access("patch", "", "pods", TENANT, "llama-engine-1"))
    assert not router.allows(Access("get", "", "pods", TENANT, "llama-engine-1", "status"))
    assert not router.allows(Access("patch", "", "pods", "other", "llama-engine-1", "status"))
