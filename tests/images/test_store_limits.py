"""A full disk, a file size limit, and several processes sharing one store."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from http_serving import serving

from sandbox.images import ImageStore

from .image_helpers import OCI_MANIFEST, TestImage, layer, member, write_layout

# Loads the layout argv[2] into a store at argv[1]; prints what happened and what the store holds.
LOAD = """
import json, os, sys
from sandbox.images import ImageStore
store = ImageStore(sys.argv[1])
try:
    img = store.load(sys.argv[2])
    out = {"ok": img.digest}
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc), "errno": getattr(exc, "errno", None)}
out["held"] = {d: sorted(os.listdir(os.path.join(store.path, d))) for d in ("refs", "layers", "tmp")}
print(json.dumps(out))
"""


def _big_layout(tmp_path: Path) -> Path:
    """An image whose second layer holds 8 MiB that do not compress (urandom)."""
    layout = tmp_path / "layout"
    small = layer(member("etc/small", data=b"fits\n"))
    big = layer(member("big", data=os.urandom(8 << 20)))
    write_layout(str(layout), [(TestImage([small, big], compression="tar"), "example.org/big:1")])
    os.chmod(tmp_path, 0o755)
    return layout


def _result(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_full_disk_in_a_small_tmpfs(tmp_path: Path) -> None:
    """ENOSPC on a 4 MiB tmpfs mounted in a private mount namespace of a child (`unshare -m`,
    with `-r` unprivileged): StoreFullError, and nothing of the image kept."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    layout = _big_layout(tmp_path)
    mnt = tmp_path / "small"
    mnt.mkdir()
    flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    script = 'mount -t tmpfs -o size=4m tmpfs "$1" && exec "$2" -c "$3" "$1/store" "$4"'
    done = subprocess.run(["unshare", *flags, "sh", "-c", script, "sh", str(mnt), sys.executable, LOAD,
                           str(layout)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0 and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a new mount namespace here: {done.stderr.strip()}")
    out = _result(done)
    assert out.get("error") == "StoreFullError", out
    assert "No space left" in str(out["message"])
    held = out["held"]
    assert isinstance(held, dict)
    assert held["refs"] == [] and held["tmp"] == []
    assert len(held["layers"]) <= 1  # the small first layer, complete, at most
    assert os.listdir(mnt) == []  # the tmpfs was the child's: nothing here


def test_file_size_limit(tmp_path: Path) -> None:
    """RLIMIT_FSIZE (SIGXFSZ ignored): EFBIG is a StoreFullError too, nothing kept."""
    layout = _big_layout(tmp_path)
    prelude = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n")
    done = subprocess.run([sys.executable, "-c", prelude + LOAD, str(tmp_path / "store"), str(layout)],
                          capture_output=True, text=True, timeout=120)
    out = _result(done)
    assert out.get("error") == "StoreFullError" and out["errno"] == 27, out  # EFBIG
    held = out["held"]
    assert isinstance(held, dict)
    assert held["refs"] == [] and held["tmp"] == [] and len(held["layers"]) <= 1


def test_concurrent_loads_share_the_store(tmp_path: Path) -> None:
    layout = _big_layout(tmp_path)
    store = tmp_path / "store"
    counting = ("import sandbox.images.store as st, sys\n"  # each unpack of a layer adds a line
                f"def unpack(*a, _real=st.unpack, **k):\n    open({str(tmp_path / 'unpacks')!r}, 'a').write('1\\n')\n"
                "    return _real(*a, **k)\nst.unpack = unpack\n")
    procs = [subprocess.Popen([sys.executable, "-c", counting + LOAD, str(store), str(layout)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r.get("ok") for r in results}) == 1 and results[0].get("ok"), results
    assert len(os.listdir(store / "layers")) == 2
    assert os.listdir(store / "tmp") == []
    # each layer was unpacked by one process only: the others waited on its lock and found it
    assert (tmp_path / "unpacks").read_text().count("\n") == 2
    img = ImageStore(store).get("example.org/big:1")
    assert Path(img.layers[1].path, "big").stat().st_size == 8 << 20


def test_gc_waits_for_a_load_in_progress(tmp_path: Path) -> None:
    """gc() takes the store's lock exclusively; a load holds it shared (here: a child holding it)."""
    store = ImageStore(tmp_path / "store")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from sandbox.images import ImageStore; s = ImageStore(sys.argv[1])\n"
         "with s._lock.hold(exclusive=False):\n    print('held', flush=True); sys.stdin.read()", store.path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        finished = threading.Event()

        def collect() -> None:
            store.gc()
            finished.set()

        worker = threading.Thread(target=collect)
        worker.start()
        time.sleep(0.5)
        assert not finished.is_set(), "gc ran while a load held the lock"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    worker.join(30)
    assert finished.is_set()


# Pulls argv[2] over plain HTTP into a store at argv[1].
PULL = LOAD.replace("store.load(sys.argv[2])", "store.pull(sys.argv[2], insecure=True)")


@contextlib.contextmanager
def stalling_registry(image: TestImage, stall: str) -> Iterator[tuple[str, threading.Event]]:
    """A registry on 127.0.0.1 that serves `image` (as repository "killed", tag "1") but sends only the
    first half of the blob `stall` and then holds the connection until the event is set."""
    manifest, blobs = image.blobs()
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/v2/killed/manifests/1":
                body, media = manifest, OCI_MANIFEST
            elif self.path.startswith("/v2/killed/blobs/") and self.path.rsplit("/", 1)[1] in blobs:
                body, media = blobs[self.path.rsplit("/", 1)[1]], "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.path.endswith(stall):
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                release.wait(60)
                self.close_connection = True
                return
            self.wfile.write(body)

    with serving(Handler) as port:
        try:
            yield f"127.0.0.1:{port}/killed:1", release
        finally:
            release.set()  # the held request ends


def test_a_load_killed_midway_leaves_nothing_used(tmp_path: Path) -> None:
    """SIGKILL while a layer is half read (a registry sends half its blob, then waits): no name, no
    layer directory; gc() removes the leftover in tmp/, and the image then loads whole."""
    import signal

    from .image_helpers import sha256

    tar = layer(member("big", data=os.urandom(1 << 20)))
    image = TestImage([tar], compression="tar")
    layout = tmp_path / "layout"
    write_layout(str(layout), [(image, "example.org/killed:1")])
    store = tmp_path / "store"
    with stalling_registry(image, sha256(tar)) as (ref, _):
        loader = subprocess.Popen([sys.executable, "-c", PULL, str(store), ref], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 30
            while not any((store / "tmp").glob("layer.*/root/big")):
                assert loader.poll() is None and time.monotonic() < deadline, "the loader never read the blob"
                time.sleep(0.02)
            loader.send_signal(signal.SIGKILL)
            loader.wait(30)
        finally:
            if loader.poll() is None:
                loader.kill()
            loader.communicate()
    assert loader.returncode == -signal.SIGKILL
    assert os.listdir(store / "refs") == [] and os.listdir(store / "layers") == []
    assert len(os.listdir(store / "tmp")) == 1  # the half-unpacked layer, never published
    done = ImageStore(store).gc()
    assert done.temporaries == 1 and os.listdir(store / "tmp") == []
    img = ImageStore(store).load(layout)
    assert Path(img.layers[0].path, "big").read_bytes() == tar[512:512 + (1 << 20)]
