import matplotlib.pyplot as plt
import pytest

from helpers.plotting import bar_compare, waterfall


def _texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_bar_compare_labels_ratio_to_baseline():
    fig = bar_compare(["base", "fast"], [100.0, 250.0], unit="samples/s")
    assert _texts(fig) == ["1.00x", "2.50x"]
    fig = bar_compare(["base", "fast"], [2.0, 0.5], unit="s", higher_is_better=False)
    assert _texts(fig) == ["1.00x", "4.00x"]
    plt.close("all")


def test_bar_compare_bad_input():
    with pytest.raises(ValueError, match="same length"):
        bar_compare(["a"], [1, 2], unit="s")
    with pytest.raises(ValueError, match="baseline"):
        bar_compare(["a", "b"], [0, 1], unit="s")


def test_waterfall_cumulative_speedups():
    fig = waterfall([("reference", 12.0), ("in memory", 6.0), ("bf16", 3.0)])
    texts = _texts(fig)
    assert texts[0].endswith("1.00x") and texts[2].endswith("4.00x")
    with pytest.raises(ValueError, match="positive"):
        waterfall([("a", 0.0)])
    plt.close("all")


def test_waterfall_restarts_from_the_last_kept_step():
    fig = waterfall(
        [("ref", 4.0), ("a", 2.0), ("slower", 3.0), ("b", 1.0)], kept=[True, True, False, True]
    )
    bars = fig.axes[0].patches
    # "slower" (dropped) floats from 2.0 up to 3.0; "b" floats from 2.0 (last kept) down to 1.0
    assert (bars[2].get_y(), bars[2].get_y() + bars[2].get_height()) == (2.0, 3.0)
    assert (bars[3].get_y(), bars[3].get_y() + bars[3].get_height()) == (1.0, 2.0)
    with pytest.raises(ValueError, match="one flag per step"):
        waterfall([("a", 1.0)], kept=[True, False])
    plt.close("all")


def test_one_at_a_time_waits_for_the_holder_and_keeps_the_signature():
    import inspect
    import threading

    from helpers import plotting

    def explore(n=3, name="x"):
        return n

    wrapped = plotting.one_at_a_time(explore)
    assert inspect.signature(wrapped) == inspect.signature(explore) and wrapped(n=5) == 5

    ran = threading.Event()
    cell_holds, cell_may_end = threading.Event(), threading.Event()

    def a_cell():  # what the kernel's pre/post_execute hooks do around a cell
        plotting._take_turn()
        cell_holds.set()
        cell_may_end.wait(30)
        plotting._give_turn()

    cell = threading.Thread(target=a_cell)
    cell.start()
    assert cell_holds.wait(30)
    caller = threading.Thread(target=lambda: (wrapped(), ran.set()))
    caller.start()
    assert not ran.wait(0.5), "the callback ran while a cell held the lock"
    cell_may_end.set()
    assert ran.wait(30), "the callback did not run after the cell ended"
    cell.join(30)
    caller.join(30)


def test_a_hold_whose_end_never_came_is_given_back():
    """A widget handler that raises skips post_execute; the thread's next start gives the hold
    back."""
    import threading

    from helpers import plotting

    def handler_that_raised_then_a_good_one():
        plotting._take_turn()  # no _give_turn: the handler raised
        plotting._take_turn()  # the next message on the same thread
        plotting._give_turn()

    t = threading.Thread(target=handler_that_raised_then_a_good_one)
    t.start()
    t.join(30)
    assert plotting._TURN.acquire(timeout=5), "the lock stayed held after the thread was done"
    plotting._TURN.release()


def test_one_at_a_time_removes_its_hooks_with_the_last_callback(monkeypatch):
    """The turn-taking hooks live as long as a wrapped callback (a control that can be moved),
    not for the kernel's life."""
    import gc

    import IPython
    from IPython.core.events import EventManager, available_events

    from helpers import plotting

    events = EventManager(shell=None, available_events=available_events)
    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"events": events}))

    def hooks() -> list:
        return [*events.callbacks["pre_execute"], *events.callbacks["post_execute"]]

    first, second = plotting.one_at_a_time(lambda x=1: x), plotting.one_at_a_time(lambda: 2)
    assert hooks() == [plotting._take_turn, plotting._give_turn]  # registered once
    assert first() == 1
    del first
    gc.collect()
    assert hooks() == [plotting._take_turn, plotting._give_turn], "a callback is still alive"
    del second
    gc.collect()
    assert hooks() == [], "a hook outlived every callback that needed it"
