"""The overlap meter on hand-worked timestamps (two keys a step, DC-S3GD's lag of one)."""
import pytest

from kvstore_ext.horovod.overlap import OverlapMeter

#: round r: (start, done) of each of the two keys' allreduces; the gradients of step r + 1
#: (what round r must be back for) are ready at GRAD[r].  Round 1 stalls: back at 40.
ROUNDS = {0: ((0.5, 1.0), (4.0, 6.0)), 1: ((10.0, 11.0), (30.0, 40.0)),
          2: ((40.5, 41.0), (45.0, 46.0)), 3: ((50.0, 51.0), (55.0, 56.0))}
GRAD = {0: 10.0, 1: 20.0, 2: 50.0, 3: 60.0}


def feed(meter: OverlapMeter) -> OverlapMeter:
    for r, (starts, dones) in ROUNDS.items():
        if not meter.measures_round(r):
            continue
        for t0, t1 in zip(starts, dones):
            meter.pushed(r)
            meter.started(r, t0)
            meter.done(r, t1)
        for key in range(2):
            meter.grad_ready(r + 1, GRAD[r] - 0.5 + 0.5 * key)
    return meter


def test_means_medians_and_the_iteration_between_rounds():
    m = feed(OverlapMeter(lag=1, every=1)).to_dict(iterations=4)
    # lengths from each round's last start to its last sum: 5, 29, 5, 5; waits past the
    # gradients: 0, 20, 0, 0
    assert m["measured_rounds"] == 4
    assert m["allreduce_time_s"] == pytest.approx(11.0)
    assert m["allreduce_wait_s"] == pytest.approx(5.0)
    assert m["overlap"] == pytest.approx(1 - 20 / 44)
    assert m["allreduce_time_median_s"] == pytest.approx(5.0)
    assert m["allreduce_wait_median_s"] == pytest.approx(0.0)
    # rounds start 1, 11, 41, 51: the stall lifts the mean interval (16.7), not the median
    assert m["iteration_time_median_s"] == pytest.approx(10.0)
    # the gradients' period: step 1's first (9.5) to step 4's last (60)
    assert m["iteration_time_s"] == pytest.approx((60 - 9.5) / 3)


def test_rounds_measured_apart_give_no_interval():
    m = feed(OverlapMeter(lag=1, every=2)).to_dict(iterations=4)
    assert m["measured_rounds"] == 2          # rounds 0 and 2
    assert m["allreduce_time_median_s"] == pytest.approx(5.0)
    assert m["iteration_time_median_s"] is None


def test_a_meter_that_measured_nothing_reports_no_medians():
    m = OverlapMeter(lag=1).to_dict(iterations=0)
    assert m["measured_rounds"] == 0 and m["overlap"] is None
    assert m["allreduce_time_median_s"] is None and m["iteration_time_median_s"] is None
