"""The CPU's share of a stream's optimizer steps (vfabric.balance.HostShare), on made-up steps: what it does when
the loop waits for the CPU, when the CPU has time to spare, and when a share made the step slower."""

import pytest

from vfabric.balance import SAMPLES, HostShare


def settled(share, *steps):
    """Feeds each of `steps` ((step, waited, busy) seconds) SAMPLES times, after the settling step a change (or
    the start) is followed by, which is not judged whatever it measured; the shares after each."""
    out = []
    for step in steps:
        if share.settling:
            assert share.observe(9.0, 9.0, 9.0) == share.k
        for _ in range(SAMPLES - 1):
            assert share.observe(*step) == share.k, "one judged step decides nothing"
        out.append(share.observe(*step))
    return out


def test_a_cpu_that_makes_the_loop_wait_gives_layers_back_in_proportion():
    s = HostShare(20, 10)
    # 2.0 s steps, 0.95 s waiting for a CPU busy 1.96 s over 10 layers (0.196 s each): about 5 layers back.
    assert settled(s, (2.0, 0.95, 1.96)) == [5]
    assert s.ceiling == 10
    # Still waiting a little: one more back.
    assert settled(s, (1.4, 0.08, 0.98)) == [4]


def test_one_slow_step_moves_nothing():
    s = HostShare(20, 10)
    s.observe(9.0, 9.0, 9.0)  # the first step: not judged
    assert s.observe(3.0, 2.0, 1.0) == 10, "a checkpoint made the loop wait once"
    assert s.observe(1.0, 0.0, 0.9) == 10, "the least wait of the two is none: the share holds"
    assert s.ceiling == 21


def test_a_cpu_with_time_to_spare_takes_one_more_layer_up_to_the_ceiling():
    s = HostShare(20, 10)
    assert settled(s, (1.2, 0.0, 0.6), (1.1, 0.0, 0.66)) == [11, 12]
    # 12 made it wait and the step slower: back to the fastest share, 11, and 12 is not tried again.
    assert settled(s, (1.3, 0.2, 1.2)) == [11]
    assert s.ceiling == 12
    assert settled(s, (1.1, 0.0, 0.6), (1.1, 0.0, 0.6)) == [11, 11]


def test_a_share_that_makes_the_step_slower_is_undone_and_not_tried_again():
    s = HostShare(20, 10)
    assert settled(s, (1.0, 0.0, 0.5)) == [11]
    assert settled(s, (1.1, 0.0, 0.55)) == [10], "11 layers was 10% slower than 10"
    assert settled(s, (1.0, 0.0, 0.5)) == [10], "the CPU has time to spare, but 11 is known to be slower"


def test_giving_layers_back_that_made_the_step_slower_is_undone():
    s = HostShare(20, 10)
    # The loop waits for the CPU a little: 2 layers back (0.11 s a layer, 0.22 s waited).
    assert settled(s, (1.27, 0.22, 1.1)) == [8]
    # Slower with 8 (the link bounds it then): back to 10, where it then stays though the loop waits.
    assert settled(s, (1.4, 0.0, 0.9)) == [10]
    assert settled(s, (1.27, 0.22, 1.1)) == [10]


def test_the_step_after_a_change_is_not_judged_and_a_busy_cpu_without_a_wait_stays():
    s = HostShare(20, 10)
    assert s.observe(2.0, 1.9, 1.9) == 10, "the first step pays for starting: not judged"
    assert settled(s, (1.0, 0.0, 0.9)) == [10], "busy 90% of the step, no wait: the share holds"
    assert s.history == [(10, 1.0, 0.0, 0.9)] * SAMPLES


def test_shares_stay_within_the_layers():
    s = HostShare(2, 2)
    assert settled(s, (1.0, 0.0, 0.1)) == [2], "no layer left to take"
    s = HostShare(4, 1)
    assert settled(s, (1.0, 0.9, 0.5)) == [0]
    assert settled(s, (1.0, 0.0, 0.0)) == [0], "0 on the CPU and waiting for nothing: none taken, 1 was too many"
    with pytest.raises(ValueError):
        HostShare(4, 5)
