"""A host swap pool that cannot fit is refused up front, naming --swap-space and the memory available.

The bound (contracts/config/host_memory.py) is read from a file tree laid out as
/proc and /sys/fs/cgroup are; the config check and the CLI run on this host.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedinfer.contracts.config.engine_config import EngineConfig
from pagedinfer.contracts.config.host_memory import HostMemoryBound, available_host_memory
from pagedinfer.engine import LLM

GIB = 2**30
CLI = Path(sys.executable).with_name("pagedinfer")
V1_UNLIMITED = "9223372036854771712"


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_mem_available_bounds_a_host_without_a_cgroup_limit(tmp_path):
    root = write(
        tmp_path,
        {
            "proc/meminfo": "MemTotal: 16000000 kB\nMemAvailable: 8388608 kB\n",
            "proc/self/cgroup": "0::/\n",
            "sys/fs/cgroup/memory.max": "max\n",
            "sys/fs/cgroup/memory.current": "123\n",
        },
    )
    assert available_host_memory(root) == HostMemoryBound(8 * GIB, "MemAvailable in /proc/meminfo")


def test_a_cgroup_v2_limit_below_mem_available_wins_less_its_working_set(tmp_path):
    pod = "sys/fs/cgroup/kubepods/pod1/"
    root = write(
        tmp_path,
        {
            "proc/meminfo": "MemAvailable: 67108864 kB\n",  # 64 GiB on the node
            "proc/self/cgroup": "0::/kubepods/pod1\n",
            pod + "memory.max": f"{3 * GIB}\n",
            pod + "memory.current": f"{2 * GIB}\n",
            pod + "memory.stat": f"anon 1\ninactive_file {GIB // 2}\nactive_file 7\n",  # reclaimable cache
            "sys/fs/cgroup/kubepods/memory.max": "max\n",
            "sys/fs/cgroup/kubepods/memory.current": "0\n",
        },
    )
    bound = available_host_memory(root)
    assert bound == HostMemoryBound(3 * GIB - (2 * GIB - GIB // 2), "cgroup memory.max of /kubepods/pod1")


def test_a_cgroup_v1_parent_limit_counts_and_unlimited_is_ignored(tmp_path):
    mem = "sys/fs/cgroup/memory/"
    root = write(
        tmp_path,
        {
            "proc/meminfo": "MemAvailable: 16777216 kB\n",  # 16 GiB
            "proc/self/cgroup": "4:memory:/docker/abc\n0::/\n",
            mem + "docker/abc/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            mem + "docker/abc/memory.usage_in_bytes": f"{GIB}\n",
            mem + "docker/memory.limit_in_bytes": f"{4 * GIB}\n",
            mem + "docker/memory.usage_in_bytes": f"{3 * GIB}\n",
            mem + "docker/memory.stat": "total_inactive_file 0\n",
            mem + "memory.limit_in_bytes": V1_UNLIMITED + "\n",
            mem + "memory.usage_in_bytes": f"{9 * GIB}\n",
        },
    )
    assert available_host_memory(root) == HostMemoryBound(GIB, "cgroup memory.limit_in_bytes of /docker")


def test_nothing_readable_bounds_nothing(tmp_path):
    assert available_host_memory(tmp_path) is None


def test_swap_mode_refuses_a_swap_space_larger_than_the_host_has():
    available = available_host_memory()
    assert available is not None  # Linux: /proc/meminfo at least
    with pytest.raises(ValueError, match=r"swap_space \(--swap-space\): 1e\+09 GiB .* GiB this host has available"):
        EngineConfig(model="m", preemption_mode="swap", swap_space=1e9)
    with pytest.raises(ValueError, match="swap_space"):
        EngineConfig(model="m", preemption_mode="swap", swap_space=float("inf"))
    EngineConfig(model="m", preemption_mode="recompute", swap_space=1e9)  # recompute allocates no host pool


def test_each_tensor_parallel_rank_holds_its_own_host_pool():
    gib = available_host_memory().available_bytes / 2**30
    EngineConfig(model="m", preemption_mode="swap", swap_space=0.6 * gib)
    with pytest.raises(ValueError, match=r"GiB x 2 tensor-parallel ranks of host memory .* does not fit"):
        EngineConfig(model="m", preemption_mode="swap", swap_space=0.6 * gib, tensor_parallel_size=2)


def test_llm_raises_the_same_value_error(tiny_llama):
    with pytest.raises(ValueError, match=r"--swap-space.*available"):
        LLM(model=str(tiny_llama), preemption_mode="swap", swap_space=1e9, dtype="float32")


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_the_cli_exits_2_with_one_line_naming_the_flag(command):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(CLI), command, "--swap-space", "1e9", "--preemption-mode", "swap"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"pagedinfer {command}: error: swap_space (--swap-space): 1e+09 GiB"), proc.stderr
    assert "GiB this host has available" in line


def test_on_a_cpu_the_swap_pool_must_fit_beside_the_kv_pool_on_a_gpu_alone():
    from pagedinfer.engine.engine_setup import check_host_pools_fit

    bound = HostMemoryBound(10 * GIB, "cgroup memory.max of /kubepods/pod1")
    config = EngineConfig(model="m", preemption_mode="swap", swap_space=1.0)
    check_host_pools_fit(config, "cpu", 9 * GIB, GIB, bound)  # exactly fits
    with pytest.raises(
        ValueError,
        match=r"--swap-space\): 1 GiB of host swap pool beside this CPU engine's 9\.50 GiB"
        r" KV pool does not fit in the 10\.00 GiB .*memory\.max of /kubepods/pod1",
    ):
        check_host_pools_fit(config, "cpu", 9 * GIB + GIB // 2, GIB, bound)
    with pytest.raises(ValueError, match=r"KV pool, x 2 tensor-parallel ranks does not fit"):
        check_host_pools_fit(
            EngineConfig(model="m", preemption_mode="swap", swap_space=1.0, tensor_parallel_size=2),
            "cpu",
            4 * GIB + 1,
            GIB,
            bound,
        )
    check_host_pools_fit(config, "cuda", 100 * GIB, GIB, bound)  # a GPU's KV pool is device memory
    check_host_pools_fit(config, "cpu", 100 * GIB, 0, bound)  # recompute: no swap pool, the budget is the bound
    check_host_pools_fit(config, "cpu", 100 * GIB, GIB, None)  # nothing readable bounds nothing


def test_a_cpu_engine_refuses_a_swap_pool_that_fits_only_without_its_kv_pool(tiny_llama):
    """The config's check passes (the swap pool alone fits with a GiB to spare); the engine, which knows its
    KV pool (about 2 GiB of the 3 GiB budget), refuses before allocating either."""
    swap_gib = available_host_memory().available_bytes / GIB - 1.0
    with pytest.raises(ValueError, match=r"--swap-space\): .* GiB of host swap pool beside this CPU engine's"):
        LLM(
            model=str(tiny_llama),
            preemption_mode="swap",
            swap_space=swap_gib,
            dtype="float32",
            device="cpu",
            cpu_memory_budget_bytes=3 * GIB,
        )
