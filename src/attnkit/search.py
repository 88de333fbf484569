"""Greedy and batched beam search over :meth:`AttentionDecoder.step`.

Legend: B sentences (or images), K beam size, A sentences still searching,
L memory length, V target vocabulary, T output length.

Both searches read only the :class:`EncoderOutput`, so they decode any
modality. Every hypothesis carries its attention weights, one row per output
step over the real memory positions, so any output can be plotted or scored.
When no hypothesis ends within the length limit the best unfinished one is
returned with ``finished=False``: search always gives an answer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.decoder import AttentionDecoder
from attnkit.interfaces import EncoderOutput


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
    real = encoded.mask.sum(1).float()  # (B,)
    return (ratio * real + offset).floor().clamp(min=1).long().cpu()


def _limits(encoded: EncoderOutput, max_length: int | Tensor) -> Tensor:
    if isinstance(max_length, int):
        return torch.full((encoded.batch_size,), max(1, max_length), dtype=torch.long)
    return max_length.cpu().long().clamp(min=1)


def _crop(attention: Tensor, mask: Tensor) -> Tensor:
    return attention[:, mask].float().cpu()  # (T, L_real)


@torch.no_grad()
def greedy_search(
    decoder: AttentionDecoder, encoded: EncoderOutput, bos: int, eos: int, max_length: int | Tensor, alpha: float = 0.0
) -> list[Hypothesis]:
    """Pick the most probable word at each step, for the whole batch at once."""
    batch = encoded.batch_size
    limits = _limits(encoded, max_length)
    state = decoder.init_state(encoded)
    previous = torch.full((batch,), bos, dtype=torch.long, device=encoded.memory.device)
    tokens, attention, log_probs = [], [], []
    running = torch.ones(batch, dtype=torch.bool)
    lengths = torch.zeros(batch, dtype=torch.long)  # output steps taken, <eos> included
    ended = torch.zeros(batch, dtype=torch.bool)
    for t in range(int(limits.max())):
        out = decoder.step(previous, state)
        state = out.state
        best_log_prob, best = torch.log_softmax(out.logits.float(), -1).max(-1)  # (B,), (B,)
        tokens.append(best.cpu())
        attention.append(out.attention)
        log_probs.append(best_log_prob.cpu())
        lengths += running.long()
        ended |= running & (tokens[-1] == eos)
        running &= (tokens[-1] != eos) & (t + 1 < limits)
        if not running.any():
            break
        previous = best
    tokens_bt = torch.stack(tokens, 1)  # (B, T)
    attention_bt = torch.stack(attention, 1)  # (B, T, L)
    log_probs_bt = torch.stack(log_probs, 1)  # (B, T)
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
                attention=_crop(attention_bt[i, :n], encoded.mask[i]),
                finished=finished,
            )
        )
    return hypotheses


@torch.no_grad()
def beam_search(
    decoder: AttentionDecoder,
    encoded: EncoderOutput,
    bos: int,
    eos: int,
    beam_size: int,
    max_length: int | Tensor,
    alpha: float = 1.0,
    n_best: int = 1,
) -> list[list[Hypothesis]]:
    """Batched beam search; returns the ``n_best`` hypotheses of every example, best first.

    Each step ranks the 2K best continuations of every sentence: those that end
    in <eos> within the first K ranks are finished, the K best others live on. A
    sentence stops once its ``n_best`` best finished hypotheses all score at least
    as well as its best live one (or at its length limit), and leaves the batch so
    later steps cost less. Stopping at K finished hypotheses instead would let an
    overconfident model end on K short, unlikely hypotheses (each <eos> ranked just
    behind a near-certain live word) while the best one is still growing. With a
    length penalty (``alpha`` > 0) a live score can still rise, so the rule is the
    usual heuristic there; with raw log-probabilities it is exact.
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
    history = torch.zeros(batch * k, 0, dtype=torch.long, device=device)  # (B*K, t) words so far
    history_attention = encoded.memory.new_zeros(batch * k, 0, encoded.memory.shape[1])  # (B*K, t, L)
    active = list(range(batch))  # sentence ids in the rows of the state, K rows each
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    unfinished: list[list[Hypothesis]] = [[] for _ in range(batch)]

    for t in range(int(limits.max())):
        out = decoder.step(previous, state)
        log_probs = torch.log_softmax(out.logits.float(), -1)  # (A*K, V)
        vocab = log_probs.shape[-1]
        candidates = (scores.view(-1, 1) + log_probs).view(len(active), k * vocab)  # (A, K*V)
        top_scores, top_ids = candidates.topk(2 * k, dim=1)  # (A, 2K)
        origin = top_ids // vocab  # (A, 2K) beam each candidate extends
        words = top_ids % vocab  # (A, 2K)
        is_eos = words == eos
        # The K best candidates that do not end: sort key pushes <eos> candidates behind all others.
        rank = torch.arange(2 * k, device=device).expand_as(words)
        alive = (rank + is_eos * 2 * k).topk(k, dim=1, largest=False).indices.sort(dim=1).values  # (A, K)
        alive_scores = top_scores.gather(1, alive)  # (A, K)
        alive_origin = origin.gather(1, alive)
        alive_words = words.gather(1, alive)

        row_base = torch.arange(len(active), device=device).unsqueeze(1) * k  # (A, 1)
        parent_rows = (row_base + origin).view(-1)  # (A*2K,) rows of each candidate's parent
        step_attention = out.attention  # (A*K, L)

        # Few candidates end per step: find them on the device, collect them on the CPU.
        ends = (is_eos[:, :k] & (top_scores[:, :k] > float("-inf"))).nonzero().tolist()  # [(a, r), ...] within the K best
        if ends:
            cpu_scores, cpu_parent = top_scores.cpu(), parent_rows.view(len(active), 2 * k).cpu()
        for a, r in ends:
            row = int(cpu_parent[a, r])
            attention = torch.cat([history_attention[row], step_attention[row : row + 1]], 0)
            finished[active[a]].append(_hypothesis(history[row], float(cpu_scores[a, r]), attention, encoded.mask[active[a]], alpha, True))
        best_alive = (alive_scores[:, 0] / length_penalty(t + 1, alpha)).tolist()  # (A,) rank 0 is the best live one
        done = []
        for a, sentence in enumerate(active):
            at_limit = t + 1 >= limit_list[sentence]
            if at_limit and len(finished[sentence]) < n_best:
                for r in range(k):
                    if alive_scores[a, r] > float("-inf"):
                        row = int(row_base[a, 0] + alive_origin[a, r])
                        tokens = torch.cat([history[row], alive_words[a, r : r + 1]])
                        attention = torch.cat([history_attention[row], step_attention[row : row + 1]], 0)
                        unfinished[sentence].append(_hypothesis(tokens, float(alive_scores[a, r]), attention, encoded.mask[sentence], alpha, False))
            done.append(at_limit or _settled(finished[sentence], n_best, best_alive[a]))

        keep = [a for a, is_done in enumerate(done) if not is_done]
        if not keep:
            break
        keep_index = torch.tensor(keep, device=device)
        rows = (row_base[keep_index] + alive_origin[keep_index]).view(-1)  # (A'*K,) parents of the surviving beams
        history = torch.cat([history[rows], alive_words[keep_index].view(-1, 1)], 1)  # (A'*K, t+1)
        history_attention = torch.cat([history_attention[rows], step_attention[rows].unsqueeze(1)], 1)  # (A'*K, t+1, L)
        state = out.state.select_beams(rows, keep_index)
        scores = alive_scores[keep_index]  # (A', K)
        previous = alive_words[keep_index].view(-1)
        active = [active[a] for a in keep]

    results = []
    for sentence in range(batch):
        ranked = sorted(finished[sentence], key=lambda h: -h.score)[:n_best]
        if len(ranked) < n_best:
            ranked += sorted(unfinished[sentence], key=lambda h: -h.score)[: n_best - len(ranked)]
        results.append(ranked)
    return results


