"""What the built images hold: their lock and wheel, as the replayed install has them, a bounded size, and OCI archives
that `kind load image-archive` and `ctr images import` take, named as the chart expects."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from built_images import BuiltImage, ImageContainer, WorkingContainer, skip_or_fail
from dockerfiles import canonical

pytestmark = pytest.mark.slow

IMAGE_NAMES = ["operator", "engine-cpu", "router"]
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print('DISTRIBUTIONS', json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)
MIB = 2**20
# Each image's size ceiling: the operator and the router have no torch; the CPU
# engine no CUDA libraries and no triton (the CUDA image's torch alone is several GB).
SIZE_CEILING_BYTES = {"operator": 500 * MIB, "engine-cpu": 2048 * MIB, "router": 500 * MIB}
WITHOUT_TORCH = ("operator", "router")


def fixture_of(request, name: str, what: str):
    return request.getfixturevalue(f"{name.replace('-', '_')}_{what}")


def distributions(container: WorkingContainer, scratch: Path) -> dict[str, str]:
    """{canonical name: version} of what Python finds installed in the container."""
    with ImageContainer(container, ["python", "-c", LIST_DISTRIBUTIONS], scratch) as process:
        code = process.process.wait(timeout=120)
    log = process.log()
    assert code == 0, log
    return {canonical(n): v for n, v in json.loads(log.split("DISTRIBUTIONS ", 1)[1].splitlines()[0]).items()}


@pytest.fixture(scope="module")
def base_distributions(operator_image, tmp_path_factory) -> dict[str, str]:
    """What the local base image has installed (pip and setuptools of its venv)."""
    base = WorkingContainer.create(operator_image, operator_image.base)
    try:
        return distributions(base, tmp_path_factory.mktemp("base"))
    finally:
        base.remove()


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_the_image_holds_exactly_what_pip_resolved_for_it(name, resolved, base_distributions, tmp_path, request):
    image: BuiltImage = fixture_of(request, name, "image")
    assert image.base == request.getfixturevalue("operator_image").base
    installed = distributions(fixture_of(request, name, "container"), tmp_path)
    added = {n: v for n, v in installed.items() if base_distributions.get(n) != v}
    assert added == resolved[name].packages
    heavy = sorted(
        n
        for n in added
        if n == "triton" or n.startswith("nvidia-") or (name in WITHOUT_TORCH and n in ("torch", "transformers"))
    )
    assert not heavy, f"{name} holds {heavy}"


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_the_image_size_is_bounded_and_reported(name, request):
    image: BuiltImage = fixture_of(request, name, "image")
    print(f"{image.tag}: {image.size_bytes / MIB:.0f} MiB unpacked, {image.archive_bytes / MIB:.0f} MiB archive")
    assert image.size_bytes < SIZE_CEILING_BYTES[name], f"{image.tag}: {image.size_bytes / MIB:.0f} MiB"


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_the_archive_is_an_oci_layout_naming_the_chart_tag_whose_blobs_match_their_digests(name, request):
    image: BuiltImage = fixture_of(request, name, "image")
    with tarfile.open(image.archive) as archive:

        def blob(digest: str) -> tuple[tarfile.TarInfo, object]:
            member = archive.getmember(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            return member, archive.extractfile(member)

        assert json.loads(archive.extractfile("oci-layout").read())["imageLayoutVersion"] == "1.0.0"
        (entry,) = json.loads(archive.extractfile("index.json").read())["manifests"]
        # containerd's import keeps a full reference as the image name (kind and ctr alike).
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == image.tag
        manifest = json.loads(blob(entry["digest"])[1].read())
        assert manifest["config"]["digest"] == f"sha256:{image.id}"
        for descriptor in [manifest["config"], *manifest["layers"]]:
            member, data = blob(descriptor["digest"])
            digest = f"sha256:{hashlib.file_digest(data, 'sha256').hexdigest()}"
            assert (digest, member.size) == (descriptor["digest"], descriptor["size"])
        assert all(layer["mediaType"].endswith("tar+gzip") for layer in manifest["layers"])


def test_containerd_imports_the_operator_archive_under_the_charts_tag(operator_image, tmp_path):
    """What `kind load image-archive` runs in a node: `ctr images import --all-platforms --digests`, unpacked.

    A containerd of its own (root, state and socket under tmp_path); the CPU
    engine's archive is written by the same `buildah push` and checked above.
    """
    if shutil.which("containerd") is None or shutil.which("ctr") is None:
        skip_or_fail("containerd not installed (apt-get install containerd)")
    config = tmp_path / "config.toml"
    socket = tmp_path / "containerd.sock"
    config.write_text(
        f'version = 2\nroot = "{tmp_path / "root"}"\nstate = "{tmp_path / "state"}"\n[grpc]\n  address = "{socket}"\n'
    )
    with (tmp_path / "containerd.log").open("wb") as log:
        daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io"]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([*ctr, "version"], capture_output=True, timeout=30).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, (tmp_path / "containerd.log").read_text()
            time.sleep(0.2)
        imported = subprocess.run(
            [
                *ctr,
                "images",
                "import",
                "--all-platforms",
                "--digests",
                "--snapshotter=native",
                str(operator_image.archive),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert imported.returncode == 0, imported.stderr
        names = subprocess.run(
            [*ctr, "images", "ls", "--quiet"], capture_output=True, text=True, timeout=60
        ).stdout.split()
        assert operator_image.tag in names
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
