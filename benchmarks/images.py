"""The image store: first pull + unpack of a ~50 MB image made from this host's files.

The image is one gzip layer of /usr/lib/python3.11 (about 50 MB unpacked,
several thousand files) built here into an OCI layout, and pushed to a
docker-registry started on 127.0.0.1 (Debian's `docker-registry`; without
it the pull rows are missing). Each run uses a fresh, empty store in a
temporary directory on the same file system, so every run fetches, checks
and unpacks everything ("first pull"); the rows, interleaved round-robin:

- `pull` over plain HTTP from the local registry (`insecure=True`), a
  fresh store: manifest, config and the layer blob, streamed through the
  digest checks and unpacked in one pass;
- `load` of the OCI layout directory into a fresh store (no network);
- `pull, layers present`: the same pull into a store that has the layer
  (only the manifest and config are fetched);
- `tar -xzf` of the same blob into an empty directory, the floor.

Medians and the spread, in ms, with the unpacked size and the file count.

Then image roots (issue 27): an image of this host's /usr/bin/true and the
libraries it loads (two layers), loaded into a store, and spawn + wait of
`/bin/true`, interleaved round-robin: a Template of `presets.image` (its
overlay, each sandbox its own writable layer; and its merged tree) against
a Template of `presets.minimal_system` (the host's /usr; target: at most 1.3x);
`sandbox.spawn` of the image's overlay root and of the host's /usr; and
`podman run --rm` of the same image (target: the Template at most 0.05x of
it), a row left out, with the reason, where podman cannot run here.

    python benchmarks/images.py [-n 5] [--src /usr/lib/python3.11] [--json out.json] [--roots-only]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sandbox
from sandbox.images import ImageStore
from sandbox.images.treewalk import remove_entry

PULL = "pull (fresh store)"
LOAD = "load of the OCI layout (fresh store)"
WARM = "pull, layers present"
TAR = "tar -xzf of the blob (floor)"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def build(src: str, layout: str) -> tuple[bytes, dict[str, bytes], int, int]:
    """An OCI layout of one gzip layer of `src`; (manifest, blobs by digest, files and bytes in the layer)."""
    buf = io.BytesIO()
    files = size = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for dirpath, dirnames, filenames in os.walk(src):
            dirnames.sort()
            for name in [dirpath, *(os.path.join(dirpath, f) for f in sorted(filenames))]:
                info = tf.gettarinfo(name, arcname=name.lstrip("/"))
                if info.isdev():
                    continue
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                files += info.isreg()
                size += info.size if info.isreg() else 0
                if info.isreg():
                    with open(name, "rb") as f:
                        tf.addfile(info, f)
                else:
                    tf.addfile(info)
    tar = buf.getvalue()
    blob = gzip.compress(tar, compresslevel=6, mtime=0)
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(tar)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config),
                   "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(blob),
                    "size": len(blob)}]}).encode()
    blobs = {sha256(blob): blob, sha256(config): config, sha256(manifest): manifest}
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    for digest, data in blobs.items():
        with open(os.path.join(layout, "blobs", "sha256", digest[7:]), "wb") as blob_file:
            blob_file.write(data)
    with open(os.path.join(layout, "index.json"), "w") as out:
        json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                       "digest": sha256(manifest), "size": len(manifest)}]}, out)
    with open(os.path.join(layout, "oci-layout"), "w") as out:
        json.dump({"imageLayoutVersion": "1.0.0"}, out)
    return manifest, blobs, files, size


@contextmanager
def registry(work: str) -> Iterator[str | None]:
    """A docker-registry on a free 127.0.0.1 port, storage in `work`; None when it is not installed."""
    binary = shutil.which("docker-registry") or ("/usr/bin/docker-registry"
                                                  if os.path.exists("/usr/bin/docker-registry") else None)
    if binary is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.makedirs(work, exist_ok=True)
    config = os.path.join(work, "config.yml")
    with open(config, "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n"
                f"    rootdirectory: {work}/data\nhttp:\n  addr: 127.0.0.1:{port}\n")
    proc = subprocess.Popen([binary, "serve", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("docker-registry did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def push(addr: str, repo: str, manifest: bytes, blobs: dict[str, bytes]) -> None:
    """The registry API's monolithic upload of every blob, then the manifest as :bench."""
    for digest, data in blobs.items():
        if data is manifest:
            continue
        req = urllib.request.Request(f"http://{addr}/v2/{repo}/blobs/uploads/", method="POST", data=b"")
        with urllib.request.urlopen(req) as resp:
            location = resp.headers["Location"]
        location = f"http://{addr}{location}" if location.startswith("/") else location
        req = urllib.request.Request(f"{location}{'&' if '?' in location else '?'}digest={digest}", method="PUT",
                                     data=data, headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req).close()
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/manifests/bench", method="PUT", data=manifest,
                                 headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
    urllib.request.urlopen(req).close()


