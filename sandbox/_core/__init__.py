"""The C core's binding and the helpers every executor and server shares.

Kept apart from any one executor (psutil's split of its C extension from its
platform logic): `fdpass` (fds and credentials over Unix sockets) and `peer`
(who is at the other end of one) import nothing of the compiled core, so a
command line that only talks to a server loads neither cffi nor the core.
`cliwire` is the C clients' wire to a warm server (csrc/client/cliwire.h,
read by cffi at run time): the CLI server's and sandbox-launch's handoff's.
"""
