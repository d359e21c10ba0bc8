"""Kubernetes RBAC evaluation over rendered manifests: what may a ServiceAccount do?

Pure Python, no I/O. `RbacPolicy.for_service_account(documents, namespace,
name)` collects the rules that the rendered Roles, ClusterRoles and their
bindings grant to one ServiceAccount; `policy.allows(access)` answers one
request the way the API server's RBAC authorizer does:

- a ClusterRoleBinding grants its ClusterRole's rules in every namespace and
  on cluster-scoped objects;
- a RoleBinding grants its Role's (or ClusterRole's) rules only inside the
  binding's namespace;
- a rule matches when the request's API group, resource (with
  "/subresource" appended, e.g. "inferenceservices/status"), and verb are each
  listed or "*" (and "*/sub" matches any resource's "sub"); a rule with
  resourceNames matches only requests naming one of them (never list, watch or
  create, which name no object);
- anything no rule allows is denied (RBAC has no deny rules).

Source: the Kubernetes RBAC documentation (Role, ClusterRole, bindings,
resourceNames, subresources).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol


class AccessLike(Protocol):
    verb: str
    group: str
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None


@dataclass(frozen=True)
class Access:
    """One request, as the authorizer sees it (an AccessLike)."""

    verb: str
    group: str
    resource: str
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = None


@dataclass(frozen=True)
class Rule:
    """One PolicyRule, and the namespace it is confined to (None: cluster-wide)."""

    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    resource_names: frozenset[str]
    namespace: str | None

    @classmethod
    def from_manifest(cls, rule: dict[str, Any], namespace: str | None) -> Rule:
        if rule.get("nonResourceURLs"):
            raise ValueError("nonResourceURLs rules are not supported by this evaluator")
        return cls(
            frozenset(rule.get("apiGroups") or ()),
            frozenset(rule.get("resources") or ()),
            frozenset(rule.get("verbs") or ()),
            frozenset(rule.get("resourceNames") or ()),
            namespace,
        )

    def matches(self, access: AccessLike) -> bool:
        if self.namespace is not None and access.namespace != self.namespace:
            return False
        if "*" not in self.api_groups and access.group not in self.api_groups:
            return False
        if "*" not in self.verbs and access.verb not in self.verbs:
            return False
        if not self._resource_matches(access):
            return False
        if self.resource_names:
            return (
                access.name is not None
                and access.verb not in ("list", "watch", "create")
                and access.name in self.resource_names
            )
        return True

    def _resource_matches(self, access: AccessLike) -> bool:
        wanted = f"{access.resource}/{access.subresource}" if access.subresource else access.resource
        if "*" in self.resources or wanted in self.resources:
            return True
        return bool(access.subresource) and f"*/{access.subresource}" in self.resources


@dataclass(frozen=True)
class RbacPolicy:
    rules: tuple[Rule, ...]

    @classmethod
    def for_service_account(cls, documents: Iterable[dict[str, Any]], namespace: str, name: str) -> RbacPolicy:
        documents = list(documents)
        roles = {
            ("Role", d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in documents if d["kind"] == "Role"
        }
        cluster_roles = {
            ("ClusterRole", None, d["metadata"]["name"]): d for d in documents if d["kind"] == "ClusterRole"
        }
        rules: list[Rule] = []
        for binding in documents:
            if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
                continue
            if not any(
                s.get("kind") == "ServiceAccount" and s.get("name") == name and s.get("namespace") == namespace
                for s in binding.get("subjects") or ()
            ):
                continue
            ref = binding["roleRef"]
            scope = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
            if ref["kind"] == "Role":
                if binding["kind"] != "RoleBinding":
                    raise ValueError(f"ClusterRoleBinding {binding['metadata']['name']} cannot reference a Role")
                role = roles.get(("Role", scope, ref["name"]))
            else:
                role = cluster_roles.get(("ClusterRole", None, ref["name"]))
            if role is None:
                raise ValueError(
                    f"{binding['kind']} {binding['metadata']['name']} references "
                    f"{ref['kind']} {ref['name']}, which was not rendered"
                )
            rules += [Rule.from_manifest(r, scope) for r in role.get("rules") or ()]
        return cls(tuple(rules))

    def allows(self, access: AccessLike) -> bool:
        return any(rule.matches(access) for rule in self.rules)

    def without_verb(self, group: str, resource: str, verb: str) -> RbacPolicy:
        """The same policy with `verb` no longer granted on group/resource (other resources keep it)."""
        out: list[Rule] = []
        for rule in self.rules:
            if group in rule.api_groups and resource in rule.resources and verb in rule.verbs:
                others = rule.resources - {resource}
                if others:
                    out.append(Rule(rule.api_groups, others, rule.verbs, rule.resource_names, rule.namespace))
                rule = Rule(
                    rule.api_groups, frozenset({resource}), rule.verbs - {verb}, rule.resource_names, rule.namespace
                )
            out.append(rule)
        return RbacPolicy(tuple(out))
