"""What NOTES.txt tells a new user to run works as written, without a checkout of the repository."""

from __future__ import annotations

import re

import jsonschema
import pytest
import yaml
from helm_chart import NAMESPACE, REPO, helm_notes

from pagedinfer.operator.spec.parser import parse_spec

CRD = yaml.safe_load((REPO / "crds" / "inferenceservices.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def inline_manifest(notes: str) -> tuple[dict, str]:
    """The InferenceService between `echo '` and `' | kubectl apply`, as the shell hands it to kubectl."""
    match = re.search(r"echo '\n(.*?)\n\s*' \| kubectl apply -n (\S+) -f -", notes, re.S)
    assert match, notes
    return yaml.safe_load(match.group(1)), match.group(2)


@pytest.mark.parametrize("scope, namespace", [("cluster", "<namespace>"), ("namespace", NAMESPACE)])
def test_the_cpu_example_is_inline_and_every_kubectl_names_its_namespace(helm, scope, namespace):
    notes = helm_notes(helm, set_values={"rbac.scope": scope})
    manifest, applied_in = inline_manifest(notes)
    assert applied_in == namespace
    jsonschema.Draft4Validator(SCHEMA).validate(manifest)
    example = yaml.safe_load((REPO / "examples" / "cpu-default-model.yaml").read_text())
    assert manifest["metadata"] == example["metadata"]
    assert parse_spec("tiny-cpu", manifest["spec"]) == parse_spec("tiny-cpu", example["spec"])
    for line in notes.splitlines():
        command = line.strip()
        if command.startswith("kubectl") and " -A" not in command:
            assert re.search(r" -n \S+ ", command), command
    assert "port-forward svc/tiny-cpu" in notes and "examples/cpu-default-model.yaml" in notes
