"""Planning for a Template whose Plan mounts an Overlay (an image root,
sandbox.presets.image): which part its resident process prepares once and
which each sandbox makes afresh. Pure, like sandbox.warm_plan, which calls it.

A sandbox of such a Template cannot work in place on a copy of the template's
root, as the others do: its root must be an overlayfs of its own, with a
writable layer no other sandbox sees, and in-place ops cannot replace the root
they start in. So the template's root holds only what the sandboxes need to
build theirs: each layer (and each bind's source) bound read-only, once, at a
hidden path, a procfs (the kernel mounts a fresh proc in a user namespace only
where a fully visible one is) and /dev (each sandbox binds it read-only, with
a fresh shm and devpts, as in place). Each sandbox, in a mount namespace of its
own (a copy of the template's: the layers' mounts are then its own, which
overlayfs requires of every layer it clones), builds a new root as a cold
spawn does: a tmpfs on WARM_NEWROOT, the overlay of the hidden layers with a
fresh tmpfs upper, the plan's other ops, and a pivot_root whose lazy unmount
drops the template's root.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, replace

from . import spec as S
from .errors import SpecError
from .plan import Op, OpFlag, OpKind, Plan

# Where a Template's root holds what its overlay sandboxes build from: the
# layers (l<i>), the binds' sources (b<op index>) and their new roots' directory.
WARM_DIR = "/.sandbox-warm"
WARM_NEWROOT = f"{WARM_DIR}/root"
_RO = OpFlag.RDONLY | OpFlag.NOSUID | OpFlag.NODEV

# What the template keeps, beyond CAP_SYS_ADMIN, over its own user namespace
# when its sandboxes mount overlays. A standby builds its world before it
# joins a user namespace of its own, with its server's credentials, and
# overlayfs does its work in the upper layer with the credentials of whoever
# mounted it: it makes work/work with mode 0 and uses it at once (without
# CAP_DAC_OVERRIDE: EACCES, "upper fs does not support tmpfile"), and a
# copy-up gives the copy its lower file's owner and times (CAP_CHOWN,
# CAP_FOWNER). Each covers only the ids mapped in the template's namespace
# (the caller's own), and none reaches the command.
OVERLAY_MOUNTER_CAPS = sum(1 << S.CAPABILITIES.index(name) for name in ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER"))


@dataclass(frozen=True)
class OverlaySplit:
    """An overlay plan's ops split for a Template: `template` (what its
    resident process mounts; warm_plan.server_ops still applies) and `sandbox`
    (what each sandbox applies on a new root at WARM_NEWROOT)."""

    template: tuple[Op, ...]
    sandbox: tuple[Op, ...]


def mounts_overlay(ops: Sequence[Op]) -> bool:
    """Whether `ops` mount an Overlay."""
    return any(op.kind is OpKind.OVERLAY for op in ops)


def sandbox_newroot(plan: Plan) -> str:
    """The directory a Template's sandbox of `plan` (its sandbox plan) builds
    its root on: WARM_NEWROOT for an overlay plan, else "/" (in place)."""
    return WARM_NEWROOT if mounts_overlay(plan.ops) else "/"


def overlay_split(ops: Sequence[Op]) -> OverlaySplit:
    """Split the ops of a plan that mounts an Overlay (mounts_overlay).

    Every layer is bound read-only once into the template's root and each
    sandbox's overlay names those copies; every bind's source likewise (a
    sandbox's bind is cloned from the template's copy: the host is not in
    its view). A kept writable layer (Overlay(upper=DIR)) is a SpecError:
    overlayfs leaves two mounts sharing an upper undefined, and a Template's
    sandboxes run side by side; each gets a fresh tmpfs instead."""
    template: list[Op] = [Op(OpKind.DIR, WARM_NEWROOT, mode=0o755, parent_mode=0o755)]
    sandbox: list[Op] = []
    layer = 0
    for i, op in enumerate(ops):
        if op.kind is OpKind.OVERLAY:
            if op.src:
                raise SpecError(f"mounts[{op.origin}]", op.src,
                                "a Template gives each sandbox a fresh writable layer; an Overlay's kept upper "
                                "directory would be shared by its sandboxes at once: leave upper (writable=) unset")
            hidden = []
            for lower in op.lowers:
                hidden.append(f"{WARM_DIR}/l{layer}")
                template.append(Op(OpKind.BIND, hidden[-1], src=lower, flags=_RO, parent_mode=0o755,
                                   origin=op.origin))
                layer += 1
            sandbox.append(replace(op, lowers=tuple(hidden)))
        elif op.kind is OpKind.BIND and not op.flags & OpFlag.FROM_FD:
            hidden_src = f"{WARM_DIR}/b{i}"
            template.append(replace(op, dest=hidden_src, parent_mode=0o755))
            sandbox.append(replace(op, src=hidden_src))
        elif op.kind is OpKind.DEV:  # the template's, read-only, with a fresh shm and devpts (as in place)
            template.append(op)
            shm, pts = posixpath.join(op.dest, "shm"), posixpath.join(op.dest, "pts")
            sandbox += [Op(OpKind.BIND, op.dest, src=op.dest, flags=OpFlag.RDONLY | OpFlag.NOSUID,
                           parent_mode=op.parent_mode, origin=op.origin),
                        Op(OpKind.TMPFS, shm, mode=op.shm_mode, flags=OpFlag.NODEV, origin=op.origin),
                        Op(OpKind.DEVPTS, pts, origin=op.origin)]
        else:
            if op.kind is OpKind.PROC:
                template.append(op)
            sandbox.append(op)
    return OverlaySplit(tuple(template), tuple(sandbox))
