"""Names a package re-exports from its modules, each imported on first use (PEP 562), so that
importing one light module of the package (models/embedded.py, calibration/profiles.py) does not
import its heavy neighbours."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def exports(package: str, home_of: Mapping[str, str], package_globals: dict) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: a name in `home_of` from the module it names (then kept
    in the package's globals), a submodule's name as the submodule."""
    submodules = set(home_of.values())

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        module = home_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        package_globals[name] = value
        return value

    return __getattr__
