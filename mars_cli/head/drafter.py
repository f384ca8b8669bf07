"""The draft head as a drafter: `--draft head[:PATH]`.

It keeps the target's features for the positions in the target's cache (handed over by the loop
from the verification passes) and its own small cache of the pairs it has read. Each round it
reads the new true pairs, then drafts k tokens (or, with a branching shape, a tree of k levels)
feeding back its own predicted states; before the next round the drafted pairs are dropped from
its cache and the true ones take their place.
Two head formats draft the same way: an EAGLE-3 head directory (eagle3.py, the public format)
and the original single-file head (model.DraftHead).
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..decoding.acceptance import DraftAcceptance
from ..decoding.drafters import Drafter, NgramDrafter
from ..decoding.tree import CHAIN, DraftTree, FrontierRows, TreeShape, grow_tree, pool_size
from ..decoding.sampling import SamplingParams, probabilities, process_logits
from ..errors import UserError
from ..models import LoadedModel
from ..paths import user_head_dir
from . import validate
from .eagle3 import CONFIG_FILE, Eagle3Config, Eagle3Head, is_head_directory
from .model import DraftHead, HeadCache, HeadConfig, PairHead, config_fields
from .parts import StaticHeadCache

STATIC_HEAD_BLOCK = 512  # a compiled head's static cache grows in whole blocks (each size: new graphs)
# `--draft-lookup`: a match of the text's last 3 tokens is strong evidence (replayed on the suites'
# 72 first turns): a greedy chain then drafts lookup's continuation instead of the head's (chain tau
# 2.143 -> 2.236; after any match, 1.978; only where the head's first draft agrees, 2.194), and a
# tree's lookup branch runs past the searched levels, up to LOOKUP_REACH tokens (4 x 8 trees:
# 2.824 -> 2.880 for 0.3 more nodes a round; after any match: 2.912 for 1.4 more)
REPEAT_MATCH = 3
LOOKUP_REACH = 8

SHIPPED_HEADS = Path(__file__).resolve().parent.parent / "heads"


def head_fingerprint(path: Path) -> str | None:
    """The target fingerprint a head records (EAGLE-3 directory: config.json's `mars` entry;
    single file: its metadata), or None when it records none or cannot be read."""
    try:
        if is_head_directory(path):
            mars = validate.read_json_object(path / CONFIG_FILE).get("mars") or {}
            recorded = mars.get("target_fingerprint") if isinstance(mars, dict) else None
            return recorded if isinstance(recorded, str) else None
        if path.suffix == ".safetensors" and path.is_file():
            with safe_open(str(path), framework="pt") as handle:
                fields = config_fields(handle.metadata())
            recorded = fields.get("target_fingerprint") if isinstance(fields, dict) else None
            return recorded if isinstance(recorded, str) else None
    except (OSError, SafetensorError, ValueError, AttributeError, UserError):
        return None  # unreadable or malformed: skipped, as a stray file in a profile folder is
    return None  # neither a head directory nor a .safetensors file


def head_acceptance(path: Path) -> DraftAcceptance | None:
    """The measured acceptance an EAGLE-3 head directory records (config.json's
    `mars.acceptance`), read without loading its weights; None when it records none or its config
    cannot be read (loading the head for drafting then says what is wrong with it)."""
    if not is_head_directory(path):
        return None
    try:
        where = str(path / CONFIG_FILE)
        return Eagle3Config.from_json(validate.read_json_object(path / CONFIG_FILE), where).acceptance
    except (OSError, UserError):
        return None


def find_head(fingerprint: str) -> Path | None:
    """A head trained for the target with this fingerprint, matched as profiles are: the user's
    own heads first, then the shipped ones; in each folder EAGLE-3 directories before single files."""
    for folder in (user_head_dir(), SHIPPED_HEADS):
        if not folder.is_dir():
            continue
        entries = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))
        for path in entries:
            if head_fingerprint(path) == fingerprint:
                return path
    return None


def load_head(spec: str, target: LoadedModel, allow_pickle: bool = False) -> PairHead:
    """`head` (a head made for this target) or `head:PATH` (an EAGLE-3 directory or a single-file
    head). Checked against the target (sizes, feature layers, recorded fingerprint) and against
    memory from what the files declare, before the head is allocated."""
    _, colon, location = spec.partition(":")
    if colon and not location.strip():
        raise UserError(f"`{spec}` names no path: pass head:DIR (or head:FILE), or `head` for the head made "
                        "for the target")
    path = Path(location).expanduser() if location else find_head(target.fingerprint)
    if path is None:
        raise UserError(f"no draft head found for {target.spec}; train one with `mars train-head "
                        f"--target {target.spec}` (or pass --draft head:DIR)")
    if not path.exists():
        raise UserError(f"draft head not found: {path}")
    limit = validate.parameter_limit(sum(p.numel() for p in target.model.parameters()))
    if path.is_dir():
        head: PairHead = Eagle3Head.load(path, allow_pickle, device=target.output_device,
                                         check=lambda config, width: _check_eagle3(config, width, path, target),
                                         max_parameters=limit)
        _check_feature_layers(head, path, target)
    else:
        head = DraftHead.load(path, device=target.output_device, dtype=torch.float32,
                              check=lambda config: _check_single_file(config, path, target), max_parameters=limit)
    head.source = str(path)
    # drafting in the session's dtype (the one measured fastest for the target's steps, or asked
    # for): a float32 head beside a bfloat16 target cast every feature and paid float32 matmuls
    if target.dtype.is_floating_point and target.dtype != torch.float32:
        head = head.to(dtype=target.dtype)
    return head.attach(target.model)


def _check_single_file(config: HeadConfig, path: Path, target: LoadedModel) -> None:
    """A single-file head's declared sizes and fingerprint against the target (before allocating)."""
    if config.hidden_size != target.model.get_input_embeddings().weight.shape[1] or config.vocab_size != target.vocab_size:
        raise UserError(f"draft head {path} was trained for {config.target or 'another model'} "
                        f"(hidden size {config.hidden_size}, vocabulary {config.vocab_size}); "
                        f"it cannot draft for {target.spec}")
    if config.target_fingerprint and config.target_fingerprint != target.fingerprint:
        raise UserError(f"draft head {path} was trained for {config.target or 'another model'} "
                        f"(fingerprint {config.target_fingerprint[:12]}), not for {target.spec} "
                        f"({target.fingerprint[:12]})")


