"""The nsbox provider's configuration: a pydantic model, or a YAML/JSON file of the same shape.

    # nsbox.yaml: the whole file is optional; every field has a default
    image: debian:12            # an image of sandbox.images by reference, or an OCI layout/archive path;
                                # absent: the host's /usr, read-only, with a private /etc, /tmp, /var/tmp
    workdir: /workspace         # where relative paths and commands start (a fresh directory)
    env: {LANG: C.UTF-8}
    binds: [{src: /data/corpus, dest: /corpus}]     # read-only unless readonly: false
    limits: {memory_mb: 2048, pids: 256, cpu: 1.5}
    network: loopback           # or host
    environments:               # more than one environment per sample: the first is the default
      default: {}
      victim: {image: nginx:1.27}

Inspect hands the provider either this model (a task built in Python) or a
file path (`sandbox=("nsbox", "nsbox.yaml")`); `load_config` reads both. A
bad value is a ConfigError naming the field and the file.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_WORKDIR = "/workspace"


class ConfigError(ValueError):
    """A configuration of the nsbox provider that cannot be used: names the field and what to change."""


class BindConfig(BaseModel):
    """A host path made visible inside: `src` on the host, at `dest` (default: the same path)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    src: str = Field(min_length=1)
    dest: str | None = None
    readonly: bool = True


class LimitsConfig(BaseModel):
    """Limits of the whole environment: memory (MiB), processes, CPUs (1.5: one and a half)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    memory_mb: int | None = Field(default=None, gt=0)
    pids: int | None = Field(default=None, gt=0)
    cpu: float | None = Field(default=None, ge=0.001, le=65536)


class EnvironmentConfig(BaseModel):
    """One sandbox environment of a sample: its root, files, limits, network and environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    image: str | None = None
    workdir: str = DEFAULT_WORKDIR
    env: dict[str, str] = Field(default_factory=dict)
    binds: tuple[BindConfig, ...] = ()
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    network: Literal["loopback", "host"] = "loopback"
    hostname: str | None = None


class NsboxConfig(EnvironmentConfig):
    """The provider's configuration: one environment (the fields of EnvironmentConfig), or
    several by name in `environments` (the first is the sample's default)."""

    environments: dict[str, EnvironmentConfig] | None = None

    def named(self) -> dict[str, EnvironmentConfig]:
        """The environments of a sample by name, the default first."""
        if not self.environments:
            return {"default": self}
        return dict(self.environments)


def parse_config(data: Any, where: str = "the nsbox config") -> NsboxConfig:
    """A config from a dict (a file's contents); ConfigError naming the field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping of fields (image, workdir, env, binds, limits, "
                          f"network, hostname, environments), not {type(data).__name__}")
    try:
        config = NsboxConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {_describe(exc)}") from None
    if config.environments is not None and not config.environments:
        raise ConfigError(f"{where}: environments: must name at least one environment (or be left out)")
    return config


def load_config(config: object) -> NsboxConfig:
    """The config Inspect passed: None (the defaults), a model, or the path of a YAML or JSON file."""
    if config is None:
        return NsboxConfig()
    if isinstance(config, NsboxConfig):
        return config
    if isinstance(config, BaseModel):
        return parse_config(config.model_dump(), f"the nsbox config ({type(config).__name__})")
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ConfigError(f"the nsbox config file {path}: cannot be read ({exc.strerror or exc})") from None
        return parse_config(_parse_text(text, path), f"the nsbox config file {path}")
    raise ConfigError(f"the nsbox config: must be an NsboxConfig or the path of a YAML or JSON file, "
                      f"not {type(config).__name__}")


def _parse_text(text: str, path: str) -> Any:
    try:
        if path.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"the nsbox config file {path}: not valid {'JSON' if path.endswith('.json') else 'YAML'}"
                          f" ({exc})") from None


def _describe(exc: ValidationError) -> str:
    """pydantic's errors as `field.path: message`, one after another."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        parts.append(f"{field}: {err['msg']} (got {err.get('input')!r})")
    return "; ".join(parts)
