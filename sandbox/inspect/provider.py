"""`nsbox`: Inspect's SandboxEnvironment over sandbox.Session, one Session per sample and environment.

    inspect eval task.py --sandbox nsbox                  # the host's /usr, a private world around it
    inspect eval task.py --sandbox nsbox:nsbox.yaml       # config.py says what the file holds

sample_init starts one Session per environment of the config (the default
first) and sample_cleanup closes them, whatever happened to the sample;
task_cleanup closes what a failed sample left open (lifecycle.py). Every
call runs inside that sample's sandbox: exec (execute.py), exec_remote
(remote.py), read_file/write_file (files.py), `user=` (users.py).
"""

from __future__ import annotations

import os
import posixpath
import shlex
import sys
import threading
from typing import Any, Literal, overload

import anyio
from inspect_ai.util import (
    ExecRemoteAwaitableOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxUnavailableError,
    sandboxenv,
)
from inspect_ai.util._sandbox.exec_remote import ExecRemoteCommonOptions
from pydantic import BaseModel

from ..errors import SessionError, SessionUserError, SetupError
from ..session import Session
from ..spec import Spec
from . import execute, files, lifecycle
from .config import NsboxConfig, load_config, parse_config
from .remote import SessionRemoteProcess
from .users import unknown_user_result, user_option
from .world import build_spec

PROVIDER = "nsbox"


