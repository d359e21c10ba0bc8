"""What a kubelet would run for a pod's engine container, as a local process.

The kubelet execs the container's `command` + `args` with its `env`, inside
the pod's network namespace and with its volumes mounted. A local process
shares the host's network and filesystem, so exactly these things change, and
nothing else in the command line does:

- `--host`: every pod has its own IP and binds the same port there; locally
  each pod gets its own loopback address (127.0.0.x) and keeps the
  container's port, so `--host` becomes that address (appended when absent).
- Paths under the container's volume mounts (env values, `--model`): a
  `hostPath` volume is the node's own directory, so its paths stay as they
  are; an `emptyDir` becomes `<pod_dir>/<volume name>`. Any other volume
  kind (a PVC, a Secret) cannot be mounted here and is refused.
- The executable: `command[0]` is looked up in `bin_dir` (the image's PATH),
  here the virtual environment's bin folder.
- The working directory: the container's `workingDir` (its path mapped as
  above), else `pod_dir`, which stands for the image's WORKDIR; never the
  test runner's own (a source tree there shadows installed packages for a
  child started with `python -m`, which puts its working directory first on
  sys.path, as a tensor-parallel engine's rank 1 once found `kernels`).

Env from `valueFrom` (Secrets, ConfigMaps, the downward API) is refused
rather than guessed. Pure: no I/O beyond checking the executable exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

PATH_FLAGS = ("--model", "--tokenizer")


@dataclass(frozen=True)
class LocalProcess:
    argv: tuple[str, ...]
    env: Mapping[str, str]  # the container's env, its paths mapped; the caller adds the host's
    cwd: str  # where it runs (the caller creates it)


def http_port(container: Mapping[str, Any]) -> int:
    """The container's port named `http`."""
    for port in container.get("ports") or []:
        if port.get("name") == "http":
            return int(port["containerPort"])
    raise ValueError(f"container {container.get('name')!r}: no port named 'http'")


def local_path(path: str, pod_spec: Mapping[str, Any], container: Mapping[str, Any], pod_dir: Path) -> str:
    """`path` as the container sees it -> the same file on this host (see the module docstring)."""
    if not path.startswith("/"):
        return path
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    mounts = sorted(container.get("volumeMounts") or [], key=lambda m: len(m["mountPath"]), reverse=True)
    for mount in mounts:
        mount_path = PurePosixPath(mount["mountPath"])
        if not PurePosixPath(path).is_relative_to(mount_path):
            continue
        rest = PurePosixPath(path).relative_to(mount_path)
        volume = volumes.get(mount["name"])
        if volume is None:
            raise ValueError(f"volumeMount {mount['name']!r} names no volume of the pod")
        if "hostPath" in volume:
            return str(PurePosixPath(volume["hostPath"]["path"]) / rest)
        if "emptyDir" in volume:
            return str(pod_dir / mount["name"] / rest)
        kind = next((k for k in volume if k != "name"), "?")
        raise ValueError(
            f"{path!r} is on volume {mount['name']!r} of kind {kind}, which cannot be mounted "
            "for a local process (only hostPath and emptyDir)"
        )
    return path


def local_process(pod_spec: Mapping[str, Any], ip: str, pod_dir: Path, bin_dir: Path) -> LocalProcess:
    """The first container of `pod_spec` as a process listening on `ip`."""
    container = pod_spec["containers"][0]
    command = list(container.get("command") or [])
    if not command:
        raise ValueError(f"container {container.get('name')!r} has no command (the image's entrypoint is unknown)")
    executable = bin_dir / command[0]
    if not executable.exists():
        raise ValueError(f"container command {command[0]!r} is not in {bin_dir}")
    args = list(container.get("args") or [])
    if "--host" in args:
        args[args.index("--host") + 1] = ip
    else:
        args += ["--host", ip]
    for flag in PATH_FLAGS:
        if flag in args:
            i = args.index(flag) + 1
            args[i] = local_path(args[i], pod_spec, container, pod_dir)
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" not in item:
            raise ValueError(f"env {item.get('name')!r}: valueFrom is not resolved for a local process")
        env[item["name"]] = local_path(str(item["value"]), pod_spec, container, pod_dir)
    working_dir = container.get("workingDir")
    cwd = str(pod_dir) if not working_dir else local_path(working_dir, pod_spec, container, pod_dir)
    return LocalProcess((str(executable), *command[1:], *args), env, cwd)