def _settled(finished: list[Hypothesis], n_best: int, best_alive: float) -> bool:
    """Can no live hypothesis (best score ``best_alive``) enter the ``n_best`` finished ones any more?"""
    if len(finished) < n_best:
        return False
    return sorted((h.score for h in finished), reverse=True)[n_best - 1] >= best_alive


def _hypothesis(tokens: Tensor, log_prob: float, attention: Tensor, mask: Tensor, alpha: float, finished: bool) -> Hypothesis:
    steps = attention.shape[0]
    return Hypothesis(
        tokens=tokens.tolist(),
        score=log_prob / length_penalty(steps, alpha),
        log_prob=log_prob,
        attention=_crop(attention, mask),
        finished=finished,
    )


def search(
    decoder: AttentionDecoder, encoded: EncoderOutput, bos: int, eos: int, config, beam_size: int | None = None, n_best: int = 1
) -> list[list[Hypothesis]]:
    """The ``n_best`` hypotheses of every example as ``config`` (a SearchConfig) says: greedy for beam 1, else beam search."""
    beam = beam_size or config.beam_size
    limits = max_steps(encoded, config.max_length_ratio, config.max_length_offset)
    if beam == 1 and n_best == 1:
        return [[h] for h in greedy_search(decoder, encoded, bos, eos, limits, config.length_penalty)]
    return beam_search(decoder, encoded, bos, eos, beam, limits, config.length_penalty, n_best)
