"""The nsbox Inspect provider with an image as the root: `image:` naming an OCI
layout (loaded into the store) or a reference already in the store, the image's
working directory and environment, a writable root, and a missing reference."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from sandbox.images import ImageStore  # noqa: E402
from sandbox.inspect import ConfigError, NsboxConfig, NsboxSandboxEnvironment  # noqa: E402

from .image_helpers import DIRTYPE, TestImage, layer, member, runnable_layer, write_layout  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.usefixtures("require_native")]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SANDBOX_IMAGES", str(tmp_path / "store"))  # ImageStore()'s default, for this test
    top = layer(member("srv/", DIRTYPE, mode=0o755), member("srv/marker", data=b"from the image\n"))
    image = TestImage([runnable_layer(), top],
                      env=["PATH=/usr/bin:/bin", "GREETING=hi"], working_dir="/srv")
    path = str(tmp_path / "layout")
    write_layout(path, [(image, "example.test/tool:1")])
    return path


async def test_an_image_by_layout_then_by_reference(layout: str) -> None:
    for name in (layout, "example.test/tool:1"):  # the layout's load puts its reference in the store
        config = NsboxConfig(image=name)
        environments = await NsboxSandboxEnvironment.sample_init("image", config, {})
        try:
            box = environments["default"]
            done = await box.exec(["sh", "-c", "pwd; cat marker; echo $GREETING; id -u"])
            assert done.stdout == "/srv\nfrom the image\nhi\n0\n", done.stderr
            await box.write_file("/usr/new", "written")  # the image's root is writable, per sample
            assert await box.read_file("/usr/new") == "written"
        finally:
            await NsboxSandboxEnvironment.sample_cleanup("image", config, environments, False)
    layers = ImageStore().get("example.test/tool:1").layers
    assert not any((Path(layer.path) / "usr" / "new").exists() for layer in layers)


async def test_a_missing_image_is_a_config_error(layout: str) -> None:
    with pytest.raises(ConfigError, match="image: .*example.test/other:2"):
        await NsboxSandboxEnvironment.task_init("image", NsboxConfig(image="example.test/other:2"))
