"""Image references: parsing and normalization (pure, no I/O)."""

from __future__ import annotations

import pytest

from sandbox.images import InvalidReferenceError, parse

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("ref", "registry", "repository", "tag", "digest", "text"), [
    ("alpine", "docker.io", "library/alpine", "latest", None, "docker.io/library/alpine:latest"),
    ("alpine:3.19", "docker.io", "library/alpine", "3.19", None, "docker.io/library/alpine:3.19"),
    ("me/tool", "docker.io", "me/tool", "latest", None, "docker.io/me/tool:latest"),
    ("localhost/x", "localhost", "x", "latest", None, "localhost/x:latest"),
    ("127.0.0.1:5000/a/b:v1", "127.0.0.1:5000", "a/b", "v1", None, "127.0.0.1:5000/a/b:v1"),
    (f"ghcr.io/o/r@{DIGEST}", "ghcr.io", "o/r", None, DIGEST, f"ghcr.io/o/r@{DIGEST}"),
    (f"quay.io/o/r:t@{DIGEST}", "quay.io", "o/r", "t", DIGEST, f"quay.io/o/r:t@{DIGEST}"),
])
def test_parse(ref: str, registry: str, repository: str, tag: str | None, digest: str | None, text: str) -> None:
    parsed = parse(ref)
    assert (parsed.registry, parsed.repository, parsed.tag, parsed.digest) == (registry, repository, tag, digest)
    assert str(parsed) == text
    assert parse(str(parsed)) == parsed
    assert parsed.reference == (digest or tag)


@pytest.mark.parametrize(("ref", "problem"), [
    ("", "empty"),
    ("Upper/case", "lowercase"),
    ("x@sha256:short", "64 lowercase hex"),
    ("x:bad tag", "not a valid tag"),
    ("a/../b", "lowercase"),
    ("host:99999999999x/a", "host"),
])
def test_invalid(ref: str, problem: str) -> None:
    with pytest.raises(InvalidReferenceError, match=problem) as info:
        parse(ref)
    assert info.value.ref == ref
