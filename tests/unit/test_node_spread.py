"""NodeSpread: each copy goes to the alive node with the fewest copies in flight, in turns among equals."""

from __future__ import annotations

from collections import Counter

from ferry.service.transfer.node_spread import NodeSpread


class _Nodes:
    def __init__(self, *nodes: str) -> None:
        self.nodes = list(nodes)
        self.asked = 0

    def __call__(self) -> list[str]:
        self.asked += 1
        return list(self.nodes)


def test_copies_one_after_another_take_turns_over_the_nodes() -> None:
    spread = NodeSpread(_Nodes("a", "b", "c"))
    got = []
    for _ in range(9):  # each copy ends before the next starts: all nodes are equal every time
        node = spread.acquire()
        got.append(node)
        spread.release(node)
    assert Counter(got) == {"a": 3, "b": 3, "c": 3}


def test_a_copy_goes_to_the_node_with_fewest_in_flight() -> None:
    spread = NodeSpread(_Nodes("a", "b"))
    held = [spread.acquire() for _ in range(4)]
    assert Counter(held) == {"a": 2, "b": 2}
    spread.release("a")
    spread.release("a")
    assert spread.acquire() == "a" and spread.acquire() == "a"  # b still has two in flight
    assert spread.acquire() in ("a", "b")


def test_the_node_list_is_refreshed_and_a_lost_task_asks_again() -> None:
    now = [0.0]
    nodes = _Nodes("a", "b")
    spread = NodeSpread(nodes, refresh_seconds=10, clock=lambda: now[0])
    spread.acquire()
    nodes.nodes = ["b"]  # a died
    now[0] = 5.0
    spread.acquire()
    assert nodes.asked == 1  # within the refresh time the listing stands
    spread.forget_listing()
    assert {spread.acquire() for _ in range(4)} == {"b"} and nodes.asked == 2
    nodes.nodes = ["b", "c"]
    now[0] = 20.0
    assert spread.acquire() == "c" and nodes.asked == 3  # the new node has none in flight


def test_no_known_node_leaves_the_choice_to_ray() -> None:
    spread = NodeSpread(_Nodes())
    assert spread.acquire() is None
    spread.release(None)
