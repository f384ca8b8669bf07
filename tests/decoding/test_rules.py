"""The pure verification rules over a flattened batch of draft trees (rules.py): a batch decides
as its requests decided alone, the sibling rule generalises the chain rule, the one-hot sibling
rule has its closed form, and the batch layout is what each tree says."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mars_cli.decoding.rules import (DraftBatch, accepted_paths, first_sibling, greedy_choices, margin,
                                     sampling_choices, top_two)
from mars_cli.decoding.sampling import PositionNoise, SamplingParams, probabilities, process_logits
from mars_cli.decoding.tree import DraftTree
from mars_cli.decoding.verifiers import Verifier

NEG_INF = float("-inf")
MEASURES = st.sampled_from(["logit-ratio", "prob-ratio"])
THRESHOLDS = st.sampled_from([0.3, 0.8, 0.9, 0.99])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: one intra-op thread is fastest (two cost ~100x on a loaded machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- random requests
@dataclass
class Request:
    tree: DraftTree
    logits: torch.Tensor  # [n + 1, V]: the pending token's row, then one per node


@st.composite
def requests(draw, vocab: int, with_q: bool = False, max_nodes: int = 6, min_root_children: int = 0):
    """One request: a random tree (parents[i] < i, distinct sibling tokens, possibly no node) and
    random logits on a 0.5 grid (ties happen). Node tokens lean towards the parent row's top
    ranks (hypothesis shrinks towards the argmax), so greedy and MARS accept often enough."""
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    n = draw(st.integers(min(min_root_children, vocab), max_nodes))
    logits = torch.round(torch.randn(n + 1, vocab, generator=generator) * 4) / 2
    logits = logits + draw(st.sampled_from([0.0, 0.0, 4.0]))  # positive rows let the logit ratio relax
    if draw(st.booleans()) and vocab > 2:  # a masked column, as top-k would leave
        logits[:, draw(st.integers(0, vocab - 1))] = NEG_INF
    parents: list[int] = []
    tokens: list[int] = []
    for node in range(n):
        taken = {-1: set()} | {i: set() for i in range(node)}
        for child, parent in enumerate(parents):
            taken[parent].add(tokens[child])
        open_parents = [p for p in range(-1, node) if len(taken[p]) < vocab]  # node - 1 is always open
        parent = -1 if node < min_root_children else draw(st.sampled_from(open_parents))
        by_rank = torch.sort(logits[parent + 1], descending=True, stable=True).indices.tolist()
        candidates = [t for t in by_rank if t not in taken[parent]]
        tokens.append(candidates[draw(st.integers(0, len(candidates) - 1))])
        parents.append(parent)
    q = None
    if with_q and draw(st.booleans()):
        q = torch.softmax(torch.randn(n, vocab, generator=generator) * 1.5, -1)
    tree = DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), q)
    return Request(tree, logits)


@st.composite
def batches(draw, with_q: bool = False):
    """1..4 requests over one vocabulary (some of them empty)."""
    vocab = draw(st.integers(2, 6))
    return draw(st.lists(requests(vocab, with_q), min_size=1, max_size=4))


def batch_logits(reqs: list[Request]) -> torch.Tensor:
    return torch.cat([r.logits for r in reqs])


def flat_batch(reqs: list[Request]) -> DraftBatch:
    """vLLM's layout, ancestors computed by DraftBatch.of (not taken from the trees)."""
    trees = [r.tree for r in reqs]
    qs = [t.q for t in trees]
    q = None
    if any(x is not None for x in qs):
        vocab = reqs[0].logits.shape[1]
        q = torch.cat([x if x is not None else torch.nn.functional.one_hot(t.tokens, vocab).float()
                       for x, t in zip(qs, trees)])
    return DraftBatch.of(torch.cat([t.tokens for t in trees]), torch.cat([t.parents for t in trees]),
                         [t.size for t in trees], q)