@sandboxenv(name=PROVIDER)
class NsboxSandboxEnvironment(SandboxEnvironment):
    """One environment of a sample: a sandbox.Session (the module docstring)."""

    def __init__(self, session: Session, spec: Spec, name: str) -> None:
        super().__init__()
        self.session = session
        self._published: str | None = None  # the session's ID for `sandbox exec`, once connection() asked
        self._publish_lock = threading.Lock()
        self.spec = spec
        self.name = name
        self._env = dict(spec.env)
        self._workdir = spec.cwd or "/"

    # ------------------------------------------------------------ lifecycle

    @classmethod
    def config_files(cls) -> list[str]:
        """The files Inspect looks for beside a task when no config is given."""
        return ["nsbox.yaml", "nsbox.yml", "nsbox.json"]

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        """The config model from its dict (an eval log's, or a task's `sandbox=` spec)."""
        return parse_config(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        """Check the config before any sample starts: a bad field fails the task at once."""
        specs(config)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        """One Session per environment of the config, the default first; none left open on failure."""
        started: dict[str, SandboxEnvironment] = {}
        try:
            for name, spec in specs(config).items():
                session = await anyio.to_thread.run_sync(Session, spec)
                lifecycle.opened(task_name, session)
                started[name] = cls(session, spec, name)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _close(task_name, started)
            raise
        return started

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        """Close the sample's Sessions (each of them, whatever the others do)."""
        with anyio.CancelScope(shield=True):
            errors = await _close(task_name, environments)
        if errors:
            raise errors[0]

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                           cleanup: bool) -> None:
        """Close what the task's samples left open (a sample_cleanup that never ran)."""
        if cleanup:
            await anyio.to_thread.run_sync(lifecycle.close_task, task_name)

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup nsbox`: nothing outlives an eval's process (a Session ends with
        its caller), so this closes only what this process still holds."""
        await anyio.to_thread.run_sync(lifecycle.close_task, None)

    # ------------------------------------------------------------ commands

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        """Run `cmd` in this sample's sandbox (SandboxEnvironment.exec's contract)."""
        return await self._run(cmd, input, cwd, env, user, timeout)

    async def _run(self, cmd: list[str], input: str | bytes | None, cwd: str | None, env: dict[str, str] | None,
                   user: str | None, timeout: float | None) -> ExecResult[str]:
        options = user_option(user)
        data = input.encode("utf-8") if isinstance(input, str) else input
        try:
            return await execute.run(self.session, cmd, input=data, cwd=self._cwd(cwd), env=self._environ(env),
                                     timeout=timeout, user=options)
        except SetupError as exc:
            if exc.step != "cwd":
                raise
            return ExecResult(success=False, returncode=1, stdout="", stderr=f"nsbox: {exc}\n")
        except SessionUserError as exc:
            return unknown_user_result(user, exc)
        except SessionError as exc:
            raise SandboxUnavailableError(f"the nsbox sandbox {self.name!r} cannot run commands: {exc}") from exc

    @overload
    async def exec_remote(self, cmd: list[str], options: ExecRemoteStreamingOptions | None = None, *,
                          stream: Literal[True] = True) -> ExecRemoteProcess: ...

    @overload
    async def exec_remote(self, cmd: list[str], options: ExecRemoteAwaitableOptions | None = None, *,
                          stream: Literal[False]) -> ExecResult[str]: ...

    async def exec_remote(self, cmd: list[str],
                          options: ExecRemoteStreamingOptions | ExecRemoteAwaitableOptions | None = None, *,
                          stream: bool = True) -> ExecRemoteProcess | ExecResult[str]:
        """Start `cmd` and stream its output (remote.py); with stream=False, wait for its result."""
        opts: ExecRemoteCommonOptions = options or ExecRemoteStreamingOptions()
        if not stream:
            timeout = opts.timeout if isinstance(opts, ExecRemoteAwaitableOptions) else None
            return await self._run(cmd, opts.input, opts.cwd, opts.env, opts.user, timeout)
        options_ = user_option(opts.user)
        keep_stdin = isinstance(opts, ExecRemoteStreamingOptions) and opts.stdin_open
        try:
            proc = await execute.start(self.session, cmd, stdin=keep_stdin or bool(opts.input),
                                       cwd=self._cwd(opts.cwd), env=self._environ(opts.env), user=options_)
        except SessionUserError:
            raise  # a ValueError naming the user: the caller's mistake, not a sandbox gone
        except SessionError as exc:
            raise SandboxUnavailableError(f"the nsbox sandbox {self.name!r} cannot run commands: {exc}") from exc
        remote = SessionRemoteProcess(proc, cmd, opts)
        await remote.start(opts.input)
        return remote

    def _cwd(self, cwd: str | None) -> str | None:
        """A relative cwd is relative to the working directory, as Inspect's contract says."""
        return None if cwd is None else posixpath.join(self._workdir, cwd)

    def _environ(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """Inspect's `env` adds to the environment (Session's replaces it)."""
        return None if not env else {**self._env, **env}

    # ------------------------------------------------------------ files

    async def write_file(self, file: str, contents: str | bytes) -> None:
        """Write `file` (relative: to the working directory), its missing directories made."""
        await anyio.to_thread.run_sync(files.write_file, self.session, file, contents)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        """The contents of `file` (text: UTF-8, newlines kept)."""
        return await anyio.to_thread.run_sync(files.read_file, self.session, file, text)

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        """`sandbox exec ID -- bash -l` into this sample's sandbox, from a terminal of the same
        user while the sample runs: the Session is published (Session.publish) on first ask."""
        try:
            with self._publish_lock:
                if self._published is None:
                    self._published = self.session.publish()
        except SessionError as exc:
            raise SandboxUnavailableError(f"the nsbox sandbox {self.name!r} cannot be reached: {exc}") from exc
        client = os.path.join(os.path.dirname(sys.executable), "sandbox")
        who = ["--user", user] if user is not None else []
        command = shlex.join([client if os.path.exists(client) else "sandbox", "exec", *who, self._published,
                              "--", "bash", "-l"])
        return SandboxConnection(type="nsbox", command=command, container=self._published)

def specs(config: SandboxEnvironmentConfigType | None) -> dict[str, Spec]:
    """The Spec of each environment of the config, by name (the default first): built once per
    config (a file: per its path, size and mtime), since an image's is loaded from the store."""
    key = _config_key(config)
    with _specs_lock:
        found = _specs.get(key)
    if found is not None:
        return found
    parsed: NsboxConfig = load_config(config)
    where = f"the nsbox config file {config}" if isinstance(config, str) else "the nsbox config"
    built = {name: build_spec(env, f"{where}: environments.{name}" if parsed.environments else where)
             for name, env in parsed.named().items()}
    with _specs_lock:
        if len(_specs) >= MAX_CACHED_CONFIGS:
            _specs.pop(next(iter(_specs)))
        _specs[key] = built
    return built


MAX_CACHED_CONFIGS = 16
_specs: dict[str, dict[str, Spec]] = {}
_specs_lock = threading.Lock()


def _config_key(config: SandboxEnvironmentConfigType | None) -> str:
    if isinstance(config, BaseModel):
        return f"{type(config).__qualname__}:{config.model_dump_json()}"
    if isinstance(config, str):
        try:
            st = os.stat(config)
        except OSError:
            return f"file:{config}"  # load_config raises the error naming it
        return f"file:{os.path.abspath(config)}:{st.st_size}:{st.st_mtime_ns}"
    return repr(config)


async def _close(task_name: str, environments: dict[str, SandboxEnvironment]) -> list[BaseException]:
    sessions = [env.session for env in environments.values() if isinstance(env, NsboxSandboxEnvironment)]
    return await anyio.to_thread.run_sync(lifecycle.close, task_name, sessions)
