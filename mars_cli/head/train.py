"""Training a draft head by self-distillation: `mars train-head`.

Two architectures. `eagle3` (the default): the EAGLE-3 head (eagle3.py), which reads the target's
low, middle and high features and scores its own draft vocabulary (the most frequent tokens of
the training data, d2t built from them); its loss is the cross-entropy between the target's
distribution (its logits at the next position, restricted to the draft vocabulary) and the head's,
at every step of the training-time test, weighted 0.8^(d-1) as in EAGLE-3. `eagle1`: the original
single-file head (model.DraftHead), which predicts the target's last hidden state: smooth L1 on
that feature plus 0.1 x the same cross-entropy through the target's own LM-head rows.

Training-time test: each step also unrolls `depth` drafting steps (PairHead.unrolled), so the head
learns to draft from its own predictions, as it must at positions 2..k of a round.

Every tenth prompt is held out; the held-out acceptance figure at the end is measured the way
drafting works (greedy chains of k drafts from true features), on the target's own answers, so
it predicts the acceptance of strict greedy decoding.
"""

from __future__ import annotations

import math
import os
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ..errors import UserError, require
from .. import models
from ..models import LoadedModel, cpu_computes_bfloat16
from ..prompts import is_held_out
from .data import HELD_OUT_EVERY, Sequence
from .eagle3 import Eagle3Config, Eagle3Head, default_aux_layers
from .model import DraftHead, HeadConfig
from .parts import PairHead

REGRESSION_WEIGHT = 1.0
CLASSIFICATION_WEIGHT = 0.1
STEP_DECAY = 0.8  # EAGLE-3: the loss of unrolled step d weighs 0.8^(d-1)
ARCHITECTURES = ("eagle3", "eagle1")
# soft: cross-entropy against the target's whole distribution over the draft vocabulary
# (distillation, as EAGLE-3 and HASS train); hard: against its top token there (a one-hot label)
LOSSES = ("soft", "hard")
# compiling the training step takes 1-3 minutes on a 2-core CPU and saves about a third of each
# step there (docs/head.md): below this many steps it is not won back
COMPILE_MIN_STEPS = 200


def feature_layers(architecture: str, target_model: torch.nn.Module) -> tuple[int, ...]:
    """The hidden_states entries training data keeps: what the head reads, then (eagle3) the final
    normed state, from which the target's next-token distribution (the label) is computed."""
    if architecture == "eagle3":
        return (*default_aux_layers(models.num_layers(target_model)), -1)
    return (-1,)


@dataclass
class TrainSettings:
    architecture: str = "eagle3"
    epochs: int = 8
    batch_size: int = 8
    learning_rate: float = 1e-3
    depth: int = 3
    loss: str = "soft"  # one of LOSSES
    vocab: int = 8192  # 0: the full vocabulary
    max_length: int = 512
    num_draft: int = 4  # chain length for the held-out acceptance figure
    seed: int = 0
    checkpoint_every: int = 50
    bfloat16: str = "auto"  # autocast the training steps: auto (where the CPU computes it), on, off
    compile: str = "auto"  # torch.compile the loss: auto (runs of COMPILE_MIN_STEPS or more), on, off


@dataclass
class HeldOut:
    """Greedy chain acceptance on held-out answers: what strict decoding would accept."""

    rounds: int = 0
    per_position: list[float] = field(default_factory=list)  # P(draft d accepted | d-1 accepted)
    mean_accepted: float = 0.0
    coverage: float = 0.0  # share of answer tokens inside the head's vocabulary subset
    divergence: float = 0.0  # mean KL(target || head) of the first draft over the draft vocabulary, nats
    decoding_rounds: int = 0  # the rounds strict greedy decoding of these answers would run
    decoding_tokens: int = 0  # the answer tokens those rounds emit

    @property
    def tau(self) -> float:
        """Tokens a round from an average answer position (chains start at every position)."""
        return 1.0 + self.mean_accepted

    @property
    def decoding_tau(self) -> float:
        """Tokens a round as decoding runs them: a round starts where the last one stopped, that is
        just after a draft the target rejected, a harder place than the average position; what
        `mars eval` reports for a k-chain in float32 strict greedy, on the same answers."""
        return self.decoding_tokens / self.decoding_rounds if self.decoding_rounds else 0.0