def _check_eagle3(config: Eagle3Config, target_hidden: int, path: Path, target: LoadedModel) -> None:
    """An EAGLE-3 head's declared sizes (config.json, and fc's width from the weights' header) and
    fingerprint against the target, before the head is allocated."""
    embed_width = target.model.get_input_embeddings().weight.shape[1]
    problems = []
    if config.hidden_size != embed_width:
        problems.append(f"hidden size {config.hidden_size}, the target's embeddings are {embed_width} wide")
    if target_hidden != embed_width:
        problems.append(f"fc reads {3 * target_hidden} features, the target gives 3 x {embed_width}")
    if config.vocab_size != target.vocab_size:
        problems.append(f"vocabulary {config.vocab_size}, the target's is {target.vocab_size}")
    _refuse(problems, config, path, target)
    recorded = config.mars.get("target_fingerprint")
    if recorded and recorded != target.fingerprint:
        raise UserError(f"draft head {path} was trained for {_made_for(config)} (fingerprint {recorded[:12]}), "
                        f"not for {target.spec} ({target.fingerprint[:12]})")


def _check_feature_layers(head: Eagle3Head, path: Path, target: LoadedModel) -> None:
    """The target layers the head reads must exist (known once the target's depth is)."""
    layers = target.num_layers
    aux = head.feature_layers_for(target.model)
    if any(not -layers - 1 <= layer <= layers for layer in aux):
        _refuse([f"feature layers {list(aux)} outside the target's {layers} layers"], head.config, path, target)


def _made_for(config: Eagle3Config) -> str:
    return config.mars.get("target") or "another model"


def _refuse(problems: list[str], config: Eagle3Config, path: Path, target: LoadedModel) -> None:
    if problems:
        raise UserError(f"draft head {path} ({_made_for(config)}) cannot draft for {target.spec}: "
                        f"{'; '.join(problems)}")


