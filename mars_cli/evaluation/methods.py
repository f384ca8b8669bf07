"""`mars eval`'s method list: the names on --methods, --sweep and --sweep-tree turned into the
option changes each method decodes with. Kept apart from running so the CLI can refuse a bad list
before any model loads, and so the results document can name methods without the runner."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import UserError, require
from ..options import MAX_DRAFT_TOKENS, MAX_DRAFT_TOPK

MAX_SWEEP = 1000  # thresholds in one --sweep: each is a method run over every sample

BASE_METHODS = {
    "vanilla": {"draft": "none", "verify": "strict"},
    "strict": {"verify": "strict"},
    "mars": {"verify": "mars"},
}


@dataclass(frozen=True)
class Method:
    """A named column of the eval table: the option changes applied to the base options."""

    name: str
    changes: dict


def parse_sweep(text: str) -> list[float]:
    """`START:STOP:STEP` -> the MARS thresholds to sweep, each one a `mars@THETA` method."""
    try:
        start, stop, step = (float(part) for part in text.split(":"))
    except ValueError:
        raise UserError(f"--sweep {text!r}: expected START:STOP:STEP, e.g. 0.80:0.98:0.02") from None
    if not (0 < start <= stop <= 1) or not step > 0 or not math.isfinite(step):
        raise UserError(f"--sweep {text!r}: thresholds must satisfy 0 < START <= STOP <= 1 and STEP > 0")
    count = int(round((stop - start) / step)) + 1  # counted before any list is made: 1e-9 steps took 2.5 GB
    if count > MAX_SWEEP:
        raise UserError(f"--sweep {text!r} makes {count:,} thresholds; at most {MAX_SWEEP} (use a larger STEP)")
    return [round(start + i * step, 6) for i in range(count) if start + i * step <= stop + 1e-9]


def parse_tree_shape(text: str, where: str = "tree shape") -> dict:
    """`TOPKxTOKENS` (e.g. 4x16) or `1` (a chain) -> the drafting changes it stands for, each
    within the --draft-topk / --draft-tokens bounds, so that a bad shape is refused here, naming
    `where` it was written, before the model loads (not blamed on --draft-topk after it)."""
    match = re.fullmatch(r"(\d+)(?:x(\d+))?", text.strip())
    topk, tokens = (int(match[1]), None if match[2] is None else int(match[2])) if match else (None, None)
    if topk is None or (tokens is None and topk != 1):
        raise UserError(f"{where} {text!r}: expected TOPKxTOKENS (e.g. 4x16) or 1 for a chain")
    if not 1 <= topk <= MAX_DRAFT_TOPK or (tokens is not None and not 1 <= tokens <= MAX_DRAFT_TOKENS):
        raise UserError(f"{where} {text!r}: TOPK must be between 1 and {MAX_DRAFT_TOPK} and TOKENS between 1 "
                        f"and {MAX_DRAFT_TOKENS}")
    return {"draft_topk": topk} if tokens is None else {"draft_topk": topk, "draft_tokens": tokens}


def _shape_of(name: str) -> tuple[str, str | None]:
    """A method name without its `+SHAPE` suffix, and the shape (None when it has none). Whatever
    follows the last `+` is the shape, unless it holds a `/` or `.` (a drafter's path or repo id
    with a `+` in it): a typo such as `+abc` is then a bad shape, not an unknown drafter."""
    spec, plus, shape = name.rpartition("+")
    if plus and not re.search(r"[/.]", shape):
        return spec, shape
    return name, None


def parse_tree_sweep(text: str) -> list[str]:
    """`1,4x8,4x16` -> the shapes, each checked now so a typo fails before the model loads."""
    shapes = [part.strip() for part in text.split(",") if part.strip()]
    require(bool(shapes), f"--sweep-tree {text!r}: expected shapes like 1,4x8,4x16")
    for shape in shapes:
        parse_tree_shape(shape, "--sweep-tree shape")
    return shapes


def parse_methods(text: str, sweep: list[float], tree_sweep: list[str] | None = None) -> list[Method]:
    """`rule` or `rule:drafter` (e.g. strict:ngram, mars:head) so drafters compare in one run;
    `+SHAPE` fixes a method's draft tree (strict:head+4x16, strict+1 for a chain). `tree_sweep`
    adds every non-vanilla method at each shape."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if tree_sweep:
        names += [f"{name}+{shape}" for name in list(names) if name != "vanilla" and _shape_of(name)[1] is None
                  for shape in tree_sweep]
    unknown = [name for name in names if _shape_of(name)[0].partition(":")[0] not in BASE_METHODS]
    if unknown:
        raise UserError(f"unknown method {unknown[0]!r}: choose from {', '.join(BASE_METHODS)}, "
                        f"optionally with :DRAFTER (e.g. strict:head)")
    if "vanilla" not in names:
        names.insert(0, "vanilla")  # every speedup and agreement figure is measured against it
    methods = []
    for name in dict.fromkeys(names):
        spec, shape = _shape_of(name)
        rule, _, drafter = spec.partition(":")
        require(not (rule == "vanilla" and (drafter or shape)), f"method {name!r}: vanilla decodes without a drafter")
        tree = parse_tree_shape(shape, f"method {name!r}: tree shape") if shape is not None else {}
        methods.append(Method(name, {**BASE_METHODS[rule], **({"draft": drafter} if drafter else {}), **tree}))
    methods += [Method(f"mars@{theta:g}", {"verify": "mars", "threshold": theta}) for theta in sweep]
    return methods