def spans(reqs: list[Request]):
    """(node slice, row slice) of each request in the flattened batch."""
    node = row = 0
    for r in reqs:
        n = r.tree.size
        yield slice(node, node + n), slice(row, row + n + 1)
        node, row = node + n, row + n + 1


# ----------------------------------------------------------------------------- the rules, end to end
def decide(batch: DraftBatch, logits: torch.Tensor, uniforms: torch.Tensor | None, rule: str, threshold: float,
           measure: str, temperature: float):
    """The rules as the verifier chains them, from rules.py's pure functions, with given uniforms
    (None: greedy) -> (acceptable, strict, residual or None, chosen, path, last rows)."""
    processed = process_logits(logits, SamplingParams(temperature))
    top1, top2, z1, z2 = top_two(processed)
    low = in_top_two = None
    if rule == "mars":
        low = (margin(z1, z2, measure) > threshold) & torch.isfinite(z2)  # type: ignore[arg-type]
        in_top_two = (batch.tokens == top1[batch.parent_rows]) | (batch.tokens == top2[batch.parent_rows])
    if uniforms is None:
        ok, strict = greedy_choices(batch, top1, top2, low)
        residual = None
    else:
        ok, strict, residual = sampling_choices(batch, probabilities(processed), uniforms, in_top_two, low)
    chosen = first_sibling(ok, batch.parent_rows)
    path, last_rows = accepted_paths(batch, chosen)
    return ok, strict, residual, chosen, path, last_rows


@settings(max_examples=80, deadline=None)
@given(batches(with_q=True), st.sampled_from(["strict", "mars"]), THRESHOLDS, MEASURES,
       st.sampled_from([0.0, 1.0, 0.7]), st.integers(0, 2**31 - 1))
def test_pure_rules_decide_a_batch_as_each_request_alone(reqs, rule, threshold, measure, temperature, seed):
    """greedy_choices / sampling_choices, first_sibling and accepted_paths on a batch of random
    trees (some empty, some with q, some one-hot) equal the same functions on each request's own
    batch of one, given the matching slice of the same uniforms."""
    uniforms = None if temperature == 0.0 else torch.rand(sum(r.tree.size for r in reqs),
                                                          generator=torch.Generator().manual_seed(seed))
    logits = batch_logits(reqs)
    for batch in (DraftBatch.of_trees([r.tree for r in reqs]), flat_batch(reqs)):
        together = decide(batch, logits, uniforms, rule, threshold, measure, temperature)
        ok, strict, residual, chosen, path, last_rows = together
        for b, (r, (nodes, rows)) in enumerate(zip(reqs, spans(reqs))):
            own = DraftBatch.of_trees([r.tree])
            alone = decide(own, r.logits, None if uniforms is None else uniforms[nodes], rule, threshold, measure,
                           temperature)
            for name, a, t in zip(("acceptable", "strict", "chosen", "path"), alone[:2] + alone[3:5],
                                  (ok, strict, chosen, path)):
                assert torch.equal(a, t[nodes]), (name, b)
            assert int(last_rows[b] - batch.root_rows[b]) == int(alone[5][0]), b
            if residual is not None:
                torch.testing.assert_close(alone[2], residual[rows], rtol=1e-6, atol=1e-7)


def greedy_walk(r: Request, rule: str, threshold: float, measure: str):
    """The greedy rules written as a walk from the root (the oracle): at each row take the first
    child equal to the argmax; under MARS at a low-margin row with no such child, the first equal
    to the runner-up. -> (path, next token, relaxed, examined rows, low-margin examined rows)."""
    top1, top2, z1, z2 = top_two(r.logits.float())
    low = (margin(z1, z2, measure) > threshold) & torch.isfinite(z2) if rule == "mars" else \
        torch.zeros(r.logits.shape[0], dtype=torch.bool)
    tokens, parents = r.tree.tokens.tolist(), r.tree.parents.tolist()
    row, path, relaxed, examined = 0, [], 0, []
    while kids := [i for i, parent in enumerate(parents) if parent + 1 == row]:
        examined.append(row)
        pick = next((i for i in kids if tokens[i] == top1[row]), None)
        if pick is None and low[row]:
            pick = next((i for i in kids if tokens[i] == top2[row]), None)
            relaxed += pick is not None
        if pick is None:
            break
        path.append(pick)
        row = pick + 1
    return path, int(top1[row]), relaxed, examined, int(low[examined].sum()) if examined else 0


