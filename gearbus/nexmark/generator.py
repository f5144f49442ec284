"""The Nexmark event generator: people, auctions and bids of an online auction site.

The model is Nexmark's (the nexmark repository's GeneratorConfig and Person, Auction and
Bid generators): events come in epochs of ``person:auction:bid`` = 1:3:46 events, ids are
consecutive per kind from 1000, most auctions are by a few *hot* sellers and most bids
go to hot auctions from hot bidders, and an auction's bids go to the auctions still in
flight. Event n happens at ``base_time_ms + n * 1000 // rate``.

What differs, and why:

- Event n's content is a pure function of ``(seed, n)``: every random draw is
  ``mix64(key(seed) + (n * FIELDS + field) * GAMMA)``, SplittableRandom's own mixing at a
  position fixed by the event number and the field. So any task can generate any event
  number, the same events come out whatever the parallelism, on every runner and on
  replay, and generation is vectorised over arrays of event numbers (numpy).
- References point only at what already exists: a bid's auction and bidder, and an
  auction's seller, have smaller event numbers (Nexmark also draws up to 10 ids ahead).
- Events are out of order, boundedly: a ``delayed_fraction`` of them get a ``dateTime``
  up to ``max_delay_ms`` before their slot, always less than the 4 s the queries'
  watermark allows (Nexmark's generator declares such delays but never applies them).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache

import numpy as np

PERSON, AUCTION, BID = "person", "auction", "bid"
KINDS = (PERSON, AUCTION, BID)
#: The JSON ``event_type`` of each kind, as in the Nexmark DDL.
EVENT_TYPES = {PERSON: 0, AUCTION: 1, BID: 2}
#: The whole event (``{"event_type", "person", "auction", "bid"}``), every kind in one stream.
EVENT = "event"

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
CATEGORIES = 5
#: Hot auctions, sellers and bidders: the first (bidders: the second) id of each batch of this many.
HOT_BATCH = 100
#: Every event keeps this bound: the queries' watermark trails the newest ``dateTime`` by 4 s.
WATERMARK_DELAY_MS = 4000
#: 2024-01-01T00:00:00Z: the default time of event 0 (fixed, so runs are repeatable).
DEFAULT_BASE_TIME_MS = 1_704_067_200_000

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS = 10_000

_FIELDS = 32  # random draws reserved per event
_GAMMA = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_POOL_CHARS = 1 << 20
_U64 = np.uint64


def _mix64(z):
    """SplittableRandom's finaliser: a bijection of uint64 that passes BigCrush."""
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _key(seed: int) -> np.ndarray:
    """The stream key of a seed (any int)."""
    return _mix64(np.array([(seed * _GAMMA + 0x632BE59BD9B4E019) & _MASK], dtype=_U64))


@cache
def _pool(spaces: bool) -> str:
    """1 MiB of random lower-case letters (with ~1 in 13 spaces for names and
    descriptions): random strings are slices of it at random offsets."""
    r = _mix64(np.arange(_POOL_CHARS, dtype=_U64) * _U64(_GAMMA) + _U64(7 if spaces else 3))
    chars = (r % _U64(26)).astype(np.uint8) + np.uint8(97)
    if spaces:
        chars[(r >> _U64(32)) % _U64(13) == 0] = 32
    return chars.tobytes().decode("ascii")


