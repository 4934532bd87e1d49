"""ImageStore.pull against a real registry (Debian's docker-registry) on
127.0.0.1, with images the tests push with their own small client."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox.images import (
    DigestMismatchError,
    ImageNotFoundError,
    ImageStore,
    RegistryError,
    UnsupportedPlatformError,
)

from .image_helpers import (
    OCI_INDEX,
    TestImage,
    layer,
    member,
    push,
    push_blob,
    put_manifest,
    sha256,
)
from .registry_proxy import Tamper, proxy
from .test_store import check_host_image


def test_pull_over_plain_http_when_asked(store: ImageStore, registry: str, host_image: TestImage) -> None:
    digest = push(registry, "test/host", "v1", host_image)
    img = store.pull(f"{registry}/test/host:v1", insecure=True)
    assert img.digest == digest
    assert img.names == (f"{registry}/test/host:v1",)
    check_host_image(img, host_image)
    assert store.get(f"{registry}/test/host:v1") == img
    # by digest too; the layers are not unpacked again
    inodes = [os.stat(layer.path).st_ino for layer in img.layers]
    again = store.pull(f"{registry}/test/host@{digest}", insecure=True)
    assert again.digest == digest
    assert [os.stat(layer.path).st_ino for layer in again.layers] == inodes


def test_plain_http_refused_unless_asked(store: ImageStore, registry: str, host_image: TestImage) -> None:
    push(registry, "test/host", "v1", host_image)
    with pytest.raises(RegistryError, match="insecure=True") as info:
        store.pull(f"{registry}/test/host:v1")
    assert info.value.url.startswith("https://")
    assert os.listdir(Path(store.path) / "refs") == []


def test_unknown_ref(store: ImageStore, registry: str) -> None:
    with pytest.raises(ImageNotFoundError, match="MANIFEST_UNKNOWN|NAME_UNKNOWN"):
        store.pull(f"{registry}/test/nothing:v1", insecure=True)
    with pytest.raises(ImageNotFoundError):
        store.pull(f"{registry}/test/nothing@sha256:{'1' * 64}", insecure=True)


def _push_index(registry: str, repo: str, tag: str, by_arch: dict[str, TestImage]) -> dict[str, str]:
    entries, digests = [], {}
    for arch, image in by_arch.items():
        digest = push(registry, repo, f"only-{arch}", image)
        manifest, _ = image.blobs()
        entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest,
                        "size": len(manifest), "platform": {"os": "linux", "architecture": arch}})
        digests[arch] = digest
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()
    put_manifest(registry, repo, tag, index, OCI_INDEX)
    return digests


def test_index_picks_linux_amd64(store: ImageStore, registry: str) -> None:
    arm = TestImage([layer(member("arch", data=b"arm64\n"))], architecture="arm64")
    amd = TestImage([layer(member("arch", data=b"amd64\n"))])
    digests = _push_index(registry, "test/multi", "v1", {"arm64": arm, "amd64": amd})
    img = store.pull(f"{registry}/test/multi:v1", insecure=True)
    assert img.digest == digests["amd64"]
    assert Path(img.layers[0].path, "arch").read_text() == "amd64\n"


def test_index_without_linux_amd64(store: ImageStore, registry: str) -> None:
    arm = TestImage([layer(member("arch", data=b"arm64\n"))], architecture="arm64")
    _push_index(registry, "test/armonly", "v1", {"arm64": arm})
    with pytest.raises(UnsupportedPlatformError, match="linux/arm64") as info:
        store.pull(f"{registry}/test/armonly:v1", insecure=True)
    assert info.value.available == ["linux/arm64"]
    with pytest.raises(UnsupportedPlatformError):  # the arm64 manifest itself, by tag
        store.pull(f"{registry}/test/armonly:only-arm64", insecure=True)
    assert os.listdir(Path(store.path) / "layers") == []


def test_blob_digest_mismatch(store: ImageStore, registry: str) -> None:
    image = TestImage([layer(member("f", data=os.urandom(4096)))])
    push(registry, "test/tampered", "v1", image)
    blob = sha256(image.layer_blobs()[0][1])
    with proxy(registry, Tamper(blob, "flip")) as mitm:
        with pytest.raises(DigestMismatchError) as info:
            store.pull(f"{mitm}/test/tampered:v1", insecure=True)
    assert blob in str(info.value)
    for sub in ("refs", "layers", "tmp"):
        assert os.listdir(Path(store.path) / sub) == []


def test_manifest_digest_mismatch(store: ImageStore, registry: str) -> None:
    """A manifest altered on the way: it no longer hashes to the Docker-Content-Digest the registry sent."""
    push(registry, "test/tampered", "m1", TestImage([layer(member("f", data=b"x"))]))
    with proxy(registry, Tamper("/manifests/m1", "flip")) as mitm:
        with pytest.raises(DigestMismatchError, match="manifests/m1"):
            store.pull(f"{mitm}/test/tampered:m1", insecure=True)
    assert os.listdir(Path(store.path) / "refs") == []


def test_interrupted_pull_keeps_nothing_and_resumes(store: ImageStore, registry: str,
                                                    host_image: TestImage) -> None:
    push(registry, "test/host", "v1", host_image)
    cut = sha256(host_image.layer_blobs()[1][1])  # the second layer: the first is complete by then
    tamper = Tamper(cut, "cut")
    with proxy(registry, tamper) as mitm:
        with pytest.raises(RegistryError, match="cut short|ended after"):
            store.pull(f"{mitm}/test/host:v1", insecure=True)
        assert os.listdir(Path(store.path) / "refs") == []
        assert os.listdir(Path(store.path) / "tmp") == []
        assert len(os.listdir(Path(store.path) / "layers")) == 1  # the first, complete, layer is kept
        tamper.digest = ""
        tamper.blob_requests.clear()
        img = store.pull(f"{mitm}/test/host:v1", insecure=True)
    check_host_image(img, host_image)
    first = sha256(host_image.layer_blobs()[0][1])
    assert first not in tamper.blob_requests  # not fetched again


def test_push_helper_blob_reused(registry: str) -> None:
    """The push client itself: a blob pushed twice is accepted (the registry dedupes)."""
    data = b"x" * 100
    push_blob(registry, "test/dup", sha256(data), data)
    push_blob(registry, "test/dup", sha256(data), data)


def test_docker_v2_manifest(store: ImageStore, registry: str) -> None:
    """Docker's own media types (schema 2 manifest, container config, rootfs.diff.tar.gzip layers)."""
    import gzip

    tar = layer(member("docker", data=b"schema 2\n"))
    blob = gzip.compress(tar, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/true"]},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]}}).encode()
    for data in (blob, config):
        push_blob(registry, "test/docker", sha256(data), data)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": sha256(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "digest": sha256(blob),
                    "size": len(blob)}]}).encode()
    digest = put_manifest(registry, "test/docker", "v2", manifest,
                          "application/vnd.docker.distribution.manifest.v2+json")
    img = store.pull(f"{registry}/test/docker:v2", insecure=True)
    assert img.digest == digest and img.config.cmd == ("/bin/true",)
    assert Path(img.layers[0].path, "docker").read_text() == "schema 2\n"