class HeadDrafter(Drafter):
    """Drafts up to k tokens a round; with `min_confidence` > 0 it stops early once the product
    of its own probabilities for the tokens drafted so far (its estimate that the target accepts
    them all, as in EAGLE-2) falls below it, so rounds where it is guessing cost no more than a
    plain step plus one head step."""

    name = "head"

    def __init__(self, head: PairHead, target: LoadedModel, sampling: SamplingParams,
                 min_confidence: float = 0.0, compile: bool = False,
                 shape: TreeShape = CHAIN, lookup: bool = False) -> None:
        self.head = head
        self.shape = shape  # branching: draft a tree (EAGLE-2), `shape.tokens` nodes at most
        # `--draft-lookup on`: the head misses what the text repeats (names, code identifiers,
        # quoted lines), prompt lookup finds it. Each tree gets lookup's continuation as one more
        # branch (not compiled: one graph per width); a greedy chain is lookup's continuation instead
        # of the head's whenever the text's last REPEAT_MATCH tokens occurred before.
        self.repeats = NgramDrafter(torch.device("cpu"), min_ngram=REPEAT_MATCH)  # matches of the last 3 tokens
        # a tree's branch without such a match: shorter matches (the 3-token ones were looked for already)
        self.lookup = (NgramDrafter(torch.device("cpu"), max_ngram=REPEAT_MATCH - 1)
                       if lookup and shape.branches and not compile else None)
        self.chain_lookup = lookup and not shape.branches and sampling.greedy
        self.feature_layers = head.feature_layers_for(target.model)  # what the scorer hands over
        # `--compile on`: every drafting step (a chain's one pair, a tree level's frontier) runs
        # through torch.compile on a static head cache: fixed shapes, one graph per number of pairs
        # a step reads, captured as a CUDA graph on CUDA. Reading the round's true pairs stays eager.
        self._cuda_graphs = compile and head.fc.weight.device.type == "cuda"
        mode = "reduce-overhead" if self._cuda_graphs else None
        self._extend = torch.compile(head.extend, mode=mode, dynamic=False) if compile else None
        self.compiled = compile
        self.min_confidence = min_confidence
        self.target_device = target.device
        self.sampling = sampling
        self.vocab_size = head.target_vocab_size
        self.vocab_ids = head.vocab_ids  # target token id of each row the head scores
        self.reset()

    def reset(self) -> None:
        if self._extend is None:
            self.cache: HeadCache = HeadCache()
        elif not isinstance(getattr(self, "cache", None), StaticHeadCache):
            self.cache = self._static_cache(STATIC_HEAD_BLOCK)
        self.cache.truncate(0)  # a static cache is reused from sequence to sequence
        weight = self.head.fc.weight  # features kept in the head's dtype, on its device
        self.features = torch.empty(0, self.head.feature_width, device=weight.device, dtype=weight.dtype)
        self.held = torch.zeros(0, dtype=torch.bool)  # per position: were its features handed over?
        self.known = 0  # positions in the target's cache (with or without features)
        self.read = 0  # positions the head has read up to
        self.pairs = 0  # true pairs in the head's cache (fewer than `read` after skipped rounds)
        self.failed = False  # a new sequence drafts again (a NaN head fails again, noted once)

    @property
    def looks_up(self) -> bool:
        """Whether prompt lookup drafts with the head in this session (`--draft-lookup` applies)."""
        return self.lookup is not None or self.chain_lookup

    @property
    def who(self) -> str:
        """The head as a note names it: its file or directory when it was loaded from one."""
        source = getattr(self.head, "source", None)
        return f"draft head {source}" if source else "the draft head"

    def observe_features(self, hidden: torch.Tensor) -> None:
        end = self._grow(hidden.shape[0])
        self.features[self.known : end] = hidden.to(self.features.device, self.features.dtype)
        self.held[self.known : end] = True
        self.known = end

    def skip_features(self, count: int) -> None:
        """Positions without features (plain rounds while drafting is off): the head never reads
        their pairs. When it drafts again it reads the pairs it has, so its cache lacks the gap's:
        its drafts then differ from a head that read every pair (measured in docs/head.md)."""
        end = self._grow(count)
        self.held[self.known : end] = False
        self.known = end

    def _grow(self, count: int) -> int:
        """Room for `count` more positions; returns where they end."""
        end = self.known + count
        if end > self.features.shape[0]:
            size = max(2 * end, 256)
            grown = torch.empty(size, self.features.shape[1], device=self.features.device, dtype=self.features.dtype)
            grown[: self.known] = self.features[: self.known]
            self.features = grown
            held = torch.zeros(size, dtype=torch.bool)
            held[: self.known] = self.held[: self.known]
            self.held = held
        return end

    def commit(self, length: int) -> None:
        self.known = min(self.known, length)

    def _next_token(self, feature: torch.Tensor, position: int,
                    finite: list[torch.Tensor]) -> tuple[torch.Tensor, float]:
        """(token id for `position` of the sequence, the head's probability of it: computed only
        when confidence gating reads it). When sampling, the token is drawn with the target's
        noise at `position` (Drafter.draw) and whether q was finite is appended to `finite`."""
        scores = self.head.logits(feature).float()  # q in float32 whatever the head's dtype
        gating = self.min_confidence > 0
        if self.sampling.greedy:
            best = scores.argmax()
            return self.vocab_ids[best], float(torch.softmax(scores, dim=-1)[best]) if gating else 1.0
        full = scores.new_full((self.vocab_size,), float("-inf"))
        full[self.vocab_ids] = scores
        processed = process_logits(full, self.sampling)
        q = probabilities(processed)
        finite.append(self.finite(q))
        token = self.draw(processed, position)
        return token, float(q[token].nan_to_num(nan=1.0)) if gating else 1.0

    def _draft_step(self, fed: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor | None = None,
                    visible: torch.Tensor | None = None) -> torch.Tensor:
        """The head reads n pairs of its own (fed-back states and drafted tokens) after its cache:
        a chain's next pair, or a tree level's frontier at `positions` seeing `visible`
        ([n, cached + n]). Compiled: `extend` on the static cache, the same arithmetic as `step`."""
        if self._extend is None:
            return self.head.step(fed, tokens, self.cache, positions, visible)
        cache = self.cache
        start, n, device = len(cache), tokens.shape[0], fed.device
        slots = torch.arange(start, start + n, device=device)
        if visible is None:  # a chain: the cache and the new pairs before each
            visible = torch.ones(n, start + n, dtype=torch.bool, device=device).tril(start)
        mask = torch.zeros(n, cache.capacity, dtype=torch.bool, device=device)
        mask[:, : start + n] = visible
        if self._cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's output is not read again
        state = self._extend(fed, tokens, slots if positions is None else positions, slots, *cache.buffers, mask)
        cache.length = start + n
        return state.clone() if self._cuda_graphs else state

    def _static_cache(self, capacity: int) -> StaticHeadCache:
        head = self.head
        weight = head.fc.weight
        return StaticHeadCache(head.num_kv_heads, head.head_dim, capacity, weight.dtype, weight.device)

    def _make_room(self, pairs: int) -> None:
        """A static cache with room for `pairs` more: a larger one (a new graph) when it has not."""
        cache = self.cache
        if not isinstance(cache, StaticHeadCache) or len(cache) + pairs <= cache.capacity:
            return
        grown = self._static_cache(-(-(len(cache) + pairs) // STATIC_HEAD_BLOCK) * STATIC_HEAD_BLOCK)
        grown.append(cache.buffers[0][:, : len(cache)], cache.buffers[1][:, : len(cache)])
        self.cache = grown

    @torch.inference_mode()
    def propose(self, history: torch.Tensor, depth: int) -> DraftTree:
        if self.failed:  # the head proposed NaN earlier in this sequence
            return DraftTree.empty(self.target_device)
        self.cache.truncate(self.pairs)  # forget last round's drafted pairs
        if self.known == 0 or not self.held[self.known - 1]:  # a one-token prompt, or the last feature skipped
            return DraftTree.empty(self.target_device)
        # pair p = (f_p, x_{p+1}) for every position the target has scored since the last round
        held = self.held[self.read : self.known]
        if bool(held.all()):
            tokens = history[self.read + 1 : self.known + 1].to(self.features.device)
            features = self.features[self.read : self.known]
        else:  # after skipped rounds: only the positions whose features came
            positions = self.read + torch.nonzero(held).flatten()
            tokens = history[positions + 1].to(self.features.device)
            features = self.features[positions.to(self.features.device)]
        self._make_room(tokens.shape[0] + depth * max(self.shape.topk, 1))
        feature = self.head.step(features, tokens, self.cache)[-1:]
        self.pairs += tokens.shape[0]
        self.read = self.known
        if self.shape.branches:
            return self._with_lookup(self._propose_tree(feature, depth), history, depth)
        repeated = self.repeats.continuations(history, depth, 1) if self.chain_lookup else None
        if repeated:  # the text repeats itself: what followed last time, no head steps this round
            return DraftTree.chain(torch.tensor(repeated[0], dtype=torch.long, device=self.target_device))
        drafted, finite = [], []
        confidence = 1.0
        for step in range(depth):
            token, probability = self._next_token(feature[0], history.shape[0] + step, finite)
            if not 0.0 <= probability <= 1.0:  # NaN: greedy gating read it already, free to check
                return self.give_up(self.who, self.target_device)
            confidence *= probability
            if confidence < self.min_confidence:
                break
            drafted.append(token)
            if step + 1 < depth:
                feature = self._draft_step(feature, token.reshape(1))
        if finite and not bool(torch.stack(finite).all()):  # the round's one host sync for this check
            return self.give_up(self.who, self.target_device)
        if not drafted:
            return DraftTree.empty(self.target_device)
        return DraftTree.chain(torch.stack(drafted).to(self.target_device))

    def _with_lookup(self, tree: DraftTree, history: torch.Tensor, depth: int) -> DraftTree:
        """The head's tree with prompt lookup's continuation of `history` grafted on where it
        leaves the tree: the head's nodes keep their places, so its preferred path is still what a
        chain would draft, and the verifier picks whichever path matches. The continuation is at
        most `depth` tokens, or LOOKUP_REACH after a match of REPEAT_MATCH tokens: repeated text
        tends to go on repeating, and those nodes cost no head steps (the tree is then deeper than
        `depth`; the loop cuts it to the round's room)."""
        if self.lookup is None or tree.size == 0:  # a failed or empty head round stays empty
            return tree
        found = (self.repeats.continuations(history, max(depth, LOOKUP_REACH), 1)
                 or self.lookup.continuations(history, depth, 1))
        return tree.grafted(found)

    def _propose_tree(self, root: torch.Tensor, depth: int) -> DraftTree:
        """EAGLE-2's dynamic tree (decoding/tree.py): `depth` levels, `shape.topk` children of the
        `shape.topk` best nodes per level, the `shape.tokens` best nodes kept. Each level is one head
        step over the frontier, every pair seeing the true pairs and its own ancestors only, at the
        position its depth gives it. The tree's proposals are verified as given (no q)."""
        base = len(self.cache)  # true pairs; a node at depth d sits at position base + d - 1
        device = root.device
        pool = pool_size(self.shape.topk, depth)
        rows = FrontierRows(base, pool, device)
        states = root.new_zeros(pool, root.shape[-1])  # search node -> the state its pair produced
        finite: list[torch.Tensor] = []  # NaN scores would disorder the search: -inf, and the tree dropped

        def logprobs(scores: torch.Tensor) -> torch.Tensor:
            checked, ok = self.finite_rows(torch.log_softmax(scores.float(), dim=-1))
            finite.append(ok)
            return checked

        def expand(nodes: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
            """One head step over the whole frontier: tensors throughout, no per-node Python."""
            visible, level = rows.place(nodes, parents, len(self.cache))
            fed = torch.where((parents < 0)[:, None], root, states[parents.clamp(min=0)])
            positions = torch.full((nodes.numel(),), base + level - 1, device=device)
            produced = self._draft_step(fed, self.vocab_ids[tokens], positions, visible)
            states[nodes] = produced.to(states.dtype)
            return logprobs(self.head.logits(produced))

        root_logprobs = logprobs(self.head.logits(root[0]))
        tree = grow_tree(root_logprobs, expand, self.shape.topk, depth, self.shape.tokens)
        if not bool(torch.stack(finite).all()):  # after cut_tree's own transfer: no extra stall
            return self.give_up(self.who, self.target_device)
        return DraftTree(self.vocab_ids[tree.tokens].to(self.target_device), tree.parents, searched=depth)