def split(sequences: list[Sequence]) -> tuple[list[Sequence], list[Sequence]]:
    """(training, held-out) answers: the answer to every HELD_OUT_EVERY-th prompt is held out."""
    held = [s for s in sequences if is_held_out(s.index, HELD_OUT_EVERY)]
    return [s for s in sequences if not is_held_out(s.index, HELD_OUT_EVERY)], held


def vocabulary_subset(sequences: list[Sequence], size: int, always: set[int], vocab_size: int) -> torch.Tensor:
    """The `size` most frequent tokens of the training text (ties by id), EOS always in; the
    whole vocabulary (identity mapping) when `size` covers it."""
    if size >= vocab_size:
        return torch.arange(vocab_size)
    counts = Counter(token for s in sequences for token in s.ids)
    ranked = [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    chosen = [t for t in sorted(always) if t < vocab_size]
    chosen += [t for t in ranked if t not in chosen]
    return torch.tensor(chosen[: min(size, vocab_size)], dtype=torch.long)


def make_batch(batch: list[Sequence], features: dict[int, torch.Tensor], max_length: int,
               device: torch.device | str = "cpu"):
    """Padded [B, T] tokens, [B, T, H] features, [B, T] validity, [B, T] answer mask, on `device`
    (the head's: features cached on the CPU train a head on a GPU)."""
    width = min(max_length, max(len(s.ids) for s in batch))
    hidden = features[batch[0].index].shape[-1]
    tokens = torch.zeros(len(batch), width, dtype=torch.long, device=device)
    feats = torch.zeros(len(batch), width, hidden, device=device)
    valid = torch.zeros(len(batch), width, dtype=torch.bool, device=device)
    answer = torch.zeros(len(batch), width, dtype=torch.bool, device=device)
    for row, sequence in enumerate(batch):
        n = min(width, len(sequence.ids))
        tokens[row, :n] = torch.tensor(sequence.ids[:n])
        feats[row, :n] = features[sequence.index][:n].float()
        valid[row, :n] = True
        answer[row, len(sequence.prompt_ids) : n] = True
    return tokens, feats, valid, answer


def head_loss(head: PairHead, tokens, feats, valid, depth: int,
              target_rows: torch.Tensor | None = None, loss: str = "soft") -> tuple[torch.Tensor, dict[str, float]]:
    """Pairs (f_p, x_{p+1}) predict the target's distribution at p + 1 (read from its final
    state there; `target_rows` are its LM-head rows of the head's vocabulary, eagle3) and, for an
    eagle1 head, the final state itself. `loss` "hard" replaces that distribution by its top
    token (see LOSSES)."""
    width, eagle3 = head.feature_width, isinstance(head, Eagle3Head)
    # a feature row is [what the head reads | the target's final state] (eagle3) or that state alone
    final = feats[:, 1:, width:] if eagle3 else feats[:, 1:, :width]
    inputs, next_tokens = feats[:, :-1, :width], tokens[:, 1:]
    pair_valid = valid[:, 1:]
    # the vocabulary-wide work (scores, softmax) runs on the valid pairs only: padding is up to
    # half of a batch of answers, and those rows dominate a training step's cost
    final_rows = final[pair_valid]  # [N, H]
    with torch.no_grad():
        target_logits = final_rows @ target_rows.T if eagle3 else head.logits(final_rows)
        labels = target_logits.argmax(-1) if loss == "hard" else torch.softmax(target_logits, dim=-1)
    total, weights = torch.zeros(()), 0.0
    parts = {}
    for d, predicted in enumerate(head.unrolled(inputs, next_tokens, depth), start=1):
        mask = pair_valid.clone()
        mask[:, : d - 1] = False  # pass d drafts from position d - 1 on
        keep = mask[pair_valid]  # the same pairs among the valid ones
        if not bool(keep.any()):
            cross = regression = predicted.sum() * 0.0  # nothing to score at this depth (short batch)
        else:
            rows = predicted[mask]
            # soft labels: cross-entropy against the target's probabilities (entropy included)
            cross = F.cross_entropy(head.logits(rows), labels[keep])
            regression = None if eagle3 else F.smooth_l1_loss(rows, final_rows[keep], reduction="none").mean(-1).mean()
        if eagle3:
            scale = STEP_DECAY ** (d - 1)
            total, weights = total + scale * cross, weights + scale
        else:
            total, weights = total + REGRESSION_WEIGHT * regression + CLASSIFICATION_WEIGHT * cross, weights + 1.0
        parts[f"ce{d}"] = float(cross.detach())
    return total / weights, parts


def loss_function(choice: str, steps: int, device: torch.device) -> Callable:
    """`head_loss`, compiled (`torch.compile`, shapes dynamic: batches differ in length) when
    `choice` is on, or auto for a run of at least COMPILE_MIN_STEPS `steps`. Compiling fuses the
    loss's elementwise work over [positions, draft vocabulary] (softmax, cross-entropy, their
    gradients), which outweighs the matrix products of a step on a CPU. `on` where torch cannot
    compile is a UserError; `auto` then stays eager."""
    from ..decoding.target import COMPILE_CHOICES, compile_unavailable

    require(choice in COMPILE_CHOICES, f"--compile {choice}: expected auto, on or off")
    if choice == "off" or (choice == "auto" and steps < COMPILE_MIN_STEPS):
        return head_loss
    problem = compile_unavailable(device)
    if problem is not None:
        require(choice != "on", f"--compile on: {problem}")
        return head_loss
    return torch.compile(head_loss, dynamic=True)


@torch.no_grad()
def held_out_acceptance(head: PairHead, sequences: list[Sequence], features: dict[int, torch.Tensor],
                        k: int, max_length: int, batch_size: int = 8) -> HeldOut:
    """Chains of k greedy drafts from every answer position, scored against the target's own
    greedy answer (the data), exactly as strict greedy verification scores them; and the rounds
    decoding would run through each answer (after prefill's first token, each round advancing by
    its accepted drafts plus one)."""
    accepted_at = [0] * k
    rounds = decoding_rounds = decoding_tokens = 0
    covered = total_answer = 0
    subset = set(head.vocab_ids.tolist())
    device = next(head.parameters()).device
    for start in range(0, len(sequences), batch_size):
        tokens, feats, valid, answer = make_batch(sequences[start : start + batch_size], features, max_length, device)
        outputs = head.unrolled(feats[:, :-1, : head.feature_width], tokens[:, 1:], k)
        # pass e at pair i drafts the token at position i + 2; scored below as Python lists
        # (one host copy a batch, not a tensor read a position)
        drafted = [head.vocab_ids[head.logits(o).argmax(-1)].tolist() for o in outputs]  # each [B][T-1]
        rows, lengths, starts = tokens.tolist(), valid.sum(-1).tolist(), answer.float().argmax(-1).tolist()
        has_answer = answer.any(-1).tolist()
        for row in range(len(rows)):
            n, truth = int(lengths[row]), rows[row]
            answer_start = int(starts[row]) if has_answer[row] else n
            covered += sum(1 for t in truth[answer_start:n] if t in subset)
            total_answer += n - answer_start
            def accepted(m: int) -> int:
                """Drafts a round accepts after true pairs up to m (it drafts positions m+2 ..)."""
                for e in range(1, k + 1):
                    i = m + e - 1
                    if i + 2 >= n or drafted[e - 1][row][i] != truth[i + 2]:
                        return e - 1
                return k

            for m in range(max(0, answer_start - 2), n - k - 1):
                rounds += 1
                for e in range(accepted(m)):
                    accepted_at[e] += 1
            m = answer_start - 1  # prefill emitted the answer's first token
            while m + 2 < n:
                gained = accepted(m) + 1
                decoding_rounds += 1
                decoding_tokens += min(gained, n - m - 2)  # the bonus token of the last round may lie past the end
                m += gained
    per_position = []
    for d in range(k):
        before = rounds if d == 0 else accepted_at[d - 1]
        per_position.append(accepted_at[d] / before if before else 0.0)
    return HeldOut(rounds=rounds, per_position=per_position,
                   mean_accepted=sum(accepted_at) / rounds if rounds else 0.0,
                   coverage=covered / total_answer if total_answer else 0.0,
                   decoding_rounds=decoding_rounds, decoding_tokens=decoding_tokens)


@torch.no_grad()
def held_out_divergence(head: PairHead, sequences: list[Sequence], features: dict[int, torch.Tensor],
                        max_length: int, target_rows: torch.Tensor | None = None, batch_size: int = 8) -> float:
    """Mean KL(target || head) in nats at every answer position, for the first draft (true
    features), both restricted to the draft vocabulary: a smooth companion of the acceptance
    figure that sees the whole distribution, not only its argmax. The target's distribution comes
    from its final state stored after the head's features (eagle3, with `target_rows` its LM-head
    rows of the draft vocabulary) or from the head's own scoring of that state (eagle1)."""
    width, eagle3 = head.feature_width, isinstance(head, Eagle3Head)
    total, count = 0.0, 0
    device = next(head.parameters()).device
    for start in range(0, len(sequences), batch_size):
        tokens, feats, valid, answer = make_batch(sequences[start : start + batch_size], features, max_length, device)
        final = feats[:, 1:, width:] if eagle3 else feats[:, 1:, :width]
        target_logp = torch.log_softmax(final @ target_rows.T if eagle3 else head.logits(final), dim=-1)
        (predicted,) = head.unrolled(feats[:, :-1, :width], tokens[:, 1:], 1)
        head_logp = torch.log_softmax(head.logits(predicted), dim=-1)
        kl = (target_logp.exp() * (target_logp - head_logp)).sum(-1)
        scored = answer[:, 1:] & valid[:, 1:]  # pair p predicts position p + 1, an answer token
        total += float(kl[scored].sum())
        count += int(scored.sum())
    return total / count if count else 0.0


def learning_rate(step: int, total: int, peak: float) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _save_checkpoint(path: Path, head: PairHead, optimizer, step: int, losses: list[float],
                     options: dict | None = None) -> None:
    """The training state, with the options it was made under (`options`: flag -> value) so that
    --resume can refuse other ones instead of mixing them in."""
    from ..paths import saving

    temporary = path.with_name(path.name + ".tmp")
    with saving(path, temporary):
        torch.save({"step": step, "head": head.state_dict(), "optimizer": optimizer.state_dict(), "losses": losses,
                    **({"options": options} if options is not None else {})}, temporary)
    os.replace(temporary, path)


def load_checkpoint(path: Path, options: dict | None = None) -> dict:
    """The state `_save_checkpoint` wrote, refused in one sentence when it is missing, unreadable,
    or was made under other options than `options` (flag -> value): a different --vocab gave a
    size-mismatch traceback, a different --lr was mixed in under a recipe that did not say so."""
    require(path.is_file(), f"nothing to resume: there is no checkpoint {path} (an interrupted train-head leaves "
                            "one beside --out); rerun without --resume")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises pickle, zip and runtime errors alike for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot read the checkpoint {path} ({first[:120]}); rerun without --resume") from None
    require(isinstance(state, dict) and {"step", "head", "optimizer", "losses"} <= state.keys(),
            f"{path} is not a train-head checkpoint; rerun without --resume")
    if options is not None:
        recorded = state.get("options")
        require(isinstance(recorded, dict), f"the checkpoint {path} does not record its options (an older mars made "
                                            "it), so --resume cannot check them; rerun without --resume")
        for flag, value in options.items():
            require(recorded.get(flag) == value,
                    f"--resume: {flag} differs from the interrupted run ({recorded.get(flag)!r} there, {value!r} "
                    "now); use the same value, or rerun without --resume")
    return state


def train(target: LoadedModel, sequences: list[Sequence], features: dict[int, torch.Tensor],
          settings: TrainSettings, checkpoint: Path, resume: bool, recipe: dict,
          progress: Callable[[int, int, float], None] | None = None,
          options: dict | None = None, initial: PairHead | None = None) -> tuple[PairHead, HeldOut, list[float]]:
    """Train on all but the held-out prompts; returns the head (weights rounded to fp16, as they
    are saved), its held-out acceptance and the loss of every step. `options` (flag -> value) is
    recorded in the checkpoint and, with `resume`, must match the one recorded there. `initial`
    (an EAGLE-3 head for this target): start from its weights and draft vocabulary (fine-tuning)
    instead of a fresh head."""
    require(settings.depth >= 1 and settings.epochs >= 1 and settings.batch_size >= 1,
            "--depth, --epochs and --batch-size must be at least 1")
    train_set, held_set = split(sequences)
    require(len(train_set) >= 1 and len(held_set) >= 1,
            f"training needs at least {HELD_OUT_EVERY} prompts (every {HELD_OUT_EVERY}th is held out)")
    torch.manual_seed(settings.seed)
    width = target.vocab_size
    if initial is not None:
        require(settings.architecture == "eagle3" and isinstance(initial, Eagle3Head),
                "fine-tuning starts from an EAGLE-3 head, with --arch eagle3")
        vocab_ids = initial.vocab_ids.cpu()  # its draft vocabulary, whatever --vocab says
        require(bool((vocab_ids[1:] > vocab_ids[:-1]).all()), "the head to fine-tune must list its draft "
                                                               "vocabulary in ascending target ids (as ours do)")
    else:
        vocab_ids = vocabulary_subset(train_set, settings.vocab or width, target.eos_token_ids, width)
    record = {**recipe, "settings": asdict(settings)}
    hidden = target.hidden_size
    widths = {"eagle3": 4 * hidden, "eagle1": hidden}  # see feature_layers
    stored = next(iter(features.values())).shape[-1]
    require(stored == widths[settings.architecture],
            f"the training features are {stored} wide; an {settings.architecture} head needs {widths[settings.architecture]}")
    target_rows = None
    if settings.architecture == "eagle3":
        head = new_eagle3_head(target, torch.sort(vocab_ids).values, record)
        if initial is not None:
            require(initial.config.hidden_size == head.config.hidden_size
                    and initial.config.intermediate_size == head.config.intermediate_size,
                    "the head to fine-tune is not shaped like one layer of this target")
            head.load_state_dict({k: v.float() if v.is_floating_point() else v
                                  for k, v in initial.state_dict().items()})
        target_rows = target.model.get_output_embeddings().weight.detach()[head.vocab_ids.to(target.output_device)].float()
    else:
        config = HeadConfig.for_target(target.model, target=target.spec, target_fingerprint=target.fingerprint,
                                       recipe=record)
        head = DraftHead(config, vocab_ids).attach(target.model)
    # the head trains where the target's output rows are (a GPU when the target was loaded there)
    device = target.output_device
    head = head.to(device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=settings.learning_rate, betas=(0.9, 0.95),
                                  weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train_set) / settings.batch_size)
    total = steps_per_epoch * settings.epochs
    step, losses = 0, []
    if resume and (checkpoint.exists() or options is not None):
        state = load_checkpoint(checkpoint, options)
        try:
            head.load_state_dict(state["head"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:  # shapes of another head (another target)
            first = str(exc).strip().splitlines()[0]
            raise UserError(f"--resume: the checkpoint {checkpoint} holds another head ({first[:120]}); "
                            "rerun without --resume") from None
        step, losses = int(state["step"]), list(state["losses"])
    head.train()
    # bfloat16 matrix products where the processor computes them natively (AMX / AVX512-BF16):
    # about 3x faster training steps here; the weights and the optimizer stay float32
    # (on a GPU: where it computes bfloat16, as Ampere and later do)
    native = torch.cuda.is_bf16_supported() if device.type == "cuda" else cpu_computes_bfloat16()
    fast = settings.bfloat16 == "on" or (settings.bfloat16 == "auto" and native)
    compute_loss = loss_function(settings.compile, total - step, device)
    while step < total:
        epoch, offset = divmod(step, steps_per_epoch)
        order = list(range(len(train_set)))
        random.Random(settings.seed * 1000 + epoch).shuffle(order)
        picked = [train_set[i] for i in order[offset * settings.batch_size : (offset + 1) * settings.batch_size]]
        tokens, feats, valid, _ = make_batch(picked, features, settings.max_length, device)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total, settings.learning_rate)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=fast):  # fp32 weights and optimizer
            objective, _ = compute_loss(head, tokens, feats, valid, settings.depth, target_rows, settings.loss)
        optimizer.zero_grad(set_to_none=True)
        objective.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        losses.append(float(objective.detach()))
        # diverged: every later step, and the head saved at the end, would be NaN (the last
        # checkpoint written holds the weights before it)
        require(math.isfinite(losses[-1]), f"training diverged at step {step} of {total} (loss {losses[-1]}); "
                                           f"nothing saved: try a lower --lr (now {settings.learning_rate:g})")
        if progress:
            progress(step, total, losses[-1])
        if step % settings.checkpoint_every == 0 or step == total:
            _save_checkpoint(checkpoint, head, optimizer, step, losses, options)
    with torch.no_grad():  # what ships is fp16: measure exactly that
        for parameter in head.parameters():
            parameter.copy_(parameter.half().float())
    head.eval()
    # scored against greedy answers only: a sampled answer's tokens are not the target's argmax,
    # so chains drafted along it measure the sampling, not what strict greedy decoding accepts
    greedy_held = [s for s in held_set if s.mode == "greedy"] or held_set
    held = held_out_acceptance(head, greedy_held, features, settings.num_draft, settings.max_length)
    held.divergence = held_out_divergence(head, greedy_held, features, settings.max_length, target_rows)
    return head, held, losses


