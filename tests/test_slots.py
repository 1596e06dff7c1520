"""The slots of a listener shared by the workers of one server: the limits are the server's."""

from __future__ import annotations

from pathlib import Path

from futoin_evt.slots import (
    AMQP_CELL,
    WEBSOCKET_CELL,
    GroupShare,
    SharedCount,
    Slots,
    clear_counts,
    create_counts,
)


class Sock:
    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


def workers(
    tmp_path: Path, count: int, limit: int, handshakes: int | None = None
) -> list[Slots[Sock]]:
    """The WebSocket port's slots of each worker of a group, as its workers make them."""
    create_counts(tmp_path / "counts", count)
    return [
        Slots(
            "test",
            limit,
            handshakes,
            shared=SharedCount(GroupShare(tmp_path / "counts", slot, count), WEBSOCKET_CELL),
        )
        for slot in range(count)
    ]


def logged_in(slots: Slots[Sock], peer: str = "10.0.0.1:1") -> tuple[Sock, bool]:
    sock = Sock()
    slots.open(sock, peer)
    return sock, slots.establish(sock)


def test_established_connections_are_counted_for_the_group(tmp_path: Path) -> None:
    first, second = workers(tmp_path, 2, 3)
    held = [logged_in(first)[0], logged_in(first)[0]]
    assert logged_in(second)[1]
    assert not logged_in(first)[1]
    assert not logged_in(second)[1]
    assert (first.refused, second.refused) == (1, 1)
    first.close(held[0])  # a slot freed on one worker serves the other
    assert logged_in(second)[1]
    assert not logged_in(first)[1]


def test_each_door_and_each_group_counts_apart(tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    websocket = workers(tmp_path, 2, 1)[0]
    other_group = workers(tmp_path / "other", 2, 1)[1]
    amqp: Slots[Sock] = Slots(
        "amqp", 1, shared=SharedCount(GroupShare(tmp_path / "counts", 1, 2), AMQP_CELL)
    )
    assert logged_in(websocket)[1]
    assert logged_in(amqp)[1]
    assert logged_in(other_group)[1]


def test_the_counts_of_a_worker_that_exited_are_cleared(tmp_path: Path) -> None:
    first, second = workers(tmp_path, 2, 2)
    assert [logged_in(first)[1] for _ in range(2)] == [True, True]
    assert not logged_in(second)[1]
    clear_counts(tmp_path / "counts", 0)  # by the supervisor, once worker 0 is gone
    assert logged_in(second)[1]
    restarted: Slots[Sock] = Slots(
        "test", 2, shared=SharedCount(GroupShare(tmp_path / "counts", 0, 2), WEBSOCKET_CELL)
    )
    assert logged_in(restarted)[1]
    assert not logged_in(second)[1]


def test_the_handshake_budget_is_split_between_the_workers(tmp_path: Path) -> None:
    alone: Slots[Sock] = Slots("test", 100, 9)
    assert (alone.max_handshakes, alone.per_address) == (9, 4)
    shares = workers(tmp_path, 2, 100, 9)
    assert [(s.max_handshakes, s.per_address) for s in shares] == [(5, 2), (5, 2)]
    one_address = [Sock() for _ in range(3)]
    for sock in one_address:
        shares[0].open(sock, "10.0.0.1:1")
    assert [sock.aborted for sock in one_address] == [True, False, False]
    others = [Sock() for _ in range(4)]
    for i, sock in enumerate(others):
        shares[0].open(sock, f"10.0.1.{i}:1")
    assert shares[0].handshakes == 5
    assert [sock.aborted for sock in one_address] == [True, True, False]
