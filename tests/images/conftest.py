"""Fixtures: the images scripts/build_images.sh built (skip without them, fail in CI), a working
container of each, and the package sets pip resolves for them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from built_images import BuiltImage, WorkingContainer, built_image
from dockerfiles import IMAGES, Install, dry_run


@pytest.fixture(scope="session")
def operator_image() -> BuiltImage:
    return built_image("operator")


@pytest.fixture(scope="session")
def engine_cpu_image() -> BuiltImage:
    return built_image("engine-cpu")


@pytest.fixture(scope="session")
def router_image() -> BuiltImage:
    return built_image("router")


@pytest.fixture(scope="session")
def operator_container(operator_image):
    container = WorkingContainer.create(operator_image)
    yield container
    container.remove()


@pytest.fixture(scope="session")
def engine_cpu_container(engine_cpu_image):
    container = WorkingContainer.create(engine_cpu_image)
    yield container
    container.remove()


@pytest.fixture(scope="session")
def router_container(router_image):
    container = WorkingContainer.create(router_image)
    yield container
    container.remove()


@pytest.fixture(scope="session")
def resolved(tmp_path_factory) -> dict[str, Install]:
    """{image: its install}: each image's lock and wheel install replayed as a pip dry run."""
    tmp = tmp_path_factory.mktemp("dry-run")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {image: pool.submit(dry_run, image, tmp) for image in IMAGES}
        return {image: future.result() for image, future in futures.items()}
