"""A progress bar for a run of many steps: tqdm when installed, else one line redrawn on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    """`total` steps in all; `section(name)` names what runs now, `step(n)` counts done ones."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = max(1, total)
        self.done = 0
        self.name = ""
        self.started = time.monotonic()
        self.enabled = enabled
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=self.total, unit="step", dynamic_ncols=True, file=sys.stderr)

    def section(self, name: str) -> None:
        self.name = name
        if self._bar is not None:
            self._bar.set_description(name)
        self._draw()

    def step(self, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        if self._bar is not None:
            self._bar.update(n)
        else:
            self._draw()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            sys.stderr.write("\n")

    def _draw(self) -> None:
        if not self.enabled or self._bar is not None:
            return
        frac = self.done / self.total
        filled = int(30 * frac)
        elapsed = time.monotonic() - self.started
        eta = f", ~{elapsed / frac - elapsed:.0f} s left" if frac > 0.02 else ""
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {100 * frac:3.0f}% {self.name[:40]:<40} "
                         f"{elapsed:.0f} s{eta}   ")
        sys.stderr.flush()