def _remove_tree(path: str) -> None:
    """Remove `path`, a tree the store wrote (a layer may have read-only directories)."""
    parent = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        remove_entry(parent, os.path.basename(path))
    finally:
        os.close(parent)


def variants(work: str, layout: str, ref: str | None, blob_path: str) -> dict[str, Callable[[], object]]:
    """name -> one run (each into fresh directories under `work`, removed after)."""
    count = iter(range(1 << 30))

    def fresh() -> str:
        return os.path.join(work, f"run{next(count)}")

    def timed_store(fn: Callable[[ImageStore], object]) -> Callable[[], object]:
        def run() -> None:
            path = fresh()
            try:
                fn(ImageStore(path))
            finally:
                _remove_tree(path)
        return run

    out: dict[str, Callable[[], object]] = {}
    if ref is not None:
        out[PULL] = timed_store(lambda s: s.pull(ref, insecure=True))
        warm = ImageStore(os.path.join(work, "warm"))
        warm.pull(ref, insecure=True)
        out[WARM] = lambda: _pull_with_layers(warm, ref)
    out[LOAD] = timed_store(lambda s: s.load(layout))

    def untar() -> None:
        path = fresh()
        os.mkdir(path)
        try:
            subprocess.run(["tar", "-xzf", blob_path, "-C", path], check=True)
        finally:
            shutil.rmtree(path)
    if shutil.which("tar"):
        out[TAR] = untar
    return out


def _pull_with_layers(store: ImageStore, ref: str) -> None:
    """A pull whose layer is already unpacked: the name is dropped (its blobs stay until gc), then pulled again."""
    store.remove(ref)
    store.pull(ref, insecure=True)


