"""sandbox.inspect: `nsbox`, a sandbox environment for Inspect (inspect-ai) over sandbox.Session.

    pip install 'sandbox[inspect]'
    inspect eval task.py --sandbox nsbox

Inspect finds the provider through the `inspect_ai` entry point of this
package (pyproject.toml), which imports this module. The files:
provider.py (the SandboxEnvironment), config.py (its configuration),
world.py (a configuration's Spec), execute.py (exec), remote.py
(exec_remote), files.py (read_file/write_file), users.py (`user=`),
lifecycle.py (the Sessions alive, by task). docs/inspect.md has the rest.
"""

from __future__ import annotations

from .config import BindConfig, ConfigError, EnvironmentConfig, LimitsConfig, NsboxConfig
from .provider import NsboxSandboxEnvironment

__all__ = ["BindConfig", "ConfigError", "EnvironmentConfig", "LimitsConfig", "NsboxConfig",
           "NsboxSandboxEnvironment"]
