"""Text from models, files and arguments shown on a terminal as text, never as commands.

A model can emit, and a prompt or a file name can hold, escape sequences (ESC, OSC 52 clipboard
writes, the C1 CSI byte 0x9b) that a terminal would obey, and rich would read `[...]` in a user
string as markup. Everything mars prints of such text goes through `shown` (and rich cells through
`Text`, which reads no markup); `--json` escapes by itself.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, and the C1 range
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` with every control character but tab and newline as a visible escape (`\\x1b`)."""
    return _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", text)
