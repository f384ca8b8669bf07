"""Quality metrics that compare an output with a reference output (pure functions)."""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence


def token_agreement(output: Sequence[int], reference: Sequence[int]) -> float:
    """Share of reference positions where the output has the same token (1.0 = identical)."""
    if not reference:
        return 1.0 if not output else 0.0
    same = sum(a == b for a, b in zip(output, reference))
    return same / max(len(reference), len(output))


def common_prefix(output: Sequence[int], reference: Sequence[int]) -> int:
    """How many leading tokens agree: where a lossy method first departs from the reference."""
    length = 0
    for a, b in zip(output, reference):
        if a != b:
            break
        length += 1
    return length


def lcs_length(a: Sequence[object], b: Sequence[object]) -> int:
    """Longest common subsequence, O(len(a) * len(b)) time and O(len(b)) memory."""
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for item in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if item == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(output: Sequence[object], reference: Sequence[object]) -> float:
    """ROUGE-L F1 over any token sequence (token ids or words)."""
    if not output or not reference:
        return 1.0 if not output and not reference else 0.0
    lcs = lcs_length(output, reference)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(output), lcs / len(reference)
    return 2 * precision * recall / (precision + recall)


# --------------------------------------------------------------------------- task metrics
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def final_number(text: str) -> float | None:
    """The last number in a text (commas as thousands separators), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def exact_number(text: str, answer: float) -> float:
    value = final_number(text)
    return float(value is not None and abs(value - float(answer)) < 1e-6)


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def chrf(hypothesis: str, reference: str, max_n: int = 6, beta: float = 2.0) -> float:
    """chrF: character n-gram F-beta (n = 1..6, spaces removed), averaged over n, in [0, 1]."""
    hyp, ref = hypothesis.replace(" ", ""), reference.replace(" ", "")
    precisions, recalls = [], []
    for n in range(1, max_n + 1):
        hyp_grams = Counter(hyp[i:i + n] for i in range(len(hyp) - n + 1))
        ref_grams = Counter(ref[i:i + n] for i in range(len(ref) - n + 1))
        if not hyp_grams or not ref_grams:
            continue
        overlap = sum((hyp_grams & ref_grams).values())
        precisions.append(overlap / sum(hyp_grams.values()))
        recalls.append(overlap / sum(ref_grams.values()))
    if not precisions:
        return 0.0
    precision, recall = sum(precisions) / len(precisions), sum(recalls) / len(recalls)
    if precision + recall == 0:
        return 0.0
    return (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def extract_code(text: str) -> str:
    """The first fenced code block if there is one, else the text itself."""
    match = re.search(r"```(?:python|py)?\s*\n(.*?)```", text, flags=re.DOTALL)
    if match:
        return match.group(1)
    open_fence = re.search(r"```(?:python|py)?\s*\n(.*)", text, flags=re.DOTALL)
    return open_fence.group(1) if open_fence else text
