"""`mars eval`'s table: finished sample records folded into one row per method and suite.

Kept apart from running so the table can be rebuilt from samples.jsonl alone (a resumed or
interrupted run, another front end) without a session. Each row carries the 95% intervals of
its speed figures (figures.py defines them, bootstrap.py resamples the samples)."""

from __future__ import annotations

import statistics

from ..decoding.cost import CostCurve
from .figures import METRICS, forwards_per_token, sample_figures, within
from .methods import Method
from .metrics import rouge_l, token_agreement

INTERVAL_METRICS = ("tau", "speedup", "modelled")  # the speed figures a row gives intervals for


def scopes(suites: list[str]) -> list[str]:
    """The table's scopes: each suite, and "all" across several."""
    return [*suites, "all"] if len(suites) > 1 else list(suites)


def aggregate(records: list[dict], methods: list[Method], suites: list[str], curve: CostCurve | None = None,
              figures: list[dict] | None = None) -> dict:
    """Per suite and overall: one row per method, speed and quality side by side. `curve` prices
    the target forwards for the modelled speedup (none: no modelled speedup); `figures`: the
    records' sample_figures where the caller has them already."""
    table: dict[str, list[dict]] = {}
    figures = sample_figures(records) if figures is None else figures
    for scope in scopes(suites):
        chosen = [r for r in records if scope == "all" or r["suite"] == scope]
        chosen_figures = [f for f in figures if scope == "all" or f["suite"] == scope]
        vanilla = {(r["suite"], r["sample_id"]): r for r in chosen if r["method"] == "vanilla"}
        vanilla_figures = {(f["suite"], f["sample_id"]): f for f in chosen_figures if f["method"] == "vanilla"}
        rows = []
        for method in methods:
            mine = [r for r in chosen if r["method"] == method.name]
            if not mine:
                continue
            row = method_row(method.name, mine, vanilla)
            row.update(speed_figures([f for f in chosen_figures if f["method"] == method.name], vanilla_figures, curve))
            rows.append(row)
        base = next((row for row in rows if row["method"] == "vanilla"), None)
        for row in rows:
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base and base["tokens_per_s"] else None
            if base is None:
                row["intervals"].pop("speedup", None)
        table[scope] = rows
    return table


def speed_figures(mine: list[dict], vanilla: dict, curve: CostCurve | None) -> dict:
    """Forwards per token, mean width, the modelled speedup and the speed figures' intervals."""
    per_token, mean_width = forwards_per_token(mine)
    intervals = {}
    modelled = None
    for name in INTERVAL_METRICS:
        found = within(METRICS[name], mine, vanilla, curve)
        if found is not None:
            intervals[METRICS[name].key] = [found.low, found.high]
            if name == "modelled":
                modelled = found.estimate
    return {"forwards_per_token": per_token, "mean_width": mean_width, "modelled_speedup": modelled,
            "intervals": intervals}


def _histogram(counts) -> dict[str, int]:
    """Rounds by accepted drafts (a tree's accepted depth), summed over samples."""
    total: dict[int, int] = {}
    for count in counts:
        for n, rounds in count.items():
            total[int(n)] = total.get(int(n), 0) + rounds
    return {str(n): total[n] for n in sorted(total)}


def method_row(name: str, mine: list[dict], vanilla: dict) -> dict:
    """One method's figures over its records; agreement is paired per sample with vanilla's."""
    tokens = sum(r["new_tokens"] for r in mine)
    wall = sum(r["wall_s"] for r in mine)
    drafted = sum(r["drafted"] for r in mine)
    accepted = sum(r["accepted"] for r in mine)
    positions = max((len(r["drafted_at"]) for r in mine), default=0)
    drafted_at = [sum(r["drafted_at"][i] for r in mine if i < len(r["drafted_at"])) for i in range(positions)]
    accepted_at = [sum(r["accepted_at"][i] for r in mine if i < len(r["accepted_at"])) for i in range(positions)]
    paired = [(r, vanilla[(r["suite"], r["sample_id"])]) for r in mine if (r["suite"], r["sample_id"]) in vanilla]
    scores = [r["task_score"] for r in mine if r.get("task_score") is not None]
    return {
        "method": name,
        "samples": len(mine),
        "new_tokens": tokens,
        "tokens_per_s": tokens / wall if wall else 0.0,
        "tau": tokens / max(1, sum(r["rounds"] for r in mine)),
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "relaxed_share": sum(r["relaxed"] for r in mine) / accepted if accepted else 0.0,
        "per_position_acceptance": [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)],
        "accepted_length_histogram": _histogram(r.get("accepted_per_round", {}) for r in mine),
        "task_metric": statistics.mean(scores) if scores else None,
        "agreement_tokens": statistics.mean(token_agreement(r["token_ids"], v["token_ids"]) for r, v in paired) if paired else None,
        "agreement_rouge_l": statistics.mean(rouge_l(r["token_ids"], v["token_ids"]) for r, v in paired) if paired else None,
        "mean_logprob": sum(r["sum_logprob"] for r in mine) / tokens if tokens else 0.0,
        "peak_rss_mb": max(r["rss_mb"] for r in mine),
        **({"cuda_peak_mb": max(r["cuda_peak_mb"] for r in mine)} if "cuda_peak_mb" in mine[0] else {}),
        **_low_margin_share(mine),
    }


def _low_margin_share(mine: list[dict]) -> dict:
    """MARS's low-margin share of the positions its rule examined, where the engine counts them
    (the vLLM plugin does): how often the relaxation could apply at all."""
    if "examined" not in mine[0]:
        return {}
    examined = sum(r["examined"] for r in mine)
    return {"low_margin_share": sum(r["low_margin"] for r in mine) / examined if examined else 0.0}
