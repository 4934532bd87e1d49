"""One JSON record per start, with every key-like value of the caller scrubbed.

The record names variables, never their values. Beyond that, each value of
a key-like variable of the caller (`*_API_KEY`, `*_KEY`, `*_TOKEN`,
`*_SECRET`, at least 16 characters) is replaced by `<NAME>` wherever it
appears in what is kept (a command line that carries a key, for instance):
the rule of sandbox.redact, which explain() and --dry-run apply too.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Mapping
from typing import Any

from ..redact import KEY_PATTERNS, MIN_SECRET, scrub, secrets_of

__all__ = ["KEY_PATTERNS", "MIN_SECRET", "RECORD_KEYS", "scrub", "secrets_of", "write_record"]

RECORD_KEYS = ("role", "time", "backend", "confined", "reason", "command", "chdir", "binds", "hidden", "emptied",
               "env_names", "network", "ports", "proxy", "limits", "enforce", "check", "exit_status")
_counter = itertools.count()


def write_record(directory: str, record: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """Write `record` (scrubbed) as a new JSON file in `directory`; return its path."""
    missing = [k for k in RECORD_KEYS if k not in record]
    if missing:
        raise ValueError(f"record lacks {', '.join(missing)}")
    data = scrub({k: record[k] for k in RECORD_KEYS}, secrets_of(environ))
    os.makedirs(directory, exist_ok=True)
    name = f"{time.strftime('%Y%m%dT%H%M%S')}-{data['role']}-{os.getpid()}-{next(_counter)}.json"
    path = os.path.join(directory, name)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path
