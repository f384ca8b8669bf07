"""Where a command's start-up went before its first token: import, load, tuning, prefill and
decoding, for `--stats` and `--json` (a warm one-liner should spend next to nothing on tuning)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that cannot be read."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return None


class Startup:
    """Laps of one command: made when the command begins, `built(tuning_s)` when its session is
    built, then `phases(...)` once it has decoded. `import_s`: the seconds before the command began
    (this process's age; the client's, for a request the warm server decodes); `tuning_s`: the
    tuning layer's tally when the command began (a warm server's tally runs across requests)."""

    def __init__(self, import_s: float | None = None, tuning_s: float = 0.0, *, measure_import: bool = True) -> None:
        self.import_s = process_age_s() if measure_import and import_s is None else import_s
        self.began = time.perf_counter()
        self.build_s = 0.0
        self.tuning_at_start = tuning_s
        self.tuning_at_build = tuning_s

    def built(self, tuning_s: float) -> None:
        """The session is built; `tuning_s`: the tuning layer's tally now."""
        self.build_s = time.perf_counter() - self.began
        self.tuning_at_build = tuning_s

    def phases(self, tuning_s: float, prefill_s: float, wall_s: float) -> dict[str, float | None]:
        """Seconds per phase: the session's build less its tuning is `load`; tuning during
        decoding (a cost curve read on the first round) counts as tuning, not decoding."""
        late_tuning = tuning_s - self.tuning_at_build
        build_tuning = self.tuning_at_build - self.tuning_at_start
        return {"import": self.import_s, "load": max(self.build_s - build_tuning, 0.0),
                "tuning": tuning_s - self.tuning_at_start,
                "prefill": prefill_s, "decoding": max(wall_s - prefill_s - late_tuning, 0.0)}