@settings(max_examples=80, deadline=None)
@given(batches(), st.sampled_from(["strict", "mars"]), THRESHOLDS, MEASURES)
def test_greedy_verifier_decides_a_batch_as_each_request_alone(reqs, rule, threshold, measure):
    """Verifier.verify_batch (both layouts) gives, field by field, the verdicts of Verifier.verify
    on each request alone, and those are the root-to-leaf walk's."""
    verifier = Verifier(rule, threshold, measure)  # type: ignore[arg-type]
    alone = [verifier.verify(r.logits, r.tree) for r in reqs]
    for r, verdict in zip(reqs, alone):
        path, next_token, relaxed, examined, low = greedy_walk(r, rule, threshold, measure)
        assert (verdict.accepted_positions, verdict.next_token, verdict.relaxed, verdict.examined,
                verdict.low_margin) == (sorted(path), next_token, relaxed, len(examined), low)
        if rule == "mars":
            z1, z2 = top_two(r.logits.float())[2:]
            assert torch.equal(verdict.margins, margin(z1, z2, measure)[examined])  # type: ignore[arg-type]
        else:
            assert verdict.margins is None
    logits = batch_logits(reqs)
    for batch in (DraftBatch.of_trees([r.tree for r in reqs]), flat_batch(reqs)):
        together = verifier.verify_batch(logits, batch)
        assert len(together) == len(reqs)
        for a, t in zip(alone, together):
            assert (a.accepted_positions, a.next_token, a.relaxed, a.examined, a.low_margin) == \
                (t.accepted_positions, t.next_token, t.relaxed, t.examined, t.low_margin)
            assert (a.margins is None) == (t.margins is None)
            if a.margins is not None:
                assert torch.equal(a.margins, t.margins)


def test_a_hand_built_batch():
    """Three requests: a chain (its first draft the argmax, its second not), an empty one (a
    plain step), and a tree whose argmax child is the second sibling and whose grandchild is the
    runner-up of a low-margin row, rescued by MARS only."""
    chain = DraftTree.chain(torch.tensor([1, 0]))
    tree = DraftTree(torch.tensor([0, 2, 1]), torch.tensor([-1, -1, 1]))
    logits = torch.tensor([
        [0.0, 5, 1], [1, 0, 6], [2, 0, 0],  # chain: 1 is the argmax, 0 is not (2 is): correction 2
        [0.0, 1, 3],  # empty: the plain step emits 2
        [1.0, 0, 9],  # tree root: argmax 2 = node 1 (the second sibling), r = 1/9
        [0.0, 7, 0],  # node 0's row (a leaf, never examined)
        [10.0, 9.5, 0],  # node 1's row: top-1 0, runner-up 1 = node 2's token, r = 0.95
        [0.0, 0, 4],  # node 2's row: the bonus after it is 2
    ])
    batch = DraftBatch.of_trees([chain, DraftTree.empty("cpu"), tree])
    strict = Verifier("strict").verify_batch(logits, batch)
    assert [(v.accepted_positions, v.next_token, v.examined, v.relaxed) for v in strict] == \
        [([0], 2, 2, 0), ([], 2, 0, 0), ([1], 0, 2, 0)]
    relaxed = Verifier("mars", 0.9).verify_batch(logits, batch)
    assert [(v.accepted_positions, v.next_token, v.examined, v.relaxed, v.low_margin) for v in relaxed] == \
        [([0], 2, 2, 0, 0), ([], 2, 0, 0, 0), ([1, 2], 2, 2, 1, 1)]
    assert relaxed[0].margins.tolist() == pytest.approx([0.2, 1 / 6])
    assert relaxed[1].margins.numel() == 0
    assert relaxed[2].margins.tolist() == pytest.approx([1 / 9, 0.95])


