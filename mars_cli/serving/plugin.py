"""The vLLM plugin (entry point `vllm.general_plugins`: mars = mars_cli.serving.plugin:register).

vLLM loads it in every process it starts. It does three things, each only when the config asks
for MARS (an "mars" key in additional_config, see settings.py); without it vLLM runs untouched:
- checks and resolves that key when vLLM builds its config (one clear error naming the fix);
- gives each of vLLM's rejection samplers the resolved thresholds;
- replaces `rejection_sample` during such a sampler's forward by ours (rejection.py), which
  applies the same batched rules as `mars generate`. Strict verification stays vLLM's own code.
Counters (MARS's relaxed acceptances and low-margin positions) add up on the device and are
read by `counters()` in the process that holds the sampler, and logged every LOG_EVERY_S.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UserError
from . import settings
from .rejection import Thresholds, mars_rejection_sample

LOG_EVERY_S = 10.0
_log = logging.getLogger("vllm.mars")  # under vLLM's logger, so its handlers print it
_samplers: "weakref.WeakSet[Any]" = weakref.WeakSet()  # this process's rejection samplers


@dataclass
class Counters:
    """Totals since the engine started (or the last `reset`), kept as device tensors."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)
    logged_at: float = float("-inf")  # the first batch MARS decides is logged, then every LOG_EVERY_S

    def add(self, **counts: torch.Tensor) -> None:
        for name, value in counts.items():
            total = value.sum()
            self.values[name] = self.values[name] + total if name in self.values else total

    def read(self) -> dict[str, int]:
        return {name: int(value) for name, value in self.values.items()}


_counters = Counters()


def register() -> None:
    """vLLM's plugin hook: runs once per process, before any engine is built."""
    from vllm.config import VllmConfig
    from vllm.v1.sample import rejection_sampler

    if getattr(rejection_sampler, "_mars_patched", False):
        return
    rejection_sampler._mars_patched = True
    VllmConfig.__post_init__ = _checking_mars(VllmConfig.__post_init__)
    sampler = rejection_sampler.RejectionSampler
    sampler.__init__ = _taking_thresholds(sampler.__init__)
    sampler.forward = _verifying_with_mars(sampler.forward, rejection_sampler)


def _checking_mars(post_init):
    @functools.wraps(post_init)
    def wrapper(self, *args, **kwargs):
        post_init(self, *args, **kwargs)
        extra = self.additional_config
        if isinstance(extra, dict) and settings.KEY in extra:
            given = extra[settings.KEY]
            model = self.model_config.model if self.model_config is not None else ""
            try:
                extra[settings.KEY] = settings.resolve(given, model, self.speculative_config is not None)
            except UserError as exc:  # vLLM reports a ValueError from its config as a config error
                raise ValueError(f"mars: {exc}") from None
            if extra[settings.KEY] is not given and not (isinstance(given, dict) and given.get(settings.RESOLVED)):
                _log.info(settings.describe(extra[settings.KEY]))  # once: later copies arrive resolved
    return wrapper


def _taking_thresholds(init):
    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        init(self, *args, **kwargs)
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        extra = getattr(config, "additional_config", None)
        resolved = extra.get(settings.KEY) if isinstance(extra, dict) else None
        self.mars = settings.thresholds(resolved) if resolved else None
        _samplers.add(self)
    return wrapper


def _verifying_with_mars(forward, module):
    vllm_rejection_sample = module.rejection_sample

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        thresholds: Thresholds | None = getattr(self, "mars", None)
        if thresholds is None:
            return forward(self, *args, **kwargs)
        module.rejection_sample = functools.partial(_rejection_sample, thresholds)
        try:
            return forward(self, *args, **kwargs)
        finally:
            module.rejection_sample = vllm_rejection_sample
    return wrapper


def _rejection_sample(thresholds: Thresholds, draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                      draft_probs, target_logits, bonus_token_ids, sampling_metadata, **_vllm_options):
    """vLLM's `rejection_sample` signature, decided by MARS."""
    from vllm.v1.sample.rejection_sampler import generate_uniform_probs

    batch_size = len(num_draft_tokens)
    device = target_logits.device
    if sampling_metadata.all_greedy:
        greedy, temperature, uniforms = torch.ones(batch_size, dtype=torch.bool, device=device), None, None
    else:
        temperature = sampling_metadata.temperature
        greedy = temperature == 0
        uniforms = generate_uniform_probs(draft_token_ids.shape[0], num_draft_tokens, sampling_metadata.generators,
                                          device)
    outcome = mars_rejection_sample(draft_token_ids, num_draft_tokens, target_logits, bonus_token_ids, draft_probs,
                                    greedy, thresholds, temperature, uniforms, sampling_metadata.generators)
    _counters.add(accepted=outcome.accepted, relaxed=outcome.relaxed, examined=outcome.examined,
                  low_margin=outcome.low_margin,
                  drafted=torch.tensor(num_draft_tokens, device=device),
                  rounds=torch.tensor(batch_size, device=device))
    if time.monotonic() - _counters.logged_at > LOG_EVERY_S and (totals := _counters.read())["drafted"]:
        _counters.logged_at = time.monotonic()  # the first batch with drafts (not vLLM's warm-up), then every 10 s
        _log.info("MARS: %d of %d drafts accepted, %d of them relaxed; %d of %d examined positions low-margin",
                  totals["accepted"], totals["drafted"], totals["relaxed"], totals["low_margin"], totals["examined"])
    return outcome.output_token_ids


# --------------------------------------------------------------------------- in-process control
def counters() -> dict[str, int]:
    """MARS's totals in this process (a worker's: other processes ask through MarsWorkerExtension)."""
    return _counters.read()


def reset_counters() -> None:
    _counters.values.clear()


def set_thresholds(thresholds: Thresholds | None) -> int:
    """Switch the verification rule of this process's samplers: MARS at `thresholds`, or vLLM's
    strict rule (None). Lets one engine run strict and several thetas in turn.
    Returns how many samplers were switched."""
    for sampler in _samplers:
        sampler.mars = thresholds
    return len(_samplers)


class MarsWorkerExtension:
    """Methods vLLM adds to its workers (`worker_extension_cls`), so a process that drives an
    engine in other processes reaches the plugin there: `llm.collective_rpc("mars_counters")`."""

    def mars_counters(self) -> dict[str, int]:
        return counters()

    def mars_reset_counters(self) -> None:
        reset_counters()

    def mars_set_thresholds(self, resolved: dict | None) -> int:
        return set_thresholds(None if resolved is None else settings.thresholds(resolved))
