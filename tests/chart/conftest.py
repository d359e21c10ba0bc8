"""Fixtures for the chart tests: the Helm binary (skip without it, fail in CI)."""

from __future__ import annotations

import pytest
from helm_chart import require_helm


@pytest.fixture(scope="session")
def helm() -> str:
    return require_helm()
