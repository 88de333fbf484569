"""Decoding with several models at once: an ensemble of checkpoints behind the one-decoder contract.

Each member encodes the sources itself (its own backbone, image size and feature cache may differ) and keeps its own
decoder state; every step, each member scores the next word and the ensemble's next-word log-probabilities are the
mean of the members' (a product of experts, renormalised by the search's log-softmax; OpenNMT-py averages the same
way). Greedy and beam search then run over it unchanged: to them it is one :class:`~attnkit.interfaces.Decoder`.

    members' log-probs (B*K, V) each --mean--> the ensemble's step logits --search--> words
    members' states    --expand/select rows together--> one beam per hypothesis for all members

The attention a hypothesis carries (overlays, the report) is the **first** member's: every member has its own, and
a mean of several models' attention is no model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attnkit.interfaces import Decoder, DecoderState, EncoderOutput, StepOutput


@dataclass(frozen=True)
class EnsembleState:
    members: tuple[DecoderState, ...]  # one per member, rows in the same order

    @property
    def beams(self) -> int:
        return self.members[0].beams

    @property
    def mask(self) -> Tensor:  # (B, L) the first member's memory positions: those its attention rows cover
        return self.members[0].mask

    def expand_beams(self, beams: int) -> "EnsembleState":
        return EnsembleState(tuple(state.expand_beams(beams) for state in self.members))

    def select_beams(self, rows: Tensor, sources: Tensor) -> "EnsembleState":
        return EnsembleState(tuple(state.select_beams(rows, sources) for state in self.members))


class EnsembleDecoder:
    """The members' decoders over the sources each has encoded; decode with ``search(ensemble, ensemble.encoded, ...)``."""

    def __init__(self, members: Sequence[tuple[Decoder, EncoderOutput]]):
        if not members:
            raise ValueError("an ensemble needs at least one member")
        sizes = {encoded.batch_size for _, encoded in members}
        if len(sizes) != 1:
            raise ValueError(f"every member must encode the same sources (batch sizes {sorted(sizes)})")
        self.decoders = [decoder for decoder, _ in members]
        self.members_encoded = [encoded for _, encoded in members]
        self.reading_offset = self.decoders[0].reading_offset

    @property
    def encoded(self) -> EncoderOutput:
        """What the search sizes itself by (batch, device, length limits) and crops attention with: the first member's."""
        return self.members_encoded[0]

    def init_state(self, encoded: EncoderOutput) -> EnsembleState:
        if encoded is not self.encoded:  # each member decodes what it encoded; another source would be silently ignored
            raise ValueError("an ensemble decodes the sources its members encoded: pass ensemble.encoded")
        return EnsembleState(tuple(decoder.init_state(own) for decoder, own in zip(self.decoders, self.members_encoded)))

    def step(self, previous: Tensor, state: EnsembleState) -> StepOutput:
        outputs = [decoder.step(previous, own) for decoder, own in zip(self.decoders, state.members)]
        log_probs = torch.stack([torch.log_softmax(out.logits.float(), -1) for out in outputs]).mean(0)  # (B*K, V)
        return StepOutput(logits=log_probs, attention=outputs[0].attention, state=EnsembleState(tuple(out.state for out in outputs)))