# ----------------------------------------------------------------------------- the chain rule as a special case
@settings(max_examples=80, deadline=None)
@given(st.integers(2, 6), st.integers(1, 6), st.integers(0, 2**31 - 1), st.data(),
       st.sampled_from(["strict", "mars"]), THRESHOLDS)
def test_sibling_rule_on_a_chain_is_the_chain_sampling_rule(vocab, k, seed, data, rule, threshold):
    """On a chain with each node's own q, sampling_choices is the speculative sampling rule:
    accept x_i iff u_i * q_i(x_i) < p_i(x_i) (MARS: or x_i is the top-1/top-2 of a low-margin row
    i), the accepted prefix ends at the first rejection, and each row's residual is
    normalize(max(0, p_i - q_i)) (p_i where that has no mass; p_k past the last draft)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=generator) * 2
    if data.draw(st.booleans(), "masked column") and vocab > 2:
        logits[:, data.draw(st.integers(0, vocab - 1), "column")] = NEG_INF
    p = torch.softmax(logits, -1)
    q = torch.softmax(torch.randn(k, vocab, generator=generator) * 2, -1)
    same = torch.tensor(data.draw(st.lists(st.booleans(), min_size=k, max_size=k), "q = p rows"))
    q = torch.where(same[:, None], p[:k], q)  # rows with no residual mass: the fallback to p
    tokens = torch.multinomial(q, 1, generator=generator)[:, 0]
    uniforms = torch.rand(k, generator=generator)
    batch = DraftBatch.of_trees([DraftTree.chain(tokens, q)])

    top1, top2, z1, z2 = top_two(logits)
    low = in_top_two = None
    if rule == "mars":
        low = (margin(z1, z2, "prob-ratio") > threshold) & torch.isfinite(z2)
        in_top_two = (tokens == top1[:k]) | (tokens == top2[:k])
    ok, strict, residual = sampling_choices(batch, p, uniforms, in_top_two, low)

    positions = torch.arange(k)
    old_strict = uniforms * q[positions, tokens] < p[positions, tokens]
    old_ok = old_strict if low is None else old_strict | (low[:k] & in_top_two)
    assert torch.equal(strict, old_strict)
    assert torch.equal(ok, old_ok)
    positive = (p[:k] - q).clamp_min(0.0)
    mass = positive.sum(-1, keepdim=True)
    old_residual = torch.cat([torch.where(mass > 0, positive / mass.clamp_min(1e-30), p[:k]), p[k:]])
    torch.testing.assert_close(residual, old_residual, rtol=1e-6, atol=1e-7)

    old_length = int(old_ok.long().cumprod(0).sum())
    path, last_rows = accepted_paths(batch, first_sibling(ok, batch.parent_rows))
    assert torch.equal(path, positions < old_length) and int(last_rows[0]) == old_length


# ----------------------------------------------------------------------------- one-hot q: the closed form
@settings(max_examples=80, deadline=None)
@given(st.integers(2, 6).flatmap(lambda vocab: requests(vocab, max_nodes=8, min_root_children=2)),
       st.integers(0, 2**31 - 1), st.floats(0.5, 2.0))
def test_one_hot_sibling_rule_has_its_closed_form(req, seed, scale):
    """Proposals taken as given (q = None): child i of a row is accepted by the strict rule iff
    u_i * (1 - p(earlier siblings' tokens)) < p(x_i), and a row's residual is p with all its
    children's tokens removed, renormalised. Checked where the two sides differ by more than
    rounding."""
    tree = req.tree
    logits = req.logits / scale + torch.randn(req.logits.shape, generator=torch.Generator().manual_seed(seed)) * 0.1
    p = torch.softmax(logits, -1)
    uniforms = torch.rand(tree.size, generator=torch.Generator().manual_seed(seed + 1))
    batch = DraftBatch.of_trees([tree])
    _, strict, residual = sampling_choices(batch, p, uniforms, None, None)
    chosen = first_sibling(strict, batch.parent_rows)

    p64, tokens, parents = p.double(), tree.tokens.tolist(), tree.parents.tolist()
    checked, closed_form = 0, {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        earlier = [tokens[j] for j in range(i) if parents[j] == parent]
        lhs = uniforms[i].double() * (1 - p64[parent + 1, earlier].sum())
        rhs = p64[parent + 1, token]
        if abs(lhs - rhs) > 1e-5:
            assert bool(strict[i]) == bool(lhs < rhs), (i, float(lhs), float(rhs))
            checked += 1
        closed_form[i] = bool(lhs < rhs) if abs(lhs - rhs) > 1e-5 else bool(strict[i])
    for i, parent in enumerate(parents):  # each parent moves to its first accepted child
        first = next(j for j in range(len(parents)) if parents[j] == parent and (closed_form[j] or j == i))
        assert bool(chosen[i]) == (closed_form[i] and first == i), i
    for row in range(tree.size + 1):
        removed = [tokens[i] for i, parent in enumerate(parents) if parent + 1 == row]
        rest = p64[row].clone()
        rest[removed] = 0
        if rest.sum() > 1e-6:  # all the row's mass on its children: every child cannot be rejected
            torch.testing.assert_close(residual[row].double(), rest / rest.sum(), rtol=1e-5, atol=1e-6)
    assert checked > 0  # two root children at least: something was decided away from the boundary


def test_one_hot_siblings_by_hand():
    """p = (0.5, 0.3, 0.2) at the root, children tokens 0 then 1: child 0 accepted iff u < 0.5,
    child 1 iff u * 0.5 < 0.3 (u < 0.6); the residual after both is token 2 alone."""
    p = torch.tensor([[0.5, 0.3, 0.2], [1 / 3] * 3, [1 / 3] * 3])
    tree = DraftTree(torch.tensor([0, 1]), torch.tensor([-1, -1]))
    batch = DraftBatch.of_trees([tree])
    for u0, u1, expected in [(0.49, 0.59, [True, True]), (0.51, 0.61, [False, False]), (0.6, 0.55, [False, True])]:
        _, strict, residual = sampling_choices(batch, p, torch.tensor([u0, u1]), None, None)
        assert strict.tolist() == expected
        assert residual[0].tolist() == pytest.approx([0.0, 0.0, 1.0])
        path, last_rows = accepted_paths(batch, first_sibling(strict, batch.parent_rows))
        assert path.tolist() == [expected[0], not expected[0] and expected[1]]


# ----------------------------------------------------------------------------- the layout
@settings(max_examples=80, deadline=None)
@given(batches())
def test_flat_layout_matches_each_tree(reqs):
    """DraftBatch.of without `ancestors` computes the block diagonal of each tree's
    ancestry()[1:, 1:], and every index of the layout is what the trees say: rows request after
    request (pending token then nodes), each node scored at its parent's row, siblings ranked in
    order."""
    trees = [r.tree for r in reqs]
    computed, given_trees = flat_batch(reqs), DraftBatch.of_trees(trees)
    assert torch.equal(computed.ancestors, torch.block_diag(*[t.ancestry()[1:, 1:] for t in trees]))
    for field in ("tokens", "request", "node_rows", "parent_rows", "root_rows", "row_request", "ancestors"):
        assert torch.equal(getattr(computed, field), getattr(given_trees, field)), field
    assert computed.counts == given_trees.counts == tuple(t.size for t in trees)
    assert len(computed.rank_groups) == len(given_trees.rank_groups)

    request, node_rows, parent_rows, root_rows, row_request, rank = [], [], [], [], [], []
    row = 0
    for b, t in enumerate(trees):
        root_rows.append(row)
        row_request += [b] * (t.size + 1)
        parents = t.parents.tolist()
        for i, parent in enumerate(parents):
            request.append(b)
            node_rows.append(row + 1 + i)
            parent_rows.append(row + 1 + parent)
            rank.append(sum(1 for j in range(i) if parents[j] == parent))
        row += t.size + 1
    assert computed.request.tolist() == request and computed.node_rows.tolist() == node_rows
    assert computed.parent_rows.tolist() == parent_rows and computed.root_rows.tolist() == root_rows
    assert computed.row_request.tolist() == row_request
    assert computed.size == len(request) and computed.requests == len(trees) and computed.rows == row
    for batch in (computed, given_trees):
        groups = [sorted(g.tolist()) for g in batch.rank_groups]
        assert groups == [[i for i, r in enumerate(rank) if r == level] for level in range(len(groups))]
        assert sum(len(g) for g in groups) == len(rank)


# ----------------------------------------------------------------------------- exactness over siblings
@pytest.mark.parametrize("with_q", [True, False])
def test_strict_sampling_over_siblings_follows_the_target(with_q):
    """Coupled sampling over siblings is exact: 20,000 rounds of a tree with three children of
    the root (drawn without replacement from q, each node's q being q with its earlier siblings
    removed; or, one-hot, chosen by a fixed skewed rule) and one grandchild: the first emitted
    token (the accepted child's, else the token drawn after all three were rejected) follows p."""
    torch.manual_seed(1)
    vocab, per_batch, draws = 6, 250, 20_000
    target_logits = torch.randn(5, vocab) * 1.5
    p0 = torch.softmax(target_logits[0], -1)
    q0 = torch.softmax(torch.randn(vocab) * 1.5, -1) if with_q else \
        torch.tensor([0.05, 0.05, 0.05, 0.05, 0.4, 0.4])
    assert 0.5 * (q0 - p0).abs().sum() > 0.15  # accepting the first sibling would fail the test
    parents = torch.tensor([-1, -1, -1, 0]).repeat(per_batch)
    drafts_generator = torch.Generator().manual_seed(11)
    verifier = Verifier("strict", sampling=SamplingParams(1.0))
    firsts = []
    for round_index in range(draws // per_batch):
        children = torch.multinomial(q0.expand(per_batch, vocab), 3, replacement=False, generator=drafts_generator)
        grandchild = torch.randint(vocab, (per_batch, 1), generator=drafts_generator)
        tokens = torch.cat([children, grandchild], dim=1)  # [per_batch, 4]
        q = None
        if with_q:
            removed = torch.zeros(per_batch, 3, vocab)
            removed[:, 1] = torch.nn.functional.one_hot(children[:, 0], vocab)
            removed[:, 2] = removed[:, 1] + torch.nn.functional.one_hot(children[:, 1], vocab)
            sibling_q = q0 * (1 - removed)
            sibling_q = sibling_q / sibling_q.sum(-1, keepdim=True)
            q = torch.cat([sibling_q, torch.nn.functional.one_hot(grandchild, vocab).float()], dim=1)
            q = q.reshape(-1, vocab)
        batch = DraftBatch.of(tokens.reshape(-1), parents, [4] * per_batch, q)
        noises = [PositionNoise(12_000_000 + round_index * per_batch + r, vocab) for r in range(per_batch)]
        verdicts = verifier.verify_batch(target_logits.repeat(per_batch, 1), batch, noises, [0] * per_batch)
        for r, verdict in enumerate(verdicts):
            firsts.append(tokens[r, verdict.accepted_positions[0]].item() if verdict.accepted_positions
                          else verdict.next_token)
    tv = 0.5 * (torch.bincount(torch.tensor(firsts), minlength=vocab) / draws - p0).abs().sum().item()
    assert tv < 0.03, tv
