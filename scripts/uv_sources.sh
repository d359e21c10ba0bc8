#!/usr/bin/env bash
# Prints, one word a line, where uv finds packages beyond PyPI, for `mapfile -t` into a uv command:
# - `--find-links DIR` for every find-links folder in this machine's pip configuration (pip config list:
#   global.find-links, or PIP_FIND_LINKS): where a machine keeps wheels on local disk (this project's
#   machines keep torch's CPU build there), uv finds them as pip does; uv reads no pip configuration itself;
# - `--extra-index-url $PAGEDINFER_TORCH_INDEX_URL --index-strategy unsafe-best-match` where that is set
#   (https://download.pytorch.org/whl/cpu: torch's CPU build where the package index has only CUDA builds).
# Used by scripts/setup.sh, scripts/lock.sh and scripts/versions.sh. Nothing is printed where neither is set.
set -euo pipefail
links="${PIP_FIND_LINKS:-}"
if [ -z "$links" ] && command -v python3 >/dev/null; then
    links="$(cd / && python3 -m pip config get global.find-links 2>/dev/null || true)"
fi
for link in $links; do
    [ -n "$link" ] && printf -- '--find-links\n%s\n' "$link"
done
if [ -n "${PAGEDINFER_TORCH_INDEX_URL:-}" ]; then
    printf -- '--extra-index-url\n%s\n--index-strategy\nunsafe-best-match\n' "$PAGEDINFER_TORCH_INDEX_URL"
fi
exit 0
