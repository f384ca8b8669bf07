"""Replays strict greedy tree decoding through known answers: a draft head's tree tau in seconds.

Strict greedy verification emits the target's own greedy answer whatever the drafts, so a round
can be replayed without the target: the head reads the true pairs up to the round's start (their
features from one forward over the whole answer), grows its tree, and the accepted path is the
longest one that spells the answer from there; the answer's next token is the bonus. What the
decoding loop does (decoding/loop.py), minus the target's verification passes: a head variant
(rerank temperature, tree shape, int8 rows, prompt lookup's branch grafted on or drafted in the
head's place) is measured on the suites' first turns in a minute, where `mars eval` takes ten. The
answers come from plain greedy decoding in the replay's dtype, cached in `--answers` (a JSONL file
written on first use).

    python benchmarks/tools/tree_replay.py --answers /tmp/answers-bf16.jsonl --dtype bfloat16 \\
        --variants "own;t0.8:temperature=0.8;t1.25:temperature=1.25;int8:int8=1"
"""

from __future__ import annotations

import argparse
import json
from itertools import zip_longest
from pathlib import Path

import torch

from mars_cli.decoding.drafters import NgramDrafter
from mars_cli.decoding.sampling import SamplingParams
from mars_cli.decoding.target import select_features
from mars_cli.decoding.tree import DraftTree, TreeShape
from mars_cli.evaluation.suites import load_suite
from mars_cli.head import int8
from mars_cli.head.drafter import REPEAT_MATCH, HeadDrafter, load_head
from mars_cli.models import load_model
from mars_cli.options import DecodingOptions
from mars_cli.session import Session


def answers(path: Path, suites: list[str], limit: int, dtype: str, max_new_tokens: int) -> list[dict]:
    """Each suite sample's first turn, encoded, with the target's plain greedy answer (read from
    `path` when it holds them all, else decoded and written there)."""
    wanted = [(suite, sample) for suite in suites for sample in load_suite(suite).samples[:limit]]
    known = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            known[(row["suite"], row["id"])] = row
    if all((suite, sample.id) in known for suite, sample in wanted):
        return [known[(suite, sample.id)] for suite, sample in wanted]
    session = Session(DecodingOptions.of(dtype=dtype, draft="none", max_new_tokens=max_new_tokens))
    rows = []
    for suite, sample in wanted:
        prompt = session.encode(sample.turns[0])
        rows.append({"suite": suite, "id": sample.id, "prompt": prompt, "answer": session.run(prompt).token_ids})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return rows


