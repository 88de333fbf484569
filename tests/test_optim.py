import pytest
import torch

from attnkit.config import TrainConfig
from attnkit.optim import LearningRateSchedule, WeightAverage, load_optimizer_state


def _schedule(**settings):
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.Adam([{"params": [weight]}, {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.01}], lr=0.1)
    return optimizer, LearningRateSchedule(optimizer, TrainConfig(lr=0.1, lr_patience=0, **settings))


def test_the_warm_up_climbs_linearly_to_each_groups_rate_then_leaves_it():
    optimizer, schedule = _schedule(warmup_steps=4)
    rates = []
    for step in range(6):
        schedule.before_step(step)
        rates += [group["lr"] for group in optimizer.param_groups]
    assert rates == pytest.approx([0.025, 0.0025, 0.05, 0.005, 0.075, 0.0075, 0.1, 0.01, 0.1, 0.01, 0.1, 0.01])


def test_a_plateau_during_the_warm_up_does_not_lower_the_rate_and_one_after_it_does():
    optimizer, schedule = _schedule(warmup_steps=4, lr_factor=0.5)
    schedule.before_step(1)
    schedule.after_validation(1.0, step=2)
    schedule.after_validation(0.5, step=2)  # worse, but still warming up
    schedule.before_step(3)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    schedule.after_validation(1.0, step=4)
    schedule.after_validation(0.5, step=5)  # worse with patience 0: halved
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.05, 0.005])


def test_without_a_warm_up_the_configured_rate_holds_from_the_first_step():
    optimizer, schedule = _schedule()
    schedule.before_step(0)
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.01]


def test_a_frozen_group_has_no_rate_until_it_thaws_then_the_share_the_plateaus_left_the_others():
    encoder, rest = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([{"params": [encoder], "frozen_steps": 3}, {"params": [rest]}], lr=0.1)
    schedule = LearningRateSchedule(optimizer, TrainConfig(lr=0.1, lr_patience=0, lr_factor=0.5))
    rates = []
    for step in range(5):
        schedule.before_step(step)
        rates += [group["lr"] for group in optimizer.param_groups]
        if step == 1:  # two validations, the second no better: the plateau halves the free group (the frozen one stays 0)
            schedule.after_validation(1.0, step)
            schedule.after_validation(0.5, step)
    assert rates == pytest.approx([0.0, 0.1, 0.0, 0.1, 0.0, 0.05, 0.05, 0.05, 0.05, 0.05])


def test_the_weight_average_follows_the_steps_with_a_warm_up_and_copies_counters():
    model = torch.nn.BatchNorm1d(2)  # a weight, running statistics (floating buffers) and a counter
    average = WeightAverage(model, decay=0.99)
    start = model.weight.detach().clone()  # ones
    with torch.no_grad():
        model.weight.fill_(3.0)
        model.num_batches_tracked.fill_(7)
    average.update(model, step=0)  # decay min(0.99, 1/10): 90 % of the new weights
    torch.testing.assert_close(average.average["weight"], start + 0.9 * (3.0 - start))
    assert average.average["num_batches_tracked"].item() == 7
    average.update(model, step=10_000)  # past the warm-up: the configured decay
    torch.testing.assert_close(average.average["weight"], torch.full((2,), 2.8 + 0.01 * 0.2))


def _stepped_away_from_its_average():
    """A layer whose weights have moved since its average began, and the weights it trains (a copy)."""
    model = torch.nn.Linear(2, 1)
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model.weight.add_(1.0)
    average.update(model, step=100)
    return model, average, model.weight.detach().clone()


def test_the_model_holds_the_average_inside_the_swap_only():
    model, average, trained = _stepped_away_from_its_average()
    with average.swapped_in(model) as weights:
        torch.testing.assert_close(model.weight, average.average["weight"])
        torch.testing.assert_close(weights["weight"], trained)
    torch.testing.assert_close(model.weight.detach(), trained)
    assert not torch.equal(average.average["weight"], trained)


def test_the_trained_weights_come_back_when_validation_fails_inside_the_swap():
    model, average, trained = _stepped_away_from_its_average()
    with pytest.raises(RuntimeError, match="validation failed"):
        with average.swapped_in(model):
            raise RuntimeError("validation failed")
    torch.testing.assert_close(model.weight.detach(), trained)


