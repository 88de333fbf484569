"""Length-bucketed batches cut by examples or by target tokens (train.batch_size, train.batch_tokens)."""

import random

import pytest

from attnkit.config import load_config
from attnkit.data.batching import BatchLimit, BucketBatchSampler, TaskMixSampler
from attnkit.errors import UserError


def sort_keys(count: int, seed: int = 0) -> list[tuple[int, int]]:
    """(target length, source length) of ``count`` made-up pairs, targets of 3 to 30 tokens."""
    rng = random.Random(seed)
    return [(rng.randint(3, 30), rng.randint(2, 40)) for _ in range(count)]


def test_the_docstring_pool_is_cut_as_drawn():
    keys = [3, 3, 4, 4, 4, 5, 5, 6, 7, 7, 9]
    sampler = BucketBatchSampler(keys, BatchLimit(size=64, tokens=16), shuffle=False)
    assert [[keys[i] for i in batch] for batch in sampler] == [[3, 3, 4, 4], [4, 5, 5], [6, 7], [7], [9]]


@pytest.mark.parametrize("tokens", [30, 64, 500])
def test_token_batches_stay_within_the_limit_and_hold_every_example_once(tokens):
    keys = sort_keys(1000)
    sampler = BucketBatchSampler(keys, BatchLimit(size=8, tokens=tokens), seed=3)
    for epoch in (1, 2):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert sorted(i for batch in batches for i in batch) == list(range(len(keys)))
        assert all(len(batch) * max(keys[i][0] for i in batch) <= tokens for batch in batches)
        assert len(sampler) == len(batches)  # the count follows the epoch's own cut
        assert sampler.batches_of_epoch(epoch) == batches  # from the seed and the epoch alone: an exact resume
    # batch_size plays no part: a limit of 500 tokens holds far more than 8 short targets
    if tokens == 500:
        assert max(len(batch) for batch in batches) > 8
    # cut greedily: no batch could have taken the next example of its (sorted) pool, so few tokens are padding
    padded = sum(len(b) * max(keys[i][0] for i in b) for b in batches)
    assert sum(key[0] for key in keys) / padded > 0.8


def test_with_several_processes_no_token_batch_is_too_small_to_share():
    """A pool's last batch may hold a single long example; with 4 processes it joins the batch before it, so the
    sharded sampler (which skips global batches of fewer rows than processes) drops none."""
    keys = sort_keys(1000)
    limit = BatchLimit(size=8, tokens=40).times(4)
    batches = list(BucketBatchSampler(keys, limit, seed=2, pool_factor=5))  # small pools: many last batches
    assert sorted(i for batch in batches for i in batch) == list(range(len(keys)))
    assert min(len(batch) for batch in batches) >= 4
    overrun = max(len(b) * max(keys[i][0] for i in b) - limit.tokens for b in batches)
    assert overrun < 4 * 30  # less than one longest target more per process
    one_process = list(BucketBatchSampler(keys, BatchLimit(size=8, tokens=160), seed=2, pool_factor=5))
    assert sum(len(batch) < 4 for batch in one_process) > 5  # where the rule matters: one process keeps them apart


def test_a_limit_of_examples_cuts_as_before():
    keys = sort_keys(130)
    sampler = BucketBatchSampler(keys, 16, seed=0)
    batches = list(sampler)
    assert len(sampler) == len(batches) == 9 and sorted(len(b) for b in batches)[1:] == [16] * 8


def test_a_limit_below_the_longest_target_is_one_message_naming_both():
    keys = sort_keys(50) + [(42, 3)]
    with pytest.raises(UserError, match=r"train.batch_tokens: 40 is smaller than the longest training example \(42 target tokens\)"):
        BucketBatchSampler(keys, BatchLimit(size=8, tokens=40))
    # each rank's share must hold it: two ranks of 40 tokens cut global batches of 80, still refused
    with pytest.raises(UserError, match="train.batch_tokens: 40 is smaller"):
        BucketBatchSampler(keys, BatchLimit(size=8, tokens=40).times(2))
    BucketBatchSampler(keys, BatchLimit(size=8, tokens=42).times(2))


def test_task_mix_counts_its_batches_from_the_epoch_not_from_where_its_streams_stand():
    """A resumed run builds fresh samplers; with token batches (whose count varies by epoch) the mix must still
    draw the same batches as the run that went on."""
    def mix():
        limit = BatchLimit(size=4, tokens=60)
        tasks = [BucketBatchSampler(sort_keys(90, 1), limit, seed=0), BucketBatchSampler(sort_keys(300, 2), limit, seed=0)]
        return TaskMixSampler(tasks, [0, 90], [0.5, 0.5], seed=1)

    going_on = mix()
    for epoch in (1, 2):
        going_on.set_epoch(epoch)
        ran = list(going_on)
    resumed = mix()
    resumed.set_epoch(2)
    assert list(resumed) == ran and len(resumed) == len(going_on) == len(ran)


def test_the_batch_limit_reads_the_config_and_scales_with_the_ranks():
    train = load_config(None, ["train.batch_size=32", "train.batch_tokens=2048"]).train
    assert BatchLimit.of(train) == BatchLimit(32, 2048)
    assert BatchLimit.of(train).times(4) == BatchLimit(128, 8192, ranks=4)
    assert str(BatchLimit(32, 2048)) == "up to 2048 target tokens" and str(BatchLimit(32)) == "32 examples"


def test_scst_refuses_token_batches():
    with pytest.raises(UserError, match="train.batch_tokens: it cuts batches by the reference captions' lengths"):
        load_config(None, ["task=captioning", "train.objective=scst", "train.batch_tokens=2048"])
