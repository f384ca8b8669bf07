"""The package's layers (docs/architecture.md), checked on every `make test`: import-linter's
contracts in pyproject.toml (the tuning layer above the decoding core, the head and model loading;
none of those three reaching it), no import circle anywhere in mars_cli (function-level imports
included), and no module of the tuning layer or the decoding core over 500 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
MOST_LINES = 500


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 kept, 0 broken" in done.stdout


def test_no_import_circle_in_the_package():
    graph = grimp.build_graph("mars_cli", include_external_packages=False)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back is not None:
                circles.append((module, *back))
    assert circles == []


def test_the_tuning_layer_and_the_decoding_core_are_in_small_modules():
    long = {str(path.relative_to(ROOT)): lines for folder in ("tuning", "decoding")
            for path in (ROOT / "mars_cli" / folder).glob("*.py")
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES}
    assert long == {}
