"""`Ahead` (fastdata.image.device.ahead), the device path's one background-thread primitive: each clause of its
written invariant (order, bound, ending, nothing lost, accounts), with sources and work that wait for each other
rather than for the clock."""

from __future__ import annotations

import threading
import time

import pytest

from fastdata.image.device.ahead import Ahead

WAIT_S = 120  # only a broken primitive waits this long: the test then fails


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_results_come_in_order_each_once():
    ahead = Ahead(range(50), lambda x: x * x, depth=2, name="test-ahead").start()
    assert list(ahead) == [x * x for x in range(50)]
    ahead.close()
    assert not ahead.alive


class Boom(Exception):
    pass


@pytest.mark.parametrize("where", ["source", "work"])
def test_an_error_comes_after_the_results_before_it_with_its_type_and_ends_the_iteration(where):
    def source():
        yield from range(3)
        if where == "source":
            raise Boom("from the source")
        yield 3

    def work(x):
        if where == "work" and x == 3:
            raise Boom("from the work")
        return x

    ahead = Ahead(source(), work, depth=2, name="test-ahead").start()
    got = []
    with pytest.raises(Boom, match=f"from the {where}") as caught:
        for x in ahead:
            got.append(x)
    assert got == [0, 1, 2]
    assert any(frame.name == ("source" if where == "source" else "work") for frame in caught.traceback)
    assert list(ahead) == []  # ended
    ahead.close()


def test_at_most_depth_results_wait_and_the_thread_then_waits_for_room():
    made = []
    ahead = Ahead(range(100), lambda x: made.append(x) or x, depth=3, name="test-ahead").start()
    # 3 waiting, the 4th in hand: the thread cannot go on until one is taken
    wait_until(lambda: ahead.waiting == 3 and len(made) == 4, "the thread never filled its queue")
    assert ahead.state == "room" and len(made) == 4
    assert next(ahead) == 0
    wait_until(lambda: ahead.waiting == 3 and len(made) == 5, "the thread did not make the next one")
    assert len(made) == 5
    ahead.close()


def test_close_ends_the_thread_closes_the_source_on_its_thread_and_hands_what_is_left_to_discard():
    closed_on = []

    def source():
        try:
            yield from range(100)
        finally:
            closed_on.append(threading.current_thread().name)

    discarded, made = [], []
    ahead = Ahead(source(), lambda x: made.append(x) or x, depth=2, name="test-ahead",
                  discard=discarded.append).start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.waiting == 2 and len(made) == 4, "the thread never filled its queue")
    calls_before = ahead.busy_s
    ahead.close()
    assert not ahead.alive and closed_on == ["test-ahead"]
    assert sorted(discarded) == [1, 2, 3]  # 2 waiting + the one it could not put: every result accounted for
    assert ahead.busy_s == calls_before and list(ahead) == []


def test_stop_only_asks_and_the_callers_next_ends_the_iteration():
    release = threading.Event()

    def work(x):
        if x == 1:
            release.wait(WAIT_S)
        return x

    ahead = Ahead(range(10), work, depth=2, name="test-ahead").start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.state == "work", "the thread never reached the second item")
    ahead.stop()
    assert ahead.alive  # it finishes its current work first
    with pytest.raises(StopIteration):
        next(ahead)
    release.set()
    ahead.close()
    assert not ahead.alive


def test_close_from_its_own_thread_only_asks():
    """A finaliser the garbage collector runs on the thread itself must not wait for that thread."""
    holder: list[Ahead] = []

    def work(x):
        if x == 2:
            holder[0].close()  # would deadlock if it joined itself
        return x

    ahead = Ahead(range(10), work, depth=5, name="test-ahead")
    holder.append(ahead)
    ahead.start()
    wait_until(lambda: not ahead.alive, "the thread did not end after closing itself")
    ahead.close()


def test_the_thread_accounts_for_its_time_by_what_it_waited_for():
    gate = threading.Event()

    def source():
        yield 0
        gate.wait(WAIT_S)  # the thread waits for its source here
        yield 1

    ahead = Ahead(source(), lambda x: x, depth=1, name="test-ahead").start()
    assert next(ahead) == 0
    wait_until(lambda: ahead.state == "source", "the thread never waited for its source")
    time.sleep(0.05)
    gate.set()
    assert list(ahead) == [1]
    ahead.close()
    assert ahead.waited_source_s >= 0.05 and ahead.busy_s >= 0 and ahead.state == "ended"


def test_a_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="depth"):
        Ahead([], lambda x: x, depth=0, name="test-ahead")