@cache
def _channels() -> tuple[np.ndarray, np.ndarray]:
    """(channel, url) by index: the hot channels first, then ``channel-0`` .. ``channel-9999``."""
    pool = _pool(False)
    r = _mix64(np.arange(4 * (len(HOT_CHANNELS) + CHANNELS), dtype=_U64) * _U64(_GAMMA) + _U64(11))
    offsets = (r % _U64(_POOL_CHARS - 8)).astype(np.int64).tolist()
    names, urls = list(HOT_CHANNELS), []
    for i in range(len(HOT_CHANNELS) + CHANNELS):
        a, b, c, d = offsets[4 * i: 4 * i + 4]
        url = f"https://www.nexmark.com/{pool[a:a + 3 + a % 2]}/{pool[b:b + 3 + b % 2]}/{pool[c:c + 3 + c % 2]}" \
              "/item.htm?query=1"
        channel = i - len(HOT_CHANNELS)
        if channel >= 0:
            names.append(f"channel-{channel}")
            if d % 10:
                url += f"&channel_id={(channel * 2654435761) % 2**31}"
        urls.append(url)
    return np.array(names, dtype=object), np.array(urls, dtype=object)


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generator makes; the defaults are Nexmark's standard configuration.

    ``rate``: events per second of event time (Nexmark's ``first-event.rate``); an endless
    generator source also emits them at this rate. ``delayed_fraction`` of the events are
    stamped 1..``max_delay_ms`` ms before their slot.
    """

    seed: int = 0
    rate: int = 10_000
    base_time_ms: int = DEFAULT_BASE_TIME_MS
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    in_flight_auctions: int = 100
    active_people: int = 1000
    delayed_fraction: float = 0.1
    max_delay_ms: int = 3000
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    def __post_init__(self):
        for name, value in asdict(self).items():
            if name == "delayed_fraction":
                if not 0 <= value <= 1:
                    raise ValueError(f"delayed_fraction must be between 0 and 1, got {value!r}")
            elif not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an int, got {value!r}")
            elif name not in ("seed", "base_time_ms", "max_delay_ms") and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if not 0 <= self.max_delay_ms < WATERMARK_DELAY_MS:
            raise ValueError(f"max_delay_ms must be >= 0 and below the {WATERMARK_DELAY_MS} ms the queries' "
                             f"watermark allows, got {self.max_delay_ms}")

    @property
    def epoch_events(self) -> int:
        """Events per epoch: one cycle of the proportions."""
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    def slot_time(self, n):
        """Event n's slot in event time (epoch ms); an int, or an int64 array for an array."""
        return self.base_time_ms + n * 1000 // self.rate


class Generator:
    """Generates events of one configuration, by event number."""

    def __init__(self, config: GeneratorConfig = GeneratorConfig()):
        self.config = config
        c = config
        self._key = _key(c.seed)
        auctions_start = c.person_proportion
        bids_start = auctions_start + c.auction_proportion
        self._offsets = {PERSON: np.arange(0, auctions_start), AUCTION: np.arange(auctions_start, bids_start),
                         BID: np.arange(bids_start, c.epoch_events), EVENT: np.arange(c.epoch_events)}
        self._make = {PERSON: self._persons, AUCTION: self._auctions, BID: self._bids}

    # --- which event numbers ------------------------------------------------------------

    def numbers(self, kind: str, start: int, stop: int | None, index: int = 0, parallelism: int = 1,
                limit: int | None = None) -> np.ndarray:
        """The event numbers of ``kind`` (or EVENT: all) in [start, stop) (stop None: no end,
        then ``limit`` is needed) that task ``index`` of ``parallelism`` owns, ascending, at
        most ``limit``. A task owns whole epochs, every ``parallelism``-th one, so each
        task gets every kind in proportion and the tasks' event times advance together."""
        offsets, per_epoch = self._offsets[kind], self.config.epoch_events
        first = start // per_epoch
        first += (index - first) % parallelism
        epochs = (limit // len(offsets) + 2) if limit is not None else 0
        if stop is not None:
            owned = max((stop - 1) // per_epoch - first, -1) // parallelism + 1
            epochs = owned if limit is None else min(epochs, owned)
        numbers = ((first + parallelism * np.arange(epochs, dtype=np.int64))[:, None] * per_epoch
                   + offsets[None, :]).ravel()
        keep = numbers >= start
        if stop is not None:
            keep &= numbers < stop
        numbers = numbers[keep]
        return numbers if limit is None else numbers[:limit]

    # --- what they are ------------------------------------------------------------------

    def values(self, kind: str, numbers: np.ndarray) -> tuple[list[dict], list[int]]:
        """The events numbered ``numbers`` (all of ``kind``; EVENT: the whole events, any
        kind) and their ``dateTime`` s."""
        if kind != EVENT:
            return self._make[kind](numbers)
        values: list = [None] * len(numbers)
        times: list = [0] * len(numbers)
        offsets = numbers % self.config.epoch_events
        for part, inner in zip(KINDS, self._split(offsets)):
            positions = np.flatnonzero(inner)
            if not len(positions):
                continue
            made, made_times = self._make[part](numbers[positions])
            code = EVENT_TYPES[part]
            for i, value, ts in zip(positions.tolist(), made, made_times):
                event = {"event_type": code, PERSON: None, AUCTION: None, BID: None}
                event[part] = value
                values[i], times[i] = event, ts
        return values, times

    def events(self, start: int, stop: int) -> list[dict]:
        """Events ``start`` .. ``stop - 1``, whole, in order."""
        return self.values(EVENT, self.numbers(EVENT, start, stop))[0]

    def _split(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.config
        person = offsets < c.person_proportion
        bid = offsets >= c.person_proportion + c.auction_proportion
        return person, ~(person | bid), bid

    # --- the draws ------------------------------------------------------------------------

    def _uniform(self, numbers: np.ndarray, field: int) -> np.ndarray:
        """Uniform floats in [0, 1): draw ``field`` of each event number."""
        z = (numbers.astype(_U64) * _U64(_FIELDS) + _U64(field)) * _U64(_GAMMA) + self._key
        return (_mix64(z) >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))

    def _below(self, numbers: np.ndarray, field: int, bound) -> np.ndarray:
        """Uniform ints in [0, bound) (``bound``: an int or an array)."""
        return (self._uniform(numbers, field) * bound).astype(np.int64)

    def _times(self, numbers: np.ndarray) -> np.ndarray:
        """``dateTime``: the slot, less a delay for the delayed fraction."""
        c = self.config
        times = c.slot_time(numbers)
        if c.max_delay_ms and c.delayed_fraction:
            delayed = self._uniform(numbers, 0) < c.delayed_fraction
            times = times - delayed * (1 + self._below(numbers, 1, c.max_delay_ms))
        return times

    def _last_person(self, numbers: np.ndarray) -> np.ndarray:
        """The newest person id (base 0) at each event number: its own for a person."""
        c = self.config
        epoch, offset = np.divmod(numbers, c.epoch_events)
        return epoch * c.person_proportion + np.minimum(offset, c.person_proportion - 1)

    def _last_auction(self, numbers: np.ndarray) -> np.ndarray:
        """The newest auction id (base 0) at each event number: its own for an auction."""
        c = self.config
        epoch, offset = np.divmod(numbers, c.epoch_events)
        return epoch * c.auction_proportion + np.clip(offset - c.person_proportion, -1, c.auction_proportion - 1)

    def _person_ref(self, numbers: np.ndarray, field: int, last: np.ndarray) -> np.ndarray:
        """A random one of the ``active_people`` newest people, by id (base 0)."""
        active = np.minimum(last + 1, self.config.active_people)
        return last + 1 - active + self._below(numbers, field, active)

    def _price(self, numbers: np.ndarray, field: int) -> np.ndarray:
        """Log-uniform between 1 and 1,000,000 dollars, in cents."""
        return np.round(10.0 ** (self._uniform(numbers, field) * 6.0) * 100.0).astype(np.int64)

    def _extra_lengths(self, numbers: np.ndarray, field: int, average_left: np.ndarray) -> np.ndarray:
        """Padding lengths that bring an event to its average size: ±20% around what is left."""
        left = np.maximum(average_left, 0)
        delta = np.round(left * 0.2).astype(np.int64)
        return left - delta + self._below(numbers, field, 2 * delta)

    def _slices(self, numbers: np.ndarray, field: int, lengths: np.ndarray) -> list[int]:
        """Offsets in the pool of strings of ``lengths``."""
        return self._below(numbers, field, _POOL_CHARS - lengths).tolist()

    # --- the kinds ------------------------------------------------------------------------

    def _persons(self, numbers: np.ndarray) -> tuple[list[dict], list[int]]:
        c = self.config
        ids = (FIRST_PERSON_ID + self._last_person(numbers)).tolist()
        times = self._times(numbers).tolist()
        first = self._below(numbers, 2, len(FIRST_NAMES)).tolist()
        last = self._below(numbers, 3, len(LAST_NAMES)).tolist()
        user_len, domain_len = 3 + self._below(numbers, 4, 4), 3 + self._below(numbers, 5, 2)
        users, domains = self._slices(numbers, 6, user_len), self._slices(numbers, 7, domain_len)
        user_len, domain_len = user_len.tolist(), domain_len.tolist()
        cards = [self._below(numbers, 8 + i, 10_000).tolist() for i in range(4)]
        cities = self._below(numbers, 12, len(US_CITIES)).tolist()
        states = self._below(numbers, 13, len(US_STATES)).tolist()
        pool = _pool(False)
        people = []
        for i, person_id in enumerate(ids):
            name = f"{FIRST_NAMES[first[i]]} {LAST_NAMES[last[i]]}"
            email = f"{pool[users[i]:users[i] + user_len[i]]}@{pool[domains[i]:domains[i] + domain_len[i]]}.com"
            card = f"{cards[0][i]:04d} {cards[1][i]:04d} {cards[2][i]:04d} {cards[3][i]:04d}"
            people.append({"id": person_id, "name": name, "emailAddress": email, "creditCard": card,
                           "city": US_CITIES[cities[i]], "state": US_STATES[states[i]], "dateTime": times[i],
                           "extra": ""})
        sizes = np.array([8 + len(p["name"]) + len(p["emailAddress"]) + len(p["creditCard"]) + len(p["city"])
                          + len(p["state"]) for p in people], dtype=np.int64)
        lengths = self._extra_lengths(numbers, 14, c.avg_person_bytes - sizes)
        for person, offset, length in zip(people, self._slices(numbers, 15, lengths), lengths.tolist()):
            person["extra"] = pool[offset:offset + length]
        return people, times

    def _auctions(self, numbers: np.ndarray) -> tuple[list[dict], list[int]]:
        c = self.config
        ids = (FIRST_AUCTION_ID + self._last_auction(numbers)).tolist()
        times = self._times(numbers)
        last_person = self._last_person(numbers)
        hot = self._below(numbers, 2, c.hot_sellers_ratio) > 0
        sellers = FIRST_PERSON_ID + np.where(hot, last_person // HOT_BATCH * HOT_BATCH,
                                             self._person_ref(numbers, 3, last_person))
        categories = FIRST_CATEGORY_ID + self._below(numbers, 4, CATEGORIES)
        initial = self._price(numbers, 5)
        reserve = initial + self._price(numbers, 6)
        # Auctions last twice, on average, the time ``in_flight_auctions`` more auctions take.
        ahead = c.in_flight_auctions * c.epoch_events // c.auction_proportion
        horizon = c.slot_time(numbers + ahead) - c.slot_time(numbers)
        expires = times + 1 + self._below(numbers, 7, np.maximum(2 * horizon, 1))
        name_len, desc_len = 3 + self._below(numbers, 8, 17), 3 + self._below(numbers, 9, 97)
        names, descs = self._slices(numbers, 10, name_len), self._slices(numbers, 11, desc_len)
        text, pool = _pool(True), _pool(False)
        items = [text[o:o + n].strip() for o, n in zip(names, name_len.tolist())]
        descriptions = [text[o:o + n].strip() for o, n in zip(descs, desc_len.tolist())]
        sizes = np.fromiter((len(a) + len(b) for a, b in zip(items, descriptions)), np.int64, len(items)) + 48
        lengths = self._extra_lengths(numbers, 12, c.avg_auction_bytes - sizes)
        times = times.tolist()
        return [{"id": i, "itemName": item, "description": desc, "initialBid": bid, "reserve": res, "dateTime": t,
                 "expires": e, "seller": s, "category": cat, "extra": pool[o:o + n]}
                for i, item, desc, bid, res, t, e, s, cat, o, n in zip(
                    ids, items, descriptions, initial.tolist(), reserve.tolist(), times, expires.tolist(),
                    sellers.tolist(), categories.tolist(), self._slices(numbers, 13, lengths), lengths.tolist())
                ], times

    def _bids(self, numbers: np.ndarray) -> tuple[list[dict], list[int]]:
        c = self.config
        last_auction = self._last_auction(numbers)
        hot = self._below(numbers, 2, c.hot_auction_ratio) > 0
        oldest = np.maximum(last_auction - c.in_flight_auctions, 0)
        auctions = FIRST_AUCTION_ID + np.where(hot, last_auction // HOT_BATCH * HOT_BATCH,
                                               oldest + self._below(numbers, 3, last_auction - oldest + 1))
        last_person = self._last_person(numbers)
        hot = self._below(numbers, 4, c.hot_bidders_ratio) > 0
        # The second person of the batch, so hot bidders are not the hot sellers (once it exists).
        hot_bidder = np.minimum(last_person // HOT_BATCH * HOT_BATCH + 1, last_person)
        bidders = FIRST_PERSON_ID + np.where(hot, hot_bidder, self._person_ref(numbers, 5, last_person))
        prices = self._price(numbers, 6)
        channel = np.where(self._below(numbers, 7, 2) > 0, self._below(numbers, 8, len(HOT_CHANNELS)),
                           len(HOT_CHANNELS) + self._below(numbers, 9, CHANNELS))
        names, urls = _channels()
        lengths = self._extra_lengths(numbers, 10, np.full(len(numbers), c.avg_bid_bytes - 32))
        times = self._times(numbers).tolist()
        pool = _pool(False)
        return [{"auction": a, "bidder": b, "price": p, "channel": ch, "url": u, "dateTime": t, "extra": pool[o:o + n]}
                for a, b, p, ch, u, t, o, n in zip(
                    auctions.tolist(), bidders.tolist(), prices.tolist(), names[channel].tolist(),
                    urls[channel].tolist(), times, self._slices(numbers, 11, lengths), lengths.tolist())
                ], times
