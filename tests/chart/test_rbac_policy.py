"""The RBAC evaluator the operator test enforces behaves like the API server's."""

from __future__ import annotations

import pytest
from chart_rbac import Access, RbacPolicy

SA = {"kind": "ServiceAccount", "name": "op", "namespace": "sys"}


def role(kind: str, name: str, rules: list[dict], namespace: str | None = None) -> dict:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "rules": rules}


def binding(kind: str, role_kind: str, role_name: str, namespace: str | None = None, subject: dict = SA) -> dict:
    meta = {"name": f"b-{role_name}"} | ({"namespace": namespace} if namespace else {})
    return {"kind": kind, "metadata": meta, "roleRef": {"kind": role_kind, "name": role_name}, "subjects": [subject]}


def policy(*documents: dict) -> RbacPolicy:
    return RbacPolicy.for_service_account(documents, "sys", "op")


def test_cluster_role_binding_grants_listed_verbs_everywhere_and_nothing_else():
    p = policy(
        role("ClusterRole", "r", [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]}]),
        binding("ClusterRoleBinding", "ClusterRole", "r"),
    )
    assert p.allows(Access("get", "apps", "deployments", "a", "x"))
    assert p.allows(Access("list", "apps", "deployments", None))
    assert not p.allows(Access("create", "apps", "deployments", "a"))
    assert not p.allows(Access("get", "", "deployments", "a", "x"))  # wrong group
    assert not p.allows(Access("get", "apps", "statefulsets", "a", "x"))


def test_role_binding_confines_rules_to_its_namespace_even_for_a_cluster_role():
    p = policy(
        role("Role", "r", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], "ns1"),
        binding("RoleBinding", "Role", "r", "ns1"),
        role("ClusterRole", "c", [{"apiGroups": [""], "resources": ["services"], "verbs": ["get"]}]),
        binding("RoleBinding", "ClusterRole", "c", "ns2"),
    )
    assert p.allows(Access("list", "", "pods", "ns1"))
    assert not p.allows(Access("list", "", "pods", "ns2"))
    assert not p.allows(Access("list", "", "pods", None))  # all namespaces needs a cluster-wide grant
    assert p.allows(Access("get", "", "services", "ns2", "s"))
    assert not p.allows(Access("get", "", "services", "ns1", "s"))


def test_subresources_must_be_granted_by_name_or_star_slash():
    p = policy(
        role(
            "ClusterRole",
            "r",
            [
                {"apiGroups": ["g"], "resources": ["things"], "verbs": ["patch"]},
                {"apiGroups": ["g"], "resources": ["*/scale"], "verbs": ["get"]},
            ],
        ),
        binding("ClusterRoleBinding", "ClusterRole", "r"),
    )
    assert p.allows(Access("patch", "g", "things", "a", "x"))
    assert not p.allows(Access("patch", "g", "things", "a", "x", "status"))
    assert p.allows(Access("get", "g", "things", "a", "x", "scale"))


def test_wildcards_and_resource_names():
    p = policy(
        role(
            "ClusterRole",
            "r",
            [
                {"apiGroups": ["*"], "resources": ["configmaps"], "verbs": ["*"], "resourceNames": ["cfg"]},
            ],
        ),
        binding("ClusterRoleBinding", "ClusterRole", "r"),
    )
    assert p.allows(Access("get", "", "configmaps", "a", "cfg"))
    assert p.allows(Access("delete", "", "configmaps", "a", "cfg"))
    assert not p.allows(Access("get", "", "configmaps", "a", "other"))
    assert not p.allows(Access("list", "", "configmaps", "a"))  # names nothing: resourceNames never match


def test_bindings_for_other_subjects_grant_nothing():
    other = {"kind": "ServiceAccount", "name": "op", "namespace": "elsewhere"}
    p = policy(
        role("ClusterRole", "r", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]),
        binding("ClusterRoleBinding", "ClusterRole", "r", subject=other),
    )
    assert not p.allows(Access("get", "", "pods", "a", "x"))


def test_a_binding_to_a_role_that_was_not_rendered_is_an_error():
    with pytest.raises(ValueError, match="ClusterRole missing"):
        policy(binding("ClusterRoleBinding", "ClusterRole", "missing"))


def test_without_verb_removes_exactly_one_verb_on_one_resource():
    p = policy(
        role("ClusterRole", "r", [{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list"]}]),
        binding("ClusterRoleBinding", "ClusterRole", "r"),
    )
    q = p.without_verb("", "pods", "list")
    assert not q.allows(Access("list", "", "pods", "a"))
    assert q.allows(Access("get", "", "pods", "a", "x"))
    assert q.allows(Access("list", "", "services", "a"))
