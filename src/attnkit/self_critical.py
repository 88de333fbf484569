"""Self-critical sequence training (Rennie et al. 2017): after cross-entropy, train on the CIDEr-D of the captions the
model itself samples.

Legend: B photos in the batch, S samples per photo, T sampled steps, L memory length.

Each step draws S captions per photo from the captioner's own distribution (``EncoderDecoder.forward`` in its
sampling mode, so DistributedDataParallel sees it), scores each against the photo's training references, and moves
probability towards the samples that score above a baseline b::

    loss = - sum over samples (r - b) * sum_t log p(w_t | w_<t, photo)  /  sampled words (each <eos> included)

    b = the mean reward of the photo's other S - 1 samples   (train.scst_baseline: mean; Luo 2020, no extra decoding)
      | the reward of the photo's greedy caption               (greedy; Rennie et al., one greedy decoding in eval mode)

The reward is CIDEr-D on pycocoevalcap's per-image scale (validation prints it x100) with document frequencies fixed
once from every training photo's references (:class:`attnkit.metrics.CiderD`). Xu et al.'s doubly stochastic term
(``train.attention_regularization``) applies to the sampled captions' attention as it applied to the references',
so the attention stays under the pressure it trained with; the decoder reads the attended context (and its β gate)
exactly as under cross-entropy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.data.batching import Batch
from attnkit.losses import LossOutput, doubly_stochastic_penalty
from attnkit.metrics import CiderD
from attnkit.search import Samples, Sampling, greedy_search
from attnkit.vocab import Vocabulary

Reward = Callable[[list[list[str]], list[int]], list[float]]  # captions (as words), the photo each describes -> rewards


def cider_d_reward(references: Sequence[Sequence[Sequence[str]]]) -> Reward:
    """CIDEr-D of each caption against its photo's references (per photo, its captions as word lists); the document
    frequencies are those of all of ``references``, fixed once, so a caption's reward does not depend on its batch."""
    cider = CiderD(references)
    return lambda captions, photos: [cider.score(caption, photo) for caption, photo in zip(captions, photos)]


@dataclass(frozen=True)
class SelfCriticalObjective:
    """``objective(model, batch) -> LossOutput`` for the trainer; ``batch.index`` are dataset examples, ``photo_of``
    maps each to the photo the reward knows it by. Logged per sample (``train_statistics``): ``reward`` (and
    ``greedy_reward`` with the greedy baseline)."""

    reward: Reward
    vocab: Vocabulary
    photo_of: Sequence[int]  # dataset example -> photo index of the reward's references
    samples: int = 5
    baseline: str = "mean"  # mean | greedy
    max_length: int = 41  # sampled steps at most, <eos> included
    attention_regularization: float = 0.0

    def __call__(self, model: nn.Module, batch: Batch) -> LossOutput:
        vocab, per_photo = self.vocab, self.samples
        sampling = Sampling(vocab.bos_index, vocab.eos_index, vocab.pad_index, self.max_length, per_photo, tuple(vocab.never_output))
        drawn: Samples = model(batch, sampling=sampling)
        photos = [self.photo_of[example] for example in batch.index.tolist()]
        rewards = self._rewards(drawn.words(vocab.eos_index), [photo for photo in photos for _ in range(per_photo)], drawn.tokens.device)  # (B*S,)
        by_photo = rewards.view(-1, per_photo)  # (B, S)
        statistics = {"reward": rewards.sum()}
        if self.baseline == "greedy":
            greedy = self._rewards(self._greedy_words(model, batch), photos, drawn.tokens.device)  # (B,)
            baseline = greedy.unsqueeze(1).expand_as(by_photo)  # (B, S)
            statistics["greedy_reward"] = greedy.sum() * per_photo  # per sample, like the reward
        else:  # the mean of the photo's other samples
            baseline = (by_photo.sum(1, keepdim=True) - by_photo) / (per_photo - 1)  # (B, S)
        advantage = (by_photo - baseline).reshape(-1, 1)  # (B*S, 1)
        is_word = drawn.is_word  # (B*S, T)
        per_token_sum = -(advantage * drawn.log_probs.float() * is_word).sum()
        if self.attention_regularization > 0:
            per_token_sum = per_token_sum + self.attention_regularization * doubly_stochastic_penalty(drawn.attention, drawn.memory_mask, is_word).sum()
        examples = torch.full((), rewards.shape[0], device=rewards.device)
        return LossOutput(per_token_sum, is_word.sum(), per_token_sum.new_zeros(()), examples, None, statistics)

    def _rewards(self, captions: list[list[int]], photos: list[int], device: torch.device) -> Tensor:
        words = [[self.vocab.words[i] for i in caption] for caption in captions]
        return torch.tensor(self.reward(words, photos), dtype=torch.float32, device=device)  # (len(captions),)

    def _greedy_words(self, model: nn.Module, batch: Batch) -> list[list[int]]:
        """The photos' greedy captions in eval mode (no dropout), without gradients: the baseline of Rennie et al."""
        core = getattr(model, "module", model)  # outside DistributedDataParallel: nothing here needs its gradients
        was_training = core.training
        core.eval()
        try:
            with torch.no_grad():
                encoded = core.encode(batch.source)
                found = greedy_search(core.decoder, encoded, self.vocab.bos_index, self.vocab.eos_index, self.max_length, never=self.vocab.never_output)
        finally:
            core.train(was_training)
        return [hypothesis.tokens for hypothesis in found]
