"""Fixtures: a KubeEmulator on 127.0.0.1 and $KUBECONFIG pointing at it."""

import pytest

from pagedinfer.testing.operator_harness import serving_emulator, write_kubeconfig


@pytest.fixture
async def emulator(tmp_path, monkeypatch):
    async with serving_emulator() as (emu, url):
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield emu
