"""Transformers' progress bars and advisory warnings silenced while loading."""

from __future__ import annotations

import warnings


class _quiet_loading:
    """Silence transformers' progress bars and advisory warnings while loading."""

    def __enter__(self) -> None:
        from transformers.utils import logging as hf_logging

        self._verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        from transformers.utils import logging as hf_logging

        self._warnings.__exit__(*exc)
        hf_logging.set_verbosity(self._verbosity)
        hf_logging.enable_progress_bar()
