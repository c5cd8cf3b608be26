"""The order in which measurements take turns: no contestant always measured first (after an idle gap,
at higher clocks) or always right after the same other one."""

from __future__ import annotations

from collections.abc import Iterator


def take_turns(items: list, rounds: int) -> Iterator:
    """`items` `rounds` times over, each round starting with the next item: a, b, c, b, c, a, c, a, b."""
    for r in range(rounds if items else 0):
        turn = r % len(items)
        yield from items[turn:] + items[:turn]
