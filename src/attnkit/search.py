"""Greedy and batched beam search over ``decoder.step`` (any decoder family: :class:`attnkit.interfaces.Decoder`).

Legend: B sentences (or images), K beam size, A sentences still searching,
L memory length, V target vocabulary, T output length.

Both searches read only the :class:`EncoderOutput`, so they decode any
modality. Every hypothesis carries its attention weights, one row per output
step over the real memory positions, so any output can be plotted or scored.
When no hypothesis ends within the length limit the best unfinished one is
returned with ``finished=False``: search always gives an answer.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.config import widened_beam
from attnkit.interfaces import Decoder, EncoderOutput


@dataclass(frozen=True)
class Hypothesis:
    tokens: list[int]  # output ids, without <bos> and <eos>
    score: float  # log_prob / length penalty: what ranks hypotheses
    log_prob: float  # sum of token log-probabilities (including <eos> when finished)
    attention: Tensor  # (T, L_real) one row per output step (T = len(tokens) + 1 when finished)
    finished: bool  # ended with <eos>; False when stopped by the length limit


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + |Y|) / 6) ** alpha (Wu et al. 2016); alpha 0 leaves raw log-probabilities."""
    return ((5.0 + length) / 6.0) ** alpha


def max_steps(encoded: EncoderOutput, ratio: float, offset: int) -> Tensor:
    """Per-example output length limit: ratio * (real memory positions) + offset, at least 1. (B,)"""
    real = encoded.mask.sum(1).cpu().double()  # (B,) on the CPU: not every device has float64 (MPS)
    # The tolerance: 2.1 x 30 is 62.999... in binary, and the limit the user means is 63 (float64 alone keeps such cases).
    return (ratio * real + offset + 1e-6).floor().clamp(min=1).long()


def _limits(encoded: EncoderOutput, max_length: int | Tensor) -> Tensor:
    if isinstance(max_length, int):
        return torch.full((encoded.batch_size,), max(1, max_length), dtype=torch.long)
    return max_length.cpu().long().clamp(min=1)


def _crop(attention: Tensor, mask: Tensor) -> Tensor:
    """Attention rows (T, L) on the CPU -> their real memory positions (T, L_real)."""
    return attention[:, mask]  # (T, L_real)


@torch.no_grad()
def greedy_search(
    decoder: Decoder, encoded: EncoderOutput, bos: int, eos: int, max_length: int | Tensor, alpha: float = 0.0, never: Sequence[int] = ()
) -> list[Hypothesis]:
    """Pick the most probable word at each step, for the whole batch at once (never a word in ``never``)."""
    batch = encoded.batch_size
    limits = _limits(encoded, max_length)
    state = decoder.init_state(encoded)
    previous = torch.full((batch,), bos, dtype=torch.long, device=encoded.memory.device)
    never_ids = _never_ids(never, encoded.memory.device)
    tokens, attention, log_probs = [], [], []
    running = torch.ones(batch, dtype=torch.bool)
    lengths = torch.zeros(batch, dtype=torch.long)  # output steps taken, <eos> included
    ended = torch.zeros(batch, dtype=torch.bool)
    for t in range(int(limits.max())):
        out = decoder.step(previous, state)
        state = out.state
        best_log_prob, best = torch.log_softmax(_without(out.logits, never_ids), -1).max(-1)  # (B,), (B,)
        tokens.append(best.cpu())  # the step's one device->host copy: has every sentence ended?
        attention.append(out.attention)
        log_probs.append(best_log_prob)
        lengths += running.long()
        ended |= running & (tokens[-1] == eos)
        running &= (tokens[-1] != eos) & (t + 1 < limits)
        if not running.any():
            break
        previous = best
    tokens_bt = torch.stack(tokens, 1)  # (B, T)
    attention_bt = torch.stack(attention, 1).float().cpu()  # (B, T, L)
    log_probs_bt = torch.stack(log_probs, 1).cpu()  # (B, T)
    mask = encoded.mask.cpu()
    hypotheses = []
    for i in range(batch):
        n = int(lengths[i])
        finished = bool(ended[i])
        log_prob = float(log_probs_bt[i, :n].sum())
        hypotheses.append(
            Hypothesis(
                tokens=tokens_bt[i, : n - finished].tolist(),
                score=log_prob / length_penalty(n, alpha),
                log_prob=log_prob,
                attention=_crop(attention_bt[i, :n], mask[i]),
                finished=finished,
            )
        )
    return hypotheses