def test_a_resumed_schedule_keeps_its_count_and_takes_this_run_s_settings():
    """--resume --set train.lr_patience=... asks for new settings; torch's own load would bring the saved ones back."""
    first = LearningRateSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), TrainConfig(lr=0.1, lr_patience=1, lr_factor=0.5, min_lr=0.0))
    first.after_validation(10.0, 0)
    first.after_validation(9.0, 1)  # one validation without improvement, of the one lr_patience lets pass
    resumed = LearningRateSchedule(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), TrainConfig(lr=0.1, lr_patience=5, lr_factor=0.1, min_lr=1e-5))
    resumed.load_state_dict(first.state_dict())
    assert (resumed.plateau.patience, resumed.plateau.factor, resumed.plateau.min_lrs) == (5, 0.1, [1e-5])
    assert (resumed.plateau.best, resumed.plateau.num_bad_epochs) == (10.0, 1)


def _halved_once(peak: float, **settings) -> LearningRateSchedule:
    """A schedule whose one plateau has halved its group's rate (from ``peak`` to ``peak / 2``)."""
    schedule = LearningRateSchedule(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak, **settings), TrainConfig(lr=peak, lr_patience=0, lr_factor=0.5, min_lr=0.0))
    schedule.after_validation(10.0, 0)
    schedule.after_validation(9.0, 1)
    assert schedule.optimizer.param_groups[0]["lr"] == peak / 2
    return schedule


def _resumed(saved: LearningRateSchedule, peak: float, **settings) -> LearningRateSchedule:
    """A new run's schedule and optimizer with this run's ``peak`` and ``settings``, loaded as Trainer.restore loads them."""
    resumed = LearningRateSchedule(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak, **settings), TrainConfig(lr=peak, lr_patience=0, lr_factor=0.5, min_lr=0.0))
    load_optimizer_state(resumed.optimizer, saved.optimizer.state_dict())
    resumed.load_state_dict(saved.state_dict())
    return resumed


def test_a_resumed_run_takes_its_own_peak_rate_at_the_share_the_plateaus_reached():
    """--resume --set train.lr=...: torch's load would bring the saved rate back, and the checkpoint's config would
    name a rate the run never used."""
    assert _resumed(_halved_once(0.1), peak=0.4).optimizer.param_groups[0]["lr"] == pytest.approx(0.2)
    assert _resumed(_halved_once(0.1), peak=0.1).optimizer.param_groups[0]["lr"] == 0.05  # unchanged: the same rate


def test_a_checkpoint_without_saved_peaks_keeps_its_saved_rate():
    saved = _halved_once(0.1)
    state = {key: value for key, value in saved.state_dict().items() if key != "peaks"}  # as written before the peaks were saved
    resumed = LearningRateSchedule(torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.4), TrainConfig(lr=0.4, lr_patience=0))
    load_optimizer_state(resumed.optimizer, saved.optimizer.state_dict())
    resumed.load_state_dict(state)
    assert resumed.optimizer.param_groups[0]["lr"] == 0.05
    assert not hasattr(resumed.plateau, "peaks")


def test_a_resumed_optimizer_keeps_its_moments_and_takes_this_run_s_weight_decay_and_betas():
    weight = torch.nn.Parameter(torch.ones(3))
    first = torch.optim.Adam([weight], lr=0.1, weight_decay=0.0)
    weight.grad = torch.tensor([1.0, -2.0, 3.0])
    first.step()
    resumed = torch.optim.Adam([torch.nn.Parameter(weight.detach().clone())], lr=0.1, weight_decay=0.01, betas=(0.8, 0.98))
    load_optimizer_state(resumed, first.state_dict())
    group = resumed.param_groups[0]
    assert (group["weight_decay"], group["betas"]) == (0.01, (0.8, 0.98))
    (moments,) = resumed.state.values()
    torch.testing.assert_close(moments["exp_avg"], first.state[weight]["exp_avg"])
    assert float(moments["step"]) == 1.0


def test_the_rate_a_run_logs_is_a_moving_groups_not_a_frozen_encoders():
    """log.jsonl's lr read the first group, which text_encoder.frozen_steps holds at 0 while the rest trains."""
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "frozen_steps": 100}, {"params": [torch.nn.Parameter(torch.zeros(1))]}]
    schedule = LearningRateSchedule(torch.optim.Adam(groups, lr=0.002), TrainConfig(lr=0.002))
    schedule.before_step(0)
    assert [group["lr"] for group in schedule.optimizer.param_groups] == [0.0, 0.002]
    assert schedule.moving_rate(1) == schedule.moving_rate(100) == 0.002  # the last of the 100 steps still held the encoder
    schedule.before_step(100)
    assert schedule.moving_rate(101) == schedule.optimizer.param_groups[0]["lr"] == 0.002  # thawed


