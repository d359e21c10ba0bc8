"""Render charts/pagedinfer with the real Helm binary and hand back the manifests.

Helm is fetched by scripts/fetch_helm.sh into .tools/bin (scripts/test.sh puts
that on PATH). Without it, tests skip with the reason, except in CI (CI=true),
where a missing Helm is a failure: the chart must be checked there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "pagedinfer"
MONITORING_API = "monitoring.coreos.com/v1"
RELEASE = "pi"
NAMESPACE = "pagedinfer-system"


def find_helm() -> str | None:
    local = REPO / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("helm")


def require_helm() -> str:
    """The helm binary; skips the test without it, fails it in CI."""
    helm = find_helm()
    if helm is None:
        message = "helm not found on PATH or in .tools/bin: run `bash scripts/fetch_helm.sh`"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set, so the chart tests may not skip)")
        pytest.skip(message)
    return helm


class RenderError(Exception):
    """`helm template` refused the values; str() is Helm's message."""


@dataclass(frozen=True)
class Rendered:
    """The documents of one `helm template` run (hooks and crds/ included)."""

    documents: tuple[dict[str, Any], ...]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.documents if d["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        if len(found) != 1:
            raise AssertionError(f"expected one {kind}, rendered {len(found)}")
        return found[0]

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self.documents}


def helm_template(
    helm: str,
    *,
    set_values: dict[str, Any] | None = None,
    api_versions: tuple[str, ...] = (),
    namespace: str = NAMESPACE,
    release: str = RELEASE,
    extra_args: tuple[str, ...] = (),
) -> Rendered:
    """`helm template` the chart with `--set-json` values; RenderError on a refused install."""
    args = [helm, "template", release, str(CHART), "--namespace", namespace, "--include-crds", *extra_args]
    for key, value in (set_values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    for api in api_versions:
        args += ["--api-versions", api]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    documents = tuple(d for d in yaml.safe_load_all(result.stdout) if d)
    return Rendered(documents)


def helm_notes(
    helm: str, *, set_values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE
) -> str:
    """NOTES.txt as `helm install` prints it, from a client-side dry run (no cluster is contacted)."""
    args = [helm, "install", release, str(CHART), "--namespace", namespace, "--dry-run=client"]
    for key, value in (set_values or {}).items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise RenderError(result.stderr.strip())
    return result.stdout.partition("\nNOTES:\n")[2]
