"""Quality metrics that compare an output with a reference output (pure functions)."""

from __future__ import annotations

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
