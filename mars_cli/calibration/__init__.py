"""`mars calibrate` and the calibration profiles decoding reads its thresholds from.

    objectives.py   --objective parsing; rate= / loss= estimators (a threshold from margins)
    collection.py   the top-two logits of emitted positions (TopTwoRecorder), per prompt; resume file
    decision.py     quality='s statistics: paired drops and intervals, the decision rule, the walk
                    that chooses a theta, the power estimate (pure functions over records)
    sweep.py        quality=: strict and MARS at each theta over suites with task metrics, --limit auto
    fitting.py      per-mode profile blocks (thresholds, intervals, held-out check, sweep) and the profile
    profiles.py     the YAML schema: validate, load, save, lookup; the threshold a session uses
    plot.py         the stored sweep drawn (--plot, --replot)
    run.py          one calibrate run: request, prompts or suites, target, modes, written profile

What the CLI needs is exported here, so it imports this package only; decoding sessions take
their threshold from profiles.resolve_threshold. The names are imported on first use (PEP 562):
a session that reads only profiles.py imports none of the calibrating code.
"""

from __future__ import annotations

from ..lazy import exports

_HOME_OF = {
    "DEFAULT_OBJECTIVE": "objectives",
    "plot_sweeps": "plot",
    "replot": "plot",
    "Calibration": "run",
    "CalibrationRequest": "run",
    "default_destination": "run",
    "DEFAULT_LIMIT": "sweep",
    "DEFAULT_SUITES": "sweep",
    "parse_limit": "sweep",
}

__all__ = sorted(_HOME_OF)
__getattr__ = exports(__name__, _HOME_OF, globals())