def test_the_last_epochs_decay_the_rate_linearly_from_the_share_reached_and_the_plateaus_wait():
    optimizer, schedule = _schedule(epochs=4, decay_epochs=2, lr_factor=0.5)
    schedule.before_step(0, position=0.0)
    schedule.after_validation(1.0, step=1)
    schedule.after_validation(0.5, step=1)  # worse with patience 0: halved before the decay
    rates = []
    for step, position in enumerate([1.0, 1.5, 2.0, 2.5, 3.0, 3.5], start=1):  # two steps an epoch
        schedule.before_step(step, position)
        rates += [group["lr"] for group in optimizer.param_groups]
        if position >= 2.0:
            schedule.after_validation(0.0, step)  # ever worse, patience 0: yet the decay alone sets the rate
    # stable at the halved rate, then from half the peaks down a quarter of the way each step
    assert rates == pytest.approx([0.05, 0.005, 0.05, 0.005, 0.05, 0.005, 0.0375, 0.00375, 0.025, 0.0025, 0.0125, 0.00125])


def test_a_schedule_resumed_in_its_decay_goes_on_from_the_saved_start_and_a_damaged_one_is_refused():
    optimizer, schedule = _schedule(epochs=2, decay_epochs=1)
    schedule.before_step(0, position=1.0)
    optimizer_again, resumed = _schedule(epochs=2, decay_epochs=1)
    resumed.load_state_dict(schedule.state_dict())
    resumed.before_step(1, position=1.5)
    assert resumed.decay_from == 1.0 and [g["lr"] for g in optimizer_again.param_groups] == pytest.approx([0.05, 0.005])
    with pytest.raises(ValueError, match="decay from"):
        resumed.load_state_dict({**schedule.state_dict(), "decay_from": "half"})
    older = schedule.state_dict()
    del older["decay_from"]  # a checkpoint from before the decay existed
    resumed.load_state_dict(older)
    assert resumed.decay_from is None


def test_a_run_given_more_epochs_decays_again_later_from_the_rate_it_reached():
    optimizer, schedule = _schedule(epochs=4, decay_epochs=2)
    schedule.before_step(0, position=3.0)  # halfway into the decay of a 4-epoch run
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)
    optimizer_again, extended = _schedule(epochs=8, decay_epochs=2)
    extended.load_state_dict(schedule.state_dict())
    optimizer_again.param_groups[0]["lr"], optimizer_again.param_groups[1]["lr"] = 0.05, 0.005  # as the optimizer's state brings them back
    extended.before_step(1, position=4.0)  # now before the decay: the rate stays where it was
    assert [g["lr"] for g in optimizer_again.param_groups] == pytest.approx([0.05, 0.005]) and extended.decay_from is None
    extended.before_step(2, position=7.0)  # the new decay starts from there
    assert extended.decay_from == pytest.approx(0.5) and optimizer_again.param_groups[0]["lr"] == pytest.approx(0.025)


def test_a_run_shorter_than_its_decay_decays_throughout():
    optimizer, schedule = _schedule(epochs=2, decay_epochs=3)  # as `attnkit demo --scenes-set train.epochs=2`
    schedule.before_step(0, position=0.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)
    schedule.before_step(1, position=1.0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_a_decay_that_begins_within_the_warm_up_climbs_until_it_meets_the_falling_line():
    """The decay froze the rate at the share the warm-up had reached at its first step: a 3-epoch run of a recipe
    with 10 warm-up steps and train.decay_epochs >= 3 trained at lr / 10 and below, never near lr."""
    optimizer, schedule = _schedule(epochs=3, decay_epochs=3, warmup_steps=10)
    rates = []
    for step in range(30):  # ten steps an epoch
        schedule.before_step(step, position=step / 10)
        rates.append(optimizer.param_groups[0]["lr"] / 0.1)
    assert rates[:7] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])  # the warm-up, under the falling line
    assert rates[7:] == pytest.approx([1 - step / 30 for step in range(7, 30)])  # then the line: 1 - position / 3
    assert schedule.decay_from == pytest.approx(1.0) and max(rates) == pytest.approx(23 / 30)


def test_epochs_past_the_decay_s_end_keep_the_rate_at_0_never_below():
    """bench/gpu_smoke.py runs epochs by steps, past train.epochs when its steps ask for more: a rate below 0 would
    climb the loss."""
    optimizer, schedule = _schedule(epochs=4, decay_epochs=2)
    for step, position in enumerate([3.5, 4.0, 6.0]):
        schedule.before_step(step, position)
        assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.025, 0.0025] if position == 3.5 else [0.0, 0.0])


def test_a_stop_before_or_inside_the_decay_says_how_much_of_it_ran():
    _, schedule = _schedule(epochs=10, decay_epochs=3)
    assert schedule.cut_short(5) == schedule.cut_short(7) == ", before its decay (the last 3 of 10 epochs) began"
    assert schedule.cut_short(8) == ", after 1 of its decay's epochs (the last 3 of 10 epochs)"
    assert schedule.cut_short(10) == "" and _schedule(epochs=10)[1].cut_short(5) == ""  # it ran whole; none was asked for
