"""One `mars generate` request on a built session, as the events the command renders.

The command decodes in its own process or asks the warm server (warm/server.py) to; both run
this, so both print the same text, notes, JSON and table. Events, in order:
`{"delta": TEXT}` (new text, streaming mode only), `{"ended": True}` (the text is complete),
then the drift check's notes (on stderr), then `{"done": PAYLOAD}`, the `--json` object.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from .decoding.stats import DecodeStats
from .session import Session
from .startup import Startup
from .tuning.clock import TALLY


def events(session: Session, text: str, startup: Startup, stream_text: bool,
           between: Callable[[], None] | None = None) -> Iterator[dict]:
    """Decode `text` with `session`; `startup` has lapped `built` already. `between` runs after
    each decoded chunk, also where nothing is sent (`--json`): the warm server checks there that
    its client is still there, and raises to stop decoding for one that is gone."""
    prompt_ids = session.encode(text)
    stats = DecodeStats()
    tokens: list[int] = []
    printed = ""
    for chunk in session.stream(prompt_ids, stats):
        if between is not None:
            between()
        tokens.extend(chunk)
        if stream_text:
            full = session.decode_text(tokens)
            if not full.endswith("\ufffd") and full.startswith(printed):  # hold back a partial character
                yield {"delta": full[len(printed):]}
                printed = full
    phases = startup.phases(TALLY.seconds, stats.phase_s["prefill"], stats.wall_s)
    payload = {
        "text": session.decode_text(tokens),
        "new_tokens": len(tokens),
        "token_ids": tokens,
        "config": session.config(),
        "stats": {**stats.summary(), "startup_s": phases},
        "tuning": session.tuning_report(),
    }
    yield {"ended": True}
    session.check_drift(stats)
    yield {"done": payload}


def build(options: object, startup: Startup) -> Session:
    """The session for `options`, timed as the start-up's load (and tuning) phase; `--engine auto`
    resolved first (engine_choice.py: a first use here builds and times both engines' sessions)."""
    from . import engine_choice

    concrete, built, choice = engine_choice.resolve(options, Session)  # type: ignore[arg-type]
    session = built or Session(concrete)
    session.engine_choice = choice
    startup.built(TALLY.seconds)
    return session
