"""Length-bucketed batches cut by examples or by target tokens (train.batch_size, train.batch_tokens)."""

import random

import pytest

from attnkit.config import load_config
from attnkit.data.batching import BatchLimit, BucketBatchSampler, TaskMixSampler
from attnkit.distributed import ShardedBatchSampler
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
        fresh = BucketBatchSampler(keys, BatchLimit(size=8, tokens=tokens), seed=3)  # as a resumed run builds it
        assert fresh.batches_of_epoch(epoch) == batches  # from the seed and the epoch alone: an exact resume
    # batch_size plays no part: a limit of 500 tokens holds far more than 8 short targets
    if tokens == 500:
        assert max(len(batch) for batch in batches) > 8
    # cut greedily: no batch could have taken the next example of its (sorted) pool, so few tokens are padding
    padded = sum(len(b) * max(keys[i][0] for i in b) for b in batches)
    assert sum(key[0] for key in keys) / padded > 0.8


def shares(batches: list[list[int]], ranks: int) -> list[list[int]]:
    """Each process's rows of each global batch, as the trainer's ShardedBatchSampler hands them out."""
    return [share for rank in range(ranks) for share in ShardedBatchSampler(batches, rank, ranks)]


def padded_tokens(rows: list[int], target_lengths: list[int]) -> int:
    return len(rows) * max(target_lengths[i] for i in rows)


def test_with_several_processes_every_one_gets_a_row_of_each_token_batch_within_its_share():
    """A pool's last batch may hold a single long example; with 4 processes the sharded sampler (which skips
    global batches of fewer rows than processes) would drop it, so it takes rows from the batch before."""
    keys = sort_keys(1000)
    limit = BatchLimit(size=8, tokens=40).times(4)
    batches = list(BucketBatchSampler(keys, limit, seed=2, pool_factor=5))  # small pools: many last batches
    assert sorted(i for batch in batches for i in batch) == list(range(len(keys)))
    assert min(len(batch) for batch in batches) >= 4
    lengths = [key[0] for key in keys]
    assert max(padded_tokens(share, lengths) for share in shares(batches, 4)) <= 40 + 30  # at most one longest target over
    one_process = list(BucketBatchSampler(keys, BatchLimit(size=8, tokens=160), seed=2, pool_factor=5))
    assert sum(len(batch) < 4 for batch in one_process) > 5  # where the rule matters: one process keeps them apart


def test_a_long_last_row_does_not_swell_one_process_s_share():
    """Two processes of 100 tokens: nineteen 10-token targets fill the first batch, a 100-token one is left alone.
    Joined to the batch before, one process took ten rows padded to 100 (1,000 tokens); refilled, each takes one."""
    lengths = [10] * 19 + [100]
    batches = list(BucketBatchSampler(lengths, BatchLimit(size=64, tokens=100).times(2), shuffle=False))
    assert sorted(i for share in shares(batches, 2) for i in share) == list(range(20))  # no batch skipped
    assert max(padded_tokens(share, lengths) for share in shares(batches, 2)) <= 100
    # a batch before too small to lend a row: the two join, two rows a process at most (within one target of 100)
    lengths = [40, 40, 100]
    batches = list(BucketBatchSampler(lengths, BatchLimit(size=64, tokens=100).times(2), shuffle=False))
    assert batches == [[0, 1, 2]] and max(padded_tokens(share, lengths) for share in shares(batches, 2)) == 200


@pytest.mark.parametrize("tokens", [0, 60])
def test_an_epoch_s_last_pool_too_small_to_share_joins_the_pool_before(tokens):
    """97 examples in pools of 32 (or of 24 ten-token targets) leave one for a last pool; four processes would all skip it."""
    keys = [(10, source) for source in range(97)]
    sampler = BucketBatchSampler(keys, BatchLimit(size=8, tokens=tokens).times(4), seed=5, pool_factor=1)
    assert sampler.pool_size == (24 if tokens else 32)
    batches = sampler.batches_of_epoch(0)
    assert min(len(batch) for batch in batches) >= 4 and sampler.count(0) == len(batches)
    assert sorted(i for share in shares(batches, 4) for i in share) == list(range(97))


def test_a_short_last_batch_joins_the_one_before_when_that_cannot_lend_its_rows():
    """One row a process: a batch of four cannot lend three rows and keep four, so the last one row joins it."""
    keys = [(10, source) for source in range(97)]
    joined = BucketBatchSampler(keys, BatchLimit(size=1).times(4), seed=5)
    assert joined.count(0) == len(joined.batches_of_epoch(0)) == 96 // 4


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
