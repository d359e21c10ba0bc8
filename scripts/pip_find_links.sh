#!/usr/bin/env bash
# Prints, one word a line, uv's `--find-links DIR` for every find-links folder in this machine's pip
# configuration (pip config list: global.find-links, or PIP_FIND_LINKS): where a machine keeps wheels
# on local disk (this project's machines keep torch's CPU build there), uv finds them as pip does.
# uv reads no pip configuration itself. Nothing is printed where pip has none.
set -euo pipefail
links="${PIP_FIND_LINKS:-}"
if [ -z "$links" ] && command -v python3 >/dev/null; then
    links="$(cd / && python3 -m pip config get global.find-links 2>/dev/null || true)"
fi
for link in $links; do
    [ -n "$link" ] && printf -- '--find-links\n%s\n' "$link"
done
exit 0