def measure(fns: dict[str, Callable[[], object]], n: int) -> dict[str, list[float]]:
    """Round-robin runs (one warm-up round, untimed), ms per run."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for i in range(n + 1):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append((time.perf_counter() - t0) * 1000)
    return times


def table(times: dict[str, list[float]], size: int, files: int, blob: int) -> str:
    rows = [f"Image: one gzip layer, {blob / 1e6:.1f} MB compressed, {size / 1e6:.1f} MB and {files} files "
            "unpacked.", "", "| variant | median ms | min ms | max ms | MB/s unpacked | runs |",
            "|---|---|---|---|---|---|"]
    for name, xs in times.items():
        med = statistics.median(xs)
        rate = f"{size / 1e6 / (med / 1000):.0f}" if name != WARM else "-"
        rows.append(f"| {name} | {med:.0f} | {min(xs):.0f} | {max(xs):.0f} | {rate} | {len(xs)} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5, help="timed runs of each variant (default 5)")
    ap.add_argument("--src", default=f"/usr/lib/python{sys.version_info[0]}.{sys.version_info[1]}",
                    help="the host directory the image is made of")
    ap.add_argument("--json", help="also write the raw per-run times here")
    ap.add_argument("--roots-only", action="store_true", help="only the image-root rows")
    ap.add_argument("--roots-n", type=int, default=200, help="spawns per image-root row (default 200)")
    ap.add_argument("--podman", action="store_true",
                    help="also time `podman run --rm` of the image (it writes podman's storage on the host)")
    args = ap.parse_args()
    if args.roots_only:
        print(image_roots(args.roots_n, args.podman))
        return 0
    print(f"# image store, n={args.n}, uid={os.getuid()}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}, "
          f"kernel {os.uname().release}, load {os.getloadavg()[0]:.2f}; sandbox {sandbox.__version__}")
    with tempfile.TemporaryDirectory(prefix="sandbox-images-bench-") as work:
        layout = os.path.join(work, "layout")
        manifest, blobs, files, size = build(args.src, layout)
        blob_digest = json.loads(manifest)["layers"][0]["digest"]
        blob_path = os.path.join(layout, "blobs", "sha256", blob_digest[7:])
        with registry(os.path.join(work, "registry")) as addr:
            ref = None
            if addr is None:
                print("# docker-registry is not installed: no pull rows (Debian: apt-get install docker-registry)")
            else:
                push(addr, "bench/python", manifest, blobs)
                ref = f"{addr}/bench/python:bench"
            times = measure(variants(work, layout, ref, blob_path), args.n)
    print(table(times, size, files, len(blobs[blob_digest])))
    print()
    print(image_roots(args.roots_n, args.podman))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(times, f)
    return 0


# ---------------------------------------------------------------- image roots

T_OVERLAY = "Template, image root (overlay per sandbox)"
BACK = ", back to back"
T_IMAGE = "Template, image root (merged tree)"
T_HOST = "Template, host /usr (minimal_system)"
S_IMAGE = "sandbox.spawn, image root (overlay)"
S_HOST = "sandbox.spawn, host /usr (minimal_system)"
PODMAN = "podman run --rm --network none"
# podman's default rlimits (nofile 1048576) exceed what a host may allow (EPERM from crun's setrlimit)
PODMAN_ARGS = ("run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024")


def true_layers() -> list[bytes]:
    """Two layers: this host's /usr/bin/true with its loader and libc (and the
    links bin, lib, lib64 into usr), then one that adds a file."""
    files = {"usr/bin/true": os.path.realpath("/usr/bin/true")}
    out = subprocess.run(["ldd", "/usr/bin/true"], capture_output=True, text=True, check=True).stdout
    for word in out.split():
        if word.startswith("/"):
            files[os.path.realpath(word).lstrip("/")] = os.path.realpath(word)
            files[("usr" + word if not word.startswith("/usr/") else word).lstrip("/")] = os.path.realpath(word)
    bufs = []
    for members in (files, {"etc/image": None}):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            if members is files:
                for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
                    link = tarfile.TarInfo(name)
                    link.type, link.linkname = tarfile.SYMTYPE, target
                    tf.addfile(link)
            for arc, src in sorted(members.items()):
                info = tarfile.TarInfo(arc)
                data = open(src, "rb").read() if src else b"x\n"
                info.size, info.mode = len(data), 0o755
                tf.addfile(info, io.BytesIO(data))
        bufs.append(buf.getvalue())
    return bufs


def write_true_layout(layout: str) -> None:
    """An OCI layout of true_layers(), uncompressed, named `true`."""
    tars = true_layers()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/usr/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in tars]}}).encode()
    layers = [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(t), "size": len(t)}
              for t in tars]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": sha256(config), "size": len(config)}, "layers": layers}).encode()
    os.makedirs(os.path.join(layout, "blobs", "sha256"))
    for data in (*tars, config, manifest):
        with open(os.path.join(layout, "blobs", "sha256", sha256(data)[7:]), "wb") as f:
            f.write(data)
    with open(os.path.join(layout, "index.json"), "w") as out:
        json.dump({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": sha256(manifest),
            "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": "true"}}]}, out)
    with open(os.path.join(layout, "oci-layout"), "w") as out:
        json.dump({"imageLayoutVersion": "1.0.0"}, out)


def podman_image(layout: str) -> tuple[str | None, str]:
    """The layout pulled into podman's storage: (its name, "") or (None, why not)."""
    podman = shutil.which("podman")
    if podman is None:
        return None, "podman is not installed (Debian: apt-get install podman)"
    got = subprocess.run([podman, "pull", "-q", f"oci:{layout}:true"], capture_output=True, text=True)
    name = got.stdout.strip()  # the image's id
    if got.returncode == 0:
        got = subprocess.run([podman, *PODMAN_ARGS, name, "/bin/true"], capture_output=True, text=True)
        if got.returncode != 0:
            subprocess.run([podman, "rmi", "-f", name], capture_output=True)
    if got.returncode != 0:
        return None, f"podman cannot run it here: {(got.stderr or got.stdout).strip()[-300:]}"
    return name, ""


