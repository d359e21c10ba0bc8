"""The InferenceService custom resource's identity: its API group, version, kind and plural.

The operator watches and writes it, the router annotates its own (the demand path); the CRD itself is
crds/inferenceservices.yaml (a test checks these names against it).
"""

API_GROUP = "serving.pagedinfer.dev"
API_VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