def new_eagle3_head(target: LoadedModel, draft_vocab: torch.Tensor, record: dict) -> Eagle3Head:
    """An EAGLE-3 head shaped like one layer of the target (its width, heads, MLP and RoPE, the
    latter written into the config so every loader agrees), its LM head and final norm started
    from the target's own rows and norm, its draft vocabulary `draft_vocab` (ascending ids)."""
    model, text, hidden = target.model, target.text_config, target.hidden_size
    heads = int(text.num_attention_heads)
    config = Eagle3Config(
        hidden_size=hidden, intermediate_size=int(text.intermediate_size), num_attention_heads=heads,
        num_key_value_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or hidden // heads), vocab_size=target.vocab_size,
        draft_vocab_size=int(draft_vocab.numel()), rms_norm_eps=float(getattr(text, "rms_norm_eps", 1e-6)),
        rope_theta=target.rope_theta, max_position_embeddings=int(getattr(text, "max_position_embeddings", 2048) or 2048),
        mars={"target": target.spec, "target_fingerprint": target.fingerprint, "recipe": record},
    )
    head = Eagle3Head(config)
    head.set_vocabulary(draft_vocab)
    with torch.no_grad():
        head.lm_head.weight.copy_(model.get_output_embeddings().weight.detach()[draft_vocab].float())
        final_norm = getattr(getattr(model, "model", model), "norm", None)
        if final_norm is not None and getattr(final_norm, "weight", None) is not None:
            head.norm.weight.copy_(final_norm.weight.detach().float())
    return head.attach(model)