def accepted_path(tree: DraftTree, truth: list[int]) -> int:
    """How many drafts strict greedy verification accepts: the longest path from the root whose
    tokens spell `truth` (the first matching child at each node, as the rules take it)."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    node, accepted = -1, 0
    while accepted < len(truth):
        child = next((i for i, p in enumerate(parents) if p == node and tokens[i] == truth[accepted]), None)
        if child is None:
            break
        node, accepted = child, accepted + 1
    return accepted


def replay(drafter: HeadDrafter, features: torch.Tensor, prompt: list[int], answer: list[int],
           depth: int, lookup: NgramDrafter | None = None, lookup_depth: int = 0,
           instead: int = 0, reach: int = 0) -> tuple[int, int, list[int], int]:
    """(tokens, rounds, accepted count per depth, nodes drafted) of decoding `answer` after
    `prompt`; with `lookup`, its continuation (up to `lookup_depth` tokens) grafted on each tree,
    or with `instead` drafted in its place (1: whenever lookup finds one; 2: only where the
    drafter's first token is lookup's too); `reach`: after a match of 3 tokens, up to that many
    tokens instead."""
    sequence = torch.tensor(prompt + answer)
    length, end = len(prompt), len(prompt) + len(answer)
    drafter.reset()
    drafter.observe_features(features[: length - 1])
    rounds, nodes, by_depth = 0, 0, [0] * max(depth, lookup_depth, reach)
    while length < end:
        k = min(depth, end - length - 1)
        tree = drafter.propose(sequence[:length], k) if k else DraftTree.empty(torch.device("cpu"))
        tree = tree.within_depth(end - length - 1)  # as loop.fit: the room left (lookup may pass k)
        if lookup is not None and end - length > 1:
            found = lookup.continuations(sequence[:length], min(lookup_depth, end - length - 1), lookup.shape.topk)
            if reach:
                found = STRONG.continuations(sequence[:length], min(reach, end - length - 1), 1) or found
            if not instead:
                tree = tree.grafted(found)
            elif found and (instead == 1 or (tree.size and tree.tokens[0].item() == found[0][0])):
                tree = DraftTree.chain(torch.tensor(found[0]))
        nodes += tree.size
        accepted = accepted_path(tree, answer[length - len(prompt):]) if tree.size else 0
        by_depth += [0] * (accepted - len(by_depth))  # the drafter's own lookup may reach past k
        for level in range(accepted):
            by_depth[level] += 1
        drafter.observe_features(features[length - 1 : length + accepted])  # the pending row and the accepted
        drafter.commit(length + accepted)
        length += accepted + 1
        rounds += 1
    return len(answer), rounds, by_depth, nodes


STRONG = NgramDrafter(torch.device("cpu"), min_ngram=REPEAT_MATCH)  # `reach`: the drafter's strong matches


def parse_variants(text: str) -> dict[str, dict[str, float]]:
    """`name[:key=value,...];...` -> {name: settings}."""
    variants = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, settings = part.partition(":")
        variants[name] = {key: float(value) for key, value in
                          (item.split("=") for item in filter(None, settings.split(",")))}
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=Path, required=True)
    parser.add_argument("--suites", default="chat,code,multiturn")
    parser.add_argument("--limit", type=int, default=24)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--head", default="head")
    parser.add_argument("--shape", default="4x8", help="TOPKxNODES of every variant unless it says otherwise")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--variants", default="own",
                        help="name[:temperature=T,int8=1,features32=1,topk=K,nodes=N,depth=D,lookup=L,ngram=N,paths=P,"
                             "instead=I,reach=R,own_lookup=1];... "
                             "(temperature divides the head's scores before the tree ranks them; features32: the "
                             "pairs' features from a float32 forward, cast to the head's dtype; lookup: prompt "
                             "lookup's continuation of up to L tokens, from a match of at least `ngram` tokens, "
                             "grafted on every tree; paths: that many continuations of earlier matches; instead: "
                             "lookup's continuation drafted in place of the head's (1: whenever found, 2: where the "
                             "head's first token agrees); reach: after a 3-token match, up to R tokens; "
                             "own_lookup: the head drafter's own `--draft-lookup on`)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = answers(args.answers, args.suites.split(","), args.limit, args.dtype, args.max_new_tokens)
    target = load_model("smollm2-135m", device="cpu", dtype=args.dtype)
    topk, nodes = (int(v) for v in args.shape.split("x"))
    float_target = None  # for `features32`: the answers' features from a float32 forward, cast to the head's dtype
    computed: dict[tuple[bool, int], torch.Tensor] = {}  # (features32, row) -> features: once for every variant

    def features_of(index: int, float32: bool, layers: tuple[int, ...]) -> torch.Tensor:
        nonlocal float_target
        if (float32, index) not in computed:
            if float32 and float_target is None:
                float_target = load_model("smollm2-135m", device="cpu", dtype="float32")
            source = float_target if float32 else target
            row = rows[index]
            with torch.inference_mode():
                out = source.model(input_ids=torch.tensor([row["prompt"] + row["answer"]]), output_hidden_states=True)
            computed[(float32, index)] = select_features(out.hidden_states, layers)[0].to(target.dtype)
        return computed[(float32, index)]

    results = {}
    for name, settings in parse_variants(args.variants).items():
        head = load_head(args.head, target)
        if settings.get("int8"):
            int8.install(head)
        temperature = settings.get("temperature", 1.0)
        if temperature != 1.0:
            scores = head.logits
            head.logits = lambda state, scores=scores: scores(state) / temperature  # type: ignore[method-assign]
        shape = TreeShape(int(settings.get("topk", topk)), int(settings.get("nodes", nodes)))
        depth = int(settings.get("depth", args.depth))
        drafter = HeadDrafter(head, target, SamplingParams(0.0), shape=shape, lookup=bool(settings.get("own_lookup")))
        lookup_depth = int(settings.get("lookup", 0))
        lookup = NgramDrafter(torch.device("cpu"), TreeShape(int(settings.get("paths", 1)), 64),
                              max_ngram=int(settings.get("ngram_max", 3)),
                              min_ngram=int(settings.get("ngram", 1))) if lookup_depth else None
        per_suite: dict[str, list[int]] = {}
        drafted = 0
        levels = [0] * max(depth, lookup_depth, int(settings.get("reach", 0)))
        with torch.inference_mode():
            for index, row in enumerate(rows):
                features = features_of(index, bool(settings.get("features32")), drafter.feature_layers)
                tokens, rounds, by_depth, fed = replay(drafter, features, row["prompt"], row["answer"], depth,
                                                         lookup, lookup_depth, int(settings.get("instead", 0)),
                                                         int(settings.get("reach", 0)))
                drafted += fed
                per_suite.setdefault(row["suite"], [0, 0])
                per_suite[row["suite"]][0] += tokens
                per_suite[row["suite"]][1] += rounds
                levels = [a + b for a, b in zip_longest(levels, by_depth, fillvalue=0)]
        total = [sum(v[0] for v in per_suite.values()), sum(v[1] for v in per_suite.values())]
        results[name] = {"settings": settings, "tau": {s: v[0] / v[1] for s, v in {**per_suite, "all": total}.items()},
                         "accepted_by_depth": [round(a / total[1], 3) for a in levels],
                         "nodes_per_round": drafted / total[1]}
        taus = " / ".join(f"{s} {v:.3f}" for s, v in results[name]["tau"].items())
        print(f"{name}: tau {taus}; accepted per round by depth {results[name]['accepted_by_depth']}; "
              f"{drafted / total[1]:.2f} nodes a round", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"args": vars(args) | {"answers": str(args.answers), "out": str(args.out)},
                                        "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
