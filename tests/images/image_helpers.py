"""Images made by the tests: layer tarballs (from host files or member by
member, hostile ones included), OCI layouts, `docker save` tarballs, and a
small push client of the registry API."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import urllib.request
from dataclasses import dataclass, field

DIRTYPE = tarfile.DIRTYPE
SYMTYPE = tarfile.SYMTYPE
LNKTYPE = tarfile.LNKTYPE
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


# The standard library's json package, this interpreter's: a host directory every test machine has.
JSON_DIR = os.path.dirname(json.__file__)
JSON_ARC = JSON_DIR.lstrip("/")


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- layer tarballs

def member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", mode: int = 0o644, **attrs: object
           ) -> tuple[tarfile.TarInfo, bytes]:
    """A tar member: `kind` is tarfile's type (REGTYPE, DIRTYPE, SYMTYPE, LNKTYPE, ...)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = 1_700_000_000
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE) else 0
    for key, value in attrs.items():
        setattr(info, key, value)
    return info, data


def layer(*members: tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """An uncompressed layer tarball of these members, in this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def layer_from_dir(src: str, arcname: str) -> bytes:
    """A layer of a host directory, put at `arcname` (no leading slash)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(src, arcname=arcname, filter=_portable)
    return buf.getvalue()


def _portable(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if info.isdev() or (info.name.endswith(".pyc") and "__pycache__" in info.name):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# ---------------------------------------------------------------- images

@dataclass
class TestImage:
    """Layers (uncompressed tars) and a config; blobs made on demand."""

    __test__ = False  # not a pytest class
    layers: list[bytes]
    env: list[str] = field(default_factory=lambda: ["PATH=/usr/bin:/bin"])
    working_dir: str = "/"
    cmd: list[str] = field(default_factory=lambda: ["/bin/sh"])
    compression: str = "gzip"
    architecture: str = "amd64"
    layer_media: str | None = None  # overrides every layer's media type

    def layer_blobs(self) -> list[tuple[str, bytes]]:
        out = []
        for tar in self.layers:
            if self.compression == "gzip":
                out.append((LAYER_GZIP, gzip.compress(tar, compresslevel=1, mtime=0)))
            else:
                out.append((LAYER_TAR, tar))
        if self.layer_media:
            out = [(self.layer_media, b) for _, b in out]
        return out

    def config(self) -> bytes:
        return json.dumps({
            "architecture": self.architecture, "os": "linux",
            "config": {"Env": self.env, "WorkingDir": self.working_dir, "Cmd": self.cmd, "User": "1000:1000",
                       "Entrypoint": ["/entry"]},
            "rootfs": {"type": "layers", "diff_ids": [sha256(t) for t in self.layers]},
        }).encode()

    def blobs(self) -> tuple[bytes, dict[str, bytes]]:
        """(manifest, every blob by digest including the manifest)."""
        config = self.config()
        layers = self.layer_blobs()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": sha256(config), "size": len(config)},
            "layers": [{"mediaType": m, "digest": sha256(b), "size": len(b)} for m, b in layers],
        }).encode()
        blobs = {sha256(b): b for _, b in layers}
        blobs[sha256(config)] = config
        blobs[sha256(manifest)] = manifest
        return manifest, blobs


