"""What one environment of the config becomes: the Spec a Session starts.

With no `image`, the root is the host's /usr (as `presets.minimal_system`
gives it; a Session makes it copy-on-write) with a world of its own around
it: a private /etc holding only the few files programs look up (passwd,
group, shadow, hosts, nsswitch.conf, os-release) and the account tools' own
configuration (ACCOUNT_FILES), fresh tmpfs at /tmp and /var/tmp (where
Inspect installs its sandbox tools), /root, /home, /run and the working
directory, a new /proc and a minimal /dev. Nothing else of the host is visible. With an
`image`, the root is that image's (`presets.image`: its layers under a fresh
writable layer). Commands run as root of the sandbox's user namespace with
docker's default capabilities (CAPABILITIES), which reach nothing outside it.
"""

from __future__ import annotations

import os
import posixpath

from ..errors import SpecError
from ..mounts import Bind, Dev, File, Mount, Proc, RemountRo, RoBind, Symlink, Tmpfs
from ..presets import TMP_SIZE, image, system_mounts
from ..spec import Limits, Spec
from .config import ConfigError, EnvironmentConfig

HOME = "/root"
# docker's PATH for root, so administration tools (adduser, useradd) are found as in a container
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# docker's default capabilities, held in the session's own user namespace only (over its own mounts and
# mapped ids, none on the host): what adduser, chown and su need, as in a container
CAPABILITIES = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID",
                "CAP_SETUID", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_SETFCAP")
PASSWD = (b"root:x:0:0:root:/root:/bin/bash\n"
          b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = b"root:x:0:\nusers:x:100:\nnogroup:x:65534:\n"
# the "x" password fields above point here: PAM's pam_unix (chfn, su, as adduser runs them) refuses an
# account whose shadow entry is missing
SHADOW = b"root:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n"
GSHADOW = b"root:*::\nusers:*::\nnogroup:*::\n"
HOSTS = b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
NSSWITCH = b"passwd: files\ngroup: files\nshadow: files\nhosts: files\n"
# the host's account tools' own configuration (no account data): adduser, useradd, chfn and su read it
ACCOUNT_FILES = ("/etc/adduser.conf", "/etc/deluser.conf", "/etc/login.defs", "/etc/pam.d", "/etc/security",
                 "/etc/skel", "/etc/shells", "/etc/default/useradd")
OS_RELEASE = ("/usr/lib/os-release", "/etc/os-release")


def build_spec(env: EnvironmentConfig, where: str = "the nsbox config") -> Spec:
    """The Spec of one environment; ConfigError naming the field when it cannot be built."""
    workdir = _absolute(env.workdir, f"{where}: workdir")
    binds = tuple(m for i, b in enumerate(env.binds) for m in _bind(b.src, b.dest, b.readonly, f"{where}: binds[{i}]"))
    limits = Limits(memory_mb=env.limits.memory_mb, nproc=env.limits.pids, cpu_cores=env.limits.cpu)
    network = "host" if env.network == "host" else "none"
    try:
        if env.image is not None:
            return _image_spec(env, workdir, binds, limits, network, where)
        environ = {"PATH": PATH, "HOME": HOME, "LANG": "C.UTF-8", **env.env}
        return Spec(mounts=(*host_world(workdir), *binds), uid=0, gid=0, cwd=workdir, env=environ,
                    limits=limits, network=network, hostname=env.hostname, cap_add=CAPABILITIES)
    except SpecError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def host_world(workdir: str) -> tuple[Mount, ...]:
    """The host's /usr and a private world around it (the module docstring)."""
    etc: list[Mount] = [Tmpfs("/etc"), File("/etc/passwd", PASSWD, perms=0o644),
                        File("/etc/group", GROUP, perms=0o644), File("/etc/shadow", SHADOW, perms=0o600),
                        File("/etc/gshadow", GSHADOW, perms=0o600), File("/etc/hosts", HOSTS, perms=0o644),
                        File("/etc/nsswitch.conf", NSSWITCH, perms=0o644)]
    etc += [RoBind(path) for path in ACCOUNT_FILES if os.path.exists(path)]  # copy-on-write in a Session
    if os.path.exists(OS_RELEASE[0]):
        etc.append(Symlink("../usr/lib/os-release", OS_RELEASE[1]))
    scratch = [Tmpfs("/tmp", size=TMP_SIZE, perms=0o1777), Tmpfs("/var/tmp", size=TMP_SIZE, perms=0o1777),
               Tmpfs(HOME, perms=0o700), Tmpfs("/home", perms=0o755), Tmpfs("/run", perms=0o755)]
    if workdir not in ("/", "/tmp", "/var/tmp", HOME):
        scratch.append(Tmpfs(workdir, size=TMP_SIZE))
    return (*system_mounts(), Proc(), Dev(), *etc, *scratch)


def _image_spec(env: EnvironmentConfig, workdir: str, binds: tuple[Mount, ...], limits: Limits, network: str,
                where: str) -> Spec:
    from ..images import ImageError, ImageStore  # lazy: the image store only for an image: 10 ms

    assert env.image is not None
    try:
        store = ImageStore()
        img = store.load(env.image) if os.path.exists(env.image) else store.get(env.image)
    except ImageError as exc:
        raise ConfigError(f"{where}: image: {exc} (pull it first: sandbox.images.ImageStore().pull(ref), "
                          f"or name an OCI layout or archive path)") from None
    spec = image(img, *binds, store=store, uid=0, gid=0, limits=limits, network=network, hostname=env.hostname)
    environ = {"HOME": HOME, **dict(spec.env), **env.env}
    cwd = workdir if "workdir" in env.model_fields_set else spec.cwd or "/"  # the image's WORKDIR, as docker
    return spec.replace(env=environ, cwd=cwd, cap_add=CAPABILITIES)


def _absolute(path: str, where: str) -> str:
    if not path.startswith("/") or "\0" in path:
        raise ConfigError(f"{where}: must be an absolute path inside the sandbox, not {path!r}")
    return posixpath.normpath(path)


def _bind(src: str, dest: str | None, readonly: bool, where: str) -> tuple[Mount, ...]:
    if not os.path.isabs(src):
        raise ConfigError(f"{where}.src: must be an absolute host path, not {src!r}")
    if not os.path.exists(src):
        raise ConfigError(f"{where}.src: {src} does not exist on this host")
    target = _absolute(dest, f"{where}.dest") if dest is not None else src
    if not readonly:
        return (Bind(src, target),)
    # Read-only for the session too: a Session makes a RoBind copy-on-write (the host's /usr, so a package
    # can be installed), but keeps a RemountRo over a writable host bind, so a config's bind stays read-only
    return (Bind(src, target), RemountRo(target))