@torch.no_grad()
def beam_search(
    decoder: Decoder,
    encoded: EncoderOutput,
    bos: int,
    eos: int,
    beam_size: int,
    max_length: int | Tensor,
    alpha: float = 1.0,
    n_best: int = 1,
    never: Sequence[int] = (),
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``n_best`` hypotheses of every example (never a word in ``never``): the finished
    ones best first, then, where fewer than ``n_best`` ended within the length limit, unfinished ones best first (their
    scores never paid for an <eos>, so they rank after every finished one whatever their score).

    Each step ranks the 2K best continuations of every sentence: those that end
    in <eos> within the first K ranks are finished, the K best others live on. A
    sentence stops once no live hypothesis can enter its ``n_best`` best finished
    ones any more (or at its length limit), and leaves the batch so later steps
    cost less. Stopping at K finished hypotheses instead would let an
    overconfident model end on K short, unlikely hypotheses (each <eos> ranked just
    behind a near-certain live word) while the best one is still growing.

    The rule is exact with a length penalty too: a live hypothesis's
    log-probability only falls as words are added, but its score (log_prob /
    length penalty) can rise as the penalty grows, so the best live hypothesis is
    bounded by its log-probability over the penalty at the sentence's length limit
    (log-probabilities are <= 0, so the largest penalty gives the best score it can
    still reach). With raw log-probabilities (``alpha`` 0) the bound is its score.

    Each step keeps only what it adds (the words chosen, their parent rows, the
    attention rows); the chosen hypotheses are rebuilt from these backpointers at
    the end, so a step costs the same at any length (no O(T) history copy). The
    host reads each step's outcome through one device->host copy.
    """
    if not 1 <= n_best <= beam_size:
        raise ValueError(f"n_best must be between 1 and the beam size ({beam_size}), got {n_best}")
    batch, k = encoded.batch_size, beam_size
    device = encoded.memory.device
    limits = _limits(encoded, max_length)
    limit_list = limits.tolist()
    state = decoder.init_state(encoded).expand_beams(k)  # B*K rows over B sources
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # (B, K) only the first beam is live before the first step
    previous = torch.full((batch * k,), bos, dtype=torch.long, device=device)
    never_ids = _never_ids(never, device)
    active = list(range(batch))  # sentence ids in the rows of the state, K rows each
    # Per step t, on the host: for every row of step t+1, its input word and its parent row in step t's batch
    # (sentences leave between steps, so row numbers are per step); on the device: the attention of step t's rows.
    inputs: list[Tensor] = []  # (A_{t+1}*K,) each
    parents: list[Tensor] = []  # (A_{t+1}*K,) each
    step_attention: list[Tensor] = []  # (A_t*K, L) each
    endings: list[list[_Ending]] = [[] for _ in range(batch)]  # finished hypotheses, in the order they ended
    unfinished: list[list[_Ending]] = [[] for _ in range(batch)]
    best_finished: list[list[float]] = [[] for _ in range(batch)]  # min-heaps of the n_best best finished scores

    for t in range(int(limits.max())):
        out = decoder.step(previous, state)
        step_attention.append(out.attention)
        log_probs = torch.log_softmax(_without(out.logits, never_ids), -1)  # (A*K, V)
        vocab = log_probs.shape[-1]
        candidates = (scores.view(-1, 1) + log_probs).view(len(active), k * vocab)  # (A, K*V)
        top_scores, top_ids = candidates.topk(2 * k, dim=1)  # (A, 2K)
        origin = top_ids // vocab  # (A, 2K) beam each candidate extends
        words = top_ids % vocab  # (A, 2K)
        # The K best candidates that do not end: sort key pushes <eos> candidates behind all others.
        rank = torch.arange(2 * k, device=device).expand_as(words)
        alive = (rank + (words == eos) * 2 * k).topk(k, dim=1, largest=False).indices.sort(dim=1).values  # (A, K)
        alive_scores = top_scores.gather(1, alive)  # (A, K)
        alive_origin = origin.gather(1, alive)
        alive_words = words.gather(1, alive)

        # The step's one device->host copy; the bookkeeping below runs on the host.
        h_scores, h_words, h_origin, h_alive_scores, h_alive_words, h_alive_origin = _to_host(
            top_scores[:, :k], words[:, :k], origin[:, :k], alive_scores, alive_words, alive_origin
        )  # (A, K) each
        end_a, end_r = ((h_words == eos) & (h_scores > float("-inf"))).nonzero().unbind(1)  # (E,) each: those within the K best
        end_rows = (end_a * k + h_origin[end_a, end_r]).tolist()  # their parents' rows
        for a, log_prob, row in zip(end_a.tolist(), h_scores[end_a, end_r].tolist(), end_rows):
            sentence = active[a]
            ending = _Ending(log_prob / length_penalty(t + 1, alpha), log_prob, t, row, eos, True)
            endings[sentence].append(ending)
            heapq.heappush(best_finished[sentence], ending.score)
            if len(best_finished[sentence]) > n_best:
                heapq.heappop(best_finished[sentence])
        live_scores, live_words, live_origin = h_alive_scores.tolist(), h_alive_words.tolist(), h_alive_origin.tolist()
        keep = []
        for a, sentence in enumerate(active):
            limit = limit_list[sentence]
            if t + 1 >= limit:
                if len(best_finished[sentence]) < n_best:
                    penalty = length_penalty(t + 1, alpha)
                    for log_prob, word, beam in zip(live_scores[a], live_words[a], live_origin[a]):
                        if log_prob > float("-inf"):
                            unfinished[sentence].append(_Ending(log_prob / penalty, log_prob, t, a * k + beam, word, False))
                continue
            # Rank 0 is the best live hypothesis; the largest penalty it can still reach bounds its score.
            bound = live_scores[a][0] / max(length_penalty(t + 2, alpha), length_penalty(limit, alpha))
            if not _settled(best_finished[sentence], n_best, bound):
                keep.append(a)
        if not keep:
            break
        h_keep = torch.tensor(keep)
        inputs.append(h_alive_words[h_keep].view(-1))  # (A'*K,)
        parents.append((h_keep.unsqueeze(1) * k + h_alive_origin[h_keep]).view(-1))  # (A'*K,) rows of step t
        keep_index = h_keep.to(device)  # a few ids the other way; the device has nothing queued to wait for here
        rows = (keep_index.unsqueeze(1) * k + alive_origin[keep_index]).view(-1)  # (A'*K,) parents of the surviving beams
        state = out.state.select_beams(rows, keep_index)
        scores = alive_scores[keep_index]  # (A', K)
        previous = alive_words[keep_index].view(-1)  # (A'*K,)
        active = [active[a] for a in keep]

    chosen = []
    for sentence in range(batch):
        ranked = sorted(endings[sentence], key=lambda e: -e.score)[:n_best]
        if len(ranked) < n_best:
            ranked += sorted(unfinished[sentence], key=lambda e: -e.score)[: n_best - len(ranked)]
        chosen.append(ranked)
    return _rebuild(chosen, inputs, parents, step_attention, encoded.mask)


@dataclass(frozen=True)
class _Ending:
    """Where a hypothesis left the beam: enough to rebuild it from the backpointers if it is chosen."""

    score: float
    log_prob: float
    step: int  # t: the hypothesis took t + 1 output steps
    row: int  # its row in step t's batch
    word: int  # the word it took at step t (<eos> when finished)
    finished: bool


def _settled(best_finished: list[float], n_best: int, bound: float) -> bool:
    """Can no live hypothesis (scores at most ``bound``) enter the ``n_best`` finished ones (a min-heap of their scores) any more?"""
    return len(best_finished) >= n_best and best_finished[0] >= bound


def _to_host(*tensors: Tensor) -> list[Tensor]:
    """(A, n_i) tensors on the CPU through one device->host copy: float64 holds float32 scores and ids below 2**53 exactly."""
    if tensors[0].device.type == "cpu":
        return list(tensors)
    host = torch.cat([x.double() for x in tensors], 1).cpu()  # (A, sum n_i)
    return [part.to(x.dtype) for part, x in zip(host.split([x.shape[1] for x in tensors], 1), tensors)]


def _rebuild(
    chosen: list[list[_Ending]], inputs: list[Tensor], parents: list[Tensor], step_attention: list[Tensor], mask: Tensor
) -> list[list[Hypothesis]]:
    """The chosen hypotheses of every sentence, their tokens and attention rows found by following the backpointers."""
    flat = [ending for ranked in chosen for ending in ranked]
    if not flat:
        return [[] for _ in chosen]
    # Number the rows of all steps one after the other; step 0's rows (all <bos>) are their own parents.
    sizes = [attention.shape[0] for attention in step_attention]
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    parent = torch.cat([torch.arange(sizes[0])] + [p + offsets[s] for s, p in enumerate(parents)])  # (rows,)
    word = torch.cat([torch.zeros(sizes[0], dtype=torch.long)] + inputs)  # (rows,) input word of each row
    current = torch.tensor([offsets[e.step] + e.row for e in flat])  # (H,)
    steps = [e.step + 1 for e in flat]
    backwards = torch.empty(len(flat), max(steps), dtype=torch.long)  # (H, T) column i: the row i steps before the end
    for i in range(max(steps)):
        backwards[:, i] = current
        current = parent[current]
    paths = [backwards[h, :n].flip(0) for h, n in enumerate(steps)]  # (T_h,) rows from the first step on
    index = torch.cat(paths).to(step_attention[0].device)
    attention = torch.cat(step_attention).index_select(0, index).float().cpu().split(steps)  # (T_h, L) each
    mask = mask.cpu()
    results, h = [], 0
    for sentence, ranked in enumerate(chosen):
        hypotheses = []
        for ending in ranked:
            tokens = word[paths[h][1:]].tolist() + ([] if ending.finished else [ending.word])
            hypotheses.append(Hypothesis(tokens, ending.score, ending.log_prob, _crop(attention[h], mask[sentence]), ending.finished))
            h += 1
        results.append(hypotheses)
    return results


def search(
    decoder: Decoder, encoded: EncoderOutput, bos: int, eos: int, config, beam_size: int | None = None, n_best: int = 1, never: Sequence[int] = ()
) -> list[list[Hypothesis]]:
    """The ``n_best`` hypotheses of every example as ``config`` (a SearchConfig) says: greedy for beam 1, else beam search.
    ``never``: ids no output may hold (<pad>, <bos>: an untrained model may rank them first, and an output word
    that is none would leave an attention row without its word). With no ``beam_size``, the config's beam is widened
    to ``n_best`` (a beam of K keeps at most K outputs), as the commands' ``--n-best`` widens it."""
    beam = widened_beam(beam_size, config.beam_size, n_best)
    limits = max_steps(encoded, config.max_length_ratio, config.max_length_offset)
    if beam == 1 and n_best == 1:
        return [[h] for h in greedy_search(decoder, encoded, bos, eos, limits, config.length_penalty, never)]
    return beam_search(decoder, encoded, bos, eos, beam, limits, config.length_penalty, n_best, never)


@dataclass(frozen=True)
class Samples:
    """Captions (or translations) drawn from the decoder's own distribution, ``per_source`` consecutive rows per source."""

    tokens: Tensor  # (B*S, T) each sample's words, its <eos> included when it ended, <pad> after
    log_probs: Tensor  # (B*S, T) log p of each sampled word (0 past the end), with gradients when the decoder has them
    lengths: Tensor  # (B*S,) words per sample, <eos> included
    per_source: int
    attention: Tensor  # (B*S, T, L) each step's attention (past the end: rows that no loss may read)
    memory_mask: Tensor  # (B*S, L) the real memory positions of each sample's source

    @property
    def is_word(self) -> Tensor:
        """(B*S, T) the steps that drew a word (its <eos> included)."""
        return torch.arange(self.tokens.shape[1], device=self.tokens.device) < self.lengths.unsqueeze(1)

    def words(self, eos: int) -> list[list[int]]:
        """Each sample's word ids without <eos> and <pad> (on the host)."""
        return [row[: n - int(n > 0 and row[n - 1] == eos)] for row, n in zip(self.tokens.tolist(), self.lengths.tolist())]


@dataclass(frozen=True)
class Sampling:
    """What :func:`sample` needs beside the decoder and its memory: how a model's ``forward`` is asked to sample."""

    bos: int
    eos: int
    pad: int
    max_length: int
    per_source: int = 1
    never: tuple[int, ...] = ()


def sample(
    decoder: Decoder,
    encoded: EncoderOutput,
    bos: int,
    eos: int,
    pad: int,
    max_length: int | Tensor,
    per_source: int = 1,
    never: Sequence[int] = (),
    generator: torch.Generator | None = None,
) -> Samples:
    """``per_source`` outputs per source, each word drawn from the step's softmax (never a word in ``never``), for
    policy-gradient training (self-critical sequence training: Rennie et al. 2017). Runs with gradients: the summed
    ``log_probs`` of a sample is log p(sample), differentiable through the decoder and the encoder's output. A sample
    that has ended keeps stepping with <pad> (its words and log-probs are masked) until every sample has ended or
    reached its source's length limit."""
    rows = encoded.batch_size * per_source
    device = encoded.memory.device
    limits = _limits(encoded, max_length).repeat_interleave(per_source).to(device)  # (B*S,)
    state = decoder.init_state(encoded).expand_beams(per_source)  # B*S rows
    previous = torch.full((rows,), bos, dtype=torch.long, device=device)
    never_ids = _never_ids(sorted({*never, pad}), device)  # <pad> marks the end below: it is never drawn
    running = torch.ones(rows, dtype=torch.bool, device=device)
    tokens, log_probs, attention = [], [], []
    for t in range(int(limits.max())):
        out = decoder.step(previous, state)
        state = out.state
        attention.append(out.attention)
        step_log_probs = torch.log_softmax(_without(out.logits, never_ids), -1)  # (B*S, V)
        drawn = torch.multinomial(step_log_probs.detach().exp(), 1, generator=generator).squeeze(1)  # (B*S,)
        drawn = torch.where(running, drawn, torch.full_like(drawn, pad))
        tokens.append(drawn)
        drawn_log_prob = step_log_probs.gather(1, drawn.unsqueeze(1)).squeeze(1)  # (B*S,); -inf for <pad>
        log_probs.append(torch.where(running, drawn_log_prob, torch.zeros_like(drawn_log_prob)))  # 0 once ended
        running = running & (drawn != eos) & (t + 1 < limits)
        if not bool(running.any()):  # one host read a step, as greedy search makes
            break
        previous = drawn
    tokens_bt = torch.stack(tokens, 1)  # (B*S, T)
    lengths = (tokens_bt != pad).sum(1)  # words up to and including <eos>
    memory_mask = encoded.mask.repeat_interleave(per_source, 0)  # (B*S, L)
    return Samples(tokens_bt, torch.stack(log_probs, 1), lengths, per_source, torch.stack(attention, 1), memory_mask)


def _never_ids(never: Sequence[int], device: torch.device) -> Tensor | None:
    return torch.tensor(list(never), dtype=torch.long, device=device) if never else None  # made once per search: no copy per step


def _without(logits: Tensor, never: Tensor | None) -> Tensor:
    """The step's logits in fp32, those of the ids ``never`` at -inf."""
    logits = logits.float()
    return logits if never is None else logits.index_fill(-1, never, float("-inf"))