def image_roots(n: int, with_podman: bool = False) -> str:
    """The image-root rows (a Markdown table and the ratios); podman's only when asked."""
    from sandbox import presets

    # podman names an oci: image by its path, which must then be a valid reference: [a-z0-9] around "_"
    with tempfile.TemporaryDirectory(prefix="sbxroots", suffix="x") as work:
        layout = os.path.join(work, "layout")
        write_true_layout(layout)
        store = ImageStore(os.path.join(work, "store"))
        img = store.load(layout)
        overlay_spec = presets.image(img, root="overlay", store=store)
        merged_spec = presets.image(img, root="merged", store=store)
        host_spec = presets.minimal_system()
        podman, why = podman_image(layout) if with_podman else (None, "not asked (--podman)")
        with sandbox.Template(overlay_spec) as t_overlay, sandbox.Template(merged_spec) as t_image, \
                sandbox.Template(host_spec) as t_host:
            fns: dict[str, Callable[[], object]] = {
                T_OVERLAY: lambda: t_overlay.spawn(["/bin/true"]).wait(),
                T_IMAGE: lambda: t_image.spawn(["/bin/true"]).wait(),
                T_HOST: lambda: t_host.spawn(["/bin/true"]).wait(),
                S_IMAGE: lambda: sandbox.spawn(["/bin/true"], overlay_spec).wait(),
                S_HOST: lambda: sandbox.spawn(["/bin/true"], host_spec).wait(),
            }
            times = measure(fns, n)
            for name in (T_OVERLAY, T_HOST):  # each alone: its standbys' rebuilds compete with the next spawn
                times[name + BACK] = measure({name: fns[name]}, n)[name]
            if podman:
                podman_run = ["podman", *PODMAN_ARGS, podman, "/bin/true"]
                times[PODMAN] = measure({PODMAN: lambda: subprocess.run(podman_run, check=True)},
                                        max(3, n // 20))[PODMAN]
        if podman:
            subprocess.run(["podman", "rmi", "-f", podman], capture_output=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [f"Image roots: spawn + wait of /bin/true, medians of {n} (podman: {max(3, n // 20)}), "
            f"uid {os.getuid()}, load {os.getloadavg()[0]:.2f}.", "",
            "| variant | median ms | min ms | max ms | runs |", "|---|---|---|---|---|"]
    rows += [f"| {k} | {med[k]:.2f} | {min(v):.2f} | {max(v):.2f} | {len(v)} |" for k, v in times.items()]
    rows += ["", f"- Template, overlay image root / host /usr: {med[T_OVERLAY] / med[T_HOST]:.2f}x (target <= 1.3x)",
             f"- the same, each run back to back: {med[T_OVERLAY + BACK] / med[T_HOST + BACK]:.2f}x",
             f"- Template, merged image root / host /usr: {med[T_IMAGE] / med[T_HOST]:.2f}x",
             f"- sandbox.spawn, overlay image root / host /usr: {med[S_IMAGE] / med[S_HOST]:.2f}x"]
    if podman:
        rows.append(f"- Template, image root / podman run --rm: {med[T_IMAGE] / med[PODMAN]:.4f}x (target <= 0.05x)")
    else:
        rows.append(f"- podman row left out: {why}")
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
