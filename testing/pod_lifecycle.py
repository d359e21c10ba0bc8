"""What a kubelet and a Deployment controller do around a pod's end, for kubelet_harness.py.

- `pre_stop(container)`: run the container's preStop hook as the kubelet
  does: an `exec` command as a real process (`sleep N` in the engine's pod),
  or the native `sleep` action; bounded by the grace period.
- `template_key(template)`: a pod template's identity (the Deployment's
  pod-template-hash): pods whose key differs from the Deployment's current
  template are the old revision a rolling update replaces.
- `rollout_step(...)`: the next move of a RollingUpdate with maxSurge 1 and
  maxUnavailable 0 (the engine Deployment's strategy on CPU): start a pod of
  the new template while every pod is ready and none is surging, remove an
  old one once the surge pod is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
from collections.abc import Mapping
from typing import Any


def template_key(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


async def pre_stop(container: Mapping[str, Any], bound_seconds: float) -> None:
    """Run the container's preStop hook (none: return at once); at most `bound_seconds`."""
    hook = ((container.get("lifecycle") or {}).get("preStop")) or {}
    if "sleep" in hook:
        await asyncio.sleep(min(float(hook["sleep"]["seconds"]), bound_seconds))
        return
    command = (hook.get("exec") or {}).get("command")
    if not command:
        return
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(process.wait, bound_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(process.wait, 5.0)


def rollout_step(num_current: int, num_old: int, desired: int) -> str | None:
    """'start' (a pod of the current template), 'stop-old', or None (nothing to do for the rollout).

    maxSurge 1, maxUnavailable 0: at most desired + 1 pods, never fewer than
    `desired` ready. Counts are of ready pods."""
    if num_old == 0:
        return None
    if num_current + num_old > desired:
        return "stop-old"
    return "start"
