"""The winning bid of each auction (Nexmark's WinningBids, shared by Q4 and Q9): the
highest bid made between the auction's ``dateTime`` and its ``expires`` (inclusive), the
earliest of equal prices first, then the lowest bidder and ``extra`` (the oracle's order).

A keyed state machine per auction id (as Beam's Nexmark writes it with state and
timers): the auction and its best bid so far, bids that came before their auction, and
an event-time timer at ``expires``, when no bid that may still come can win. Its state
holds the auctions in flight and nothing else once the watermark passes them.
"""

from __future__ import annotations

from gearbus.api.dsl import BaseStream
from gearbus.api.keyed import KeyedContext, KeyedProcessFunction

AUCTION_SIDE, BID_SIDE = "auction", "bid"


def _rank(bid: dict) -> tuple:
    """Smaller is better."""
    return -bid["price"], bid["dateTime"], bid["bidder"], bid["extra"]


def _tagged_auction(auction: dict) -> tuple:
    return AUCTION_SIDE, auction


def _tagged_bid(bid: dict) -> tuple:
    return BID_SIDE, bid


def _auction_id(tagged: tuple) -> int:
    side, row = tagged
    return row["id"] if side == AUCTION_SIDE else row["auction"]


class WinningBid(KeyedProcessFunction):
    """State per auction id: ``{"auction": row | None, "best": bid | None, "early": [bids]}``."""

    def process(self, tagged: tuple, ctx: KeyedContext) -> None:
        side, row = tagged
        state = ctx.state or {"auction": None, "best": None, "early": []}
        if side == AUCTION_SIDE:
            state["auction"] = row
            for bid in state["early"]:
                self._offer(state, bid)
            state["early"] = []
            ctx.register_event_time_timer(row["expires"])
        elif state["auction"] is None:
            # Its auction is yet to come; if the watermark reaches the bid first, the auction
            # started after it and the bid cannot count.
            state["early"].append(row)
            ctx.register_event_time_timer(row["dateTime"])
        else:
            self._offer(state, row)
        ctx.state = state

    @staticmethod
    def _offer(state: dict, bid: dict) -> None:
        auction, best = state["auction"], state["best"]
        if auction["dateTime"] <= bid["dateTime"] <= auction["expires"] and (best is None or _rank(bid) < _rank(best)):
            state["best"] = bid

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> None:
        state = ctx.state
        if state is None:
            return
        auction = state["auction"]
        if auction is None:
            state["early"] = [bid for bid in state["early"] if bid["dateTime"] > timestamp]
            ctx.state = state if state["early"] else None
        elif timestamp == auction["expires"]:
            if state["best"] is not None:
                ctx.emit((auction, state["best"]))
            ctx.state = None


def winning_bids(auctions: BaseStream, bids: BaseStream, name: str = "winning_bids") -> BaseStream:
    """``(auction, winning bid)`` per auction with a valid bid, once it expires."""
    both = auctions.map(_tagged_auction, name=f"{name}_auctions").merge(
        bids.map(_tagged_bid, name=f"{name}_bids"), name=f"{name}_inputs")
    return both.group_by(_auction_id, name=f"{name}_by_auction").process_keyed(WinningBid, name=name)