def write_layout(path: str, images: list[tuple[TestImage, str | None]]) -> list[str]:
    """An OCI image layout at `path`; each image with its ref.name annotation. Returns the manifest digests."""
    os.makedirs(os.path.join(path, "blobs", "sha256"), exist_ok=True)
    entries, digests = [], []
    for image, name in images:
        manifest, blobs = image.blobs()
        for digest, data in blobs.items():
            with open(os.path.join(path, "blobs", "sha256", digest[7:]), "wb") as f:
                f.write(data)
        entry: dict[str, object] = {"mediaType": OCI_MANIFEST, "digest": sha256(manifest), "size": len(manifest)}
        if name:
            entry["annotations"] = {"org.opencontainers.image.ref.name": name}
        entries.append(entry)
        digests.append(sha256(manifest))
    with open(os.path.join(path, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, f)
    return digests


def tar_directory(src: str, dest: str) -> None:
    """A tarball of a directory's contents (an OCI archive of a layout)."""
    with tarfile.open(dest, "w") as tf:
        for name in sorted(os.listdir(src)):
            tf.add(os.path.join(src, name), arcname=name)


def docker_save(dest: str, image: TestImage, repo_tag: str) -> None:
    """A classic `docker save` tarball: manifest.json, <id>.json, <id>/layer.tar."""
    config = image.config()
    with tarfile.open(dest, "w") as tf:
        names = []
        for i, tar in enumerate(image.layers):
            name = f"{hashlib.sha256(tar).hexdigest()[:12]}{i}/layer.tar"
            _add_bytes(tf, name, tar)
            names.append(name)
        cfg_name = hashlib.sha256(config).hexdigest() + ".json"
        _add_bytes(tf, cfg_name, config)
        _add_bytes(tf, "manifest.json", json.dumps([{"Config": cfg_name, "RepoTags": [repo_tag],
                                                      "Layers": names}]).encode())


def _add_bytes(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tf.addfile(info, io.BytesIO(data))


# ---------------------------------------------------------------- pushing to a registry

def push(registry: str, repo: str, tag: str, image: TestImage, auth: str = "") -> str:
    """Push over plain HTTP with the registry API (monolithic uploads); the manifest's digest.
    `auth` is an Authorization header's value, if the registry wants one."""
    manifest, blobs = image.blobs()
    for digest, data in blobs.items():
        if digest != sha256(manifest):
            push_blob(registry, repo, digest, data, auth)
    return put_manifest(registry, repo, tag, manifest, OCI_MANIFEST, auth)


def push_blob(registry: str, repo: str, digest: str, data: bytes, auth: str = "") -> None:
    hdrs = {"Authorization": auth} if auth else {}
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/blobs/uploads/", method="POST", data=b"",
                                 headers=hdrs)
    with urllib.request.urlopen(req) as resp:
        location = resp.headers["Location"]
    if location.startswith("/"):
        location = f"http://{registry}{location}"
    sep = "&" if "?" in location else "?"
    req = urllib.request.Request(f"{location}{sep}digest={digest}", method="PUT", data=data,
                                 headers={"Content-Type": "application/octet-stream", **hdrs})
    with urllib.request.urlopen(req):
        pass


def put_manifest(registry: str, repo: str, tag: str, manifest: bytes, media: str, auth: str = "") -> str:
    hdrs = {"Content-Type": media, **({"Authorization": auth} if auth else {})}
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{tag}", method="PUT", data=manifest,
                                 headers=hdrs)
    with urllib.request.urlopen(req):
        pass
    return sha256(manifest)


# ---------------------------------------------------------------- an image that runs

PROGRAMS = ("sh", "cat", "ls", "rm", "id", "touch", "mkdir", "true", "readlink", "stat")


def _libraries(program: str) -> list[str]:
    """The shared libraries `program` loads (and the loader), as ldd lists them."""
    import subprocess

    out = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        words = line.split()
        path = words[2] if "=>" in words and len(words) > 2 else words[0] if words else ""
        if path.startswith("/"):
            found.append(path)
    return found


def runnable_layer(extra: tuple[tuple[tarfile.TarInfo, bytes], ...] = ()) -> bytes:
    """A layer of this host's programs (PROGRAMS, under usr/bin, with their
    libraries at their real paths under usr/) and the links bin, lib, lib64
    into usr, as a merged-/usr distribution has; then `extra`."""
    import shutil

    files: dict[str, str] = {}
    for name in PROGRAMS:
        found = shutil.which(name, path="/usr/bin:/bin")
        assert found, f"{name} is not installed"
        files[f"usr/bin/{name}"] = os.path.realpath(found)
        for lib in _libraries(found):
            real = os.path.realpath(lib)
            files[real.lstrip("/")] = real
            files[("usr" + lib if not lib.startswith("/usr/") else lib).lstrip("/")] = real
    members = [member("usr/", DIRTYPE, mode=0o755), member("bin", SYMTYPE, linkname="usr/bin"),
               member("lib", SYMTYPE, linkname="usr/lib"), member("lib64", SYMTYPE, linkname="usr/lib64")]
    return layer(*members, *file_members(files, {"usr"}), *extra)


def file_members(files: dict[str, str], dirs: set[str] | None = None) -> list[tarfile.TarInfo]:
    """Layer members for `files` (path in the layer -> host file to copy, mode 0755), each
    preceded by its parent directories not in `dirs` yet (which it extends)."""
    dirs = set() if dirs is None else dirs
    members = []
    for arc in sorted(files):
        parts = arc.split("/")
        for k in range(1, len(parts)):
            d = "/".join(parts[:k])
            if d not in dirs:
                dirs.add(d)
                members.append(member(d + "/", DIRTYPE, mode=0o755))
        with open(files[arc], "rb") as f:
            members.append(member(arc, data=f.read(), mode=0o755))
    return members
