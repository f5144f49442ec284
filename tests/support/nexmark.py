"""An oracle for the Nexmark queries, independent of gearbus: DuckDB runs the nexmark
repository's Flink SQL (nexmark-flink/src/main/resources/queries/qN.sql), translated, over
an events file loaded into tables person, auction and bid.

Translation rules: ``dateTime`` and ``expires`` are epoch-ms BIGINTs; TUMBLE, HOP and
SESSION windows become millisecond arithmetic aligned to the epoch (windows half-open,
[start, start + size)); result columns keep the names of the query's sink table. Where
the repository's SQL differs from its own intent, the oracle follows the intent and says so:
Q7 selects ``B.price, B.bidder`` into the sink's (bidder, price) columns (swapped; here
each value goes to its own column). Q4's AVG is DuckDB's exact average (Flink's AVG of a
BIGINT truncates to a BIGINT). Q9's top bid per auction breaks ties of (price, dateTime)
by bidder, then extra (Flink keeps the first to arrive).

Q12 windows processing time, so it has no exact oracle: :func:`check_q12` checks what
any run must give.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
from decimal import Decimal

import duckdb

from gearbus.nexmark import COLUMNS

_SQL_TYPES = {int: "BIGINT", str: "VARCHAR"}


def _struct(kind: str) -> str:
    return "STRUCT(" + ", ".join(f'"{c}" {_SQL_TYPES[t]}' for c, t in COLUMNS[kind].items()) + ")"


def _tumble_start(column: str, size_ms: int) -> str:
    """The start of the epoch-aligned window of ``size_ms`` holding ``column`` (floor, also below 0)."""
    return f"({column} - ((({column} % {size_ms}) + {size_ms}) % {size_ms}))"


def _hop(table: str, columns: str, size_ms: int, slide_ms: int) -> str:
    """HOP(TABLE table, DESCRIPTOR(dateTime), slide, size): each row once per window holding it,
    with window_start and window_end."""
    last = _tumble_start('"dateTime"', slide_ms)
    return (f"(SELECT {columns}, {last} - k * {slide_ms} AS window_start, "
            f"{last} - k * {slide_ms} + {size_ms} AS window_end "
            f"FROM {table} CROSS JOIN range(0, {-(-size_ms // slide_ms)}) AS r(k) "
            f"WHERE \"dateTime\" < {last} - k * {slide_ms} + {size_ms})")


def _tumble(table: str, columns: str, size_ms: int) -> str:
    """TUMBLE(TABLE table, DESCRIPTOR(dateTime), size) with window_start and window_end."""
    start = _tumble_start('"dateTime"', size_ms)
    return f"(SELECT {columns}, {start} AS window_start, {start} + {size_ms} AS window_end FROM {table})"


QUERIES = {
    "q0": 'SELECT auction, bidder, price, "dateTime", extra FROM bid',
    "q1": 'SELECT auction, bidder, CAST(0.908 * price AS DECIMAL(23, 3)) AS price, "dateTime", extra FROM bid',
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """SELECT P.name, P.city, P.state, A.id
             FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
             WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    "q4": """SELECT Q.category AS id, AVG(Q.final) AS final
             FROM (SELECT MAX(B.price) AS final, A.category
                   FROM auction A, bid B
                   WHERE A.id = B.auction AND B."dateTime" BETWEEN A."dateTime" AND A.expires
                   GROUP BY A.id, A.category) Q
             GROUP BY Q.category""",
    "q5": f"""WITH AuctionBids AS (
                  SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
                  FROM {_hop("bid", "auction", 10_000, 2_000)}
                  GROUP BY auction, window_start, window_end),
              MaxBids AS (
                  SELECT max(num) AS maxn, starttime, endtime FROM AuctionBids GROUP BY starttime, endtime)
              SELECT AuctionBids.auction, AuctionBids.num
              FROM AuctionBids JOIN MaxBids
                ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
               AND AuctionBids.num >= MaxBids.maxn""",
    "q7": f"""SELECT B.auction, B.bidder, B.price, B."dateTime", B.extra
              FROM bid B
              JOIN (SELECT MAX(price) AS maxprice, window_end AS "dateTime"
                    FROM {_tumble("bid", "price", 10_000)}
                    GROUP BY window_start, window_end) B1
                ON B.price = B1.maxprice
              WHERE B."dateTime" BETWEEN B1."dateTime" - 10000 AND B1."dateTime\"""",
    "q8": f"""SELECT P.id, P.name, P.starttime AS stime
              FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
                    FROM {_tumble("person", "id, name", 10_000)}
                    GROUP BY id, name, window_start, window_end) P
              JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
                    FROM {_tumble("auction", "seller", 10_000)}
                    GROUP BY seller, window_start, window_end) A
                ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    "q9": """SELECT id, itemName, description, initialBid, reserve, "dateTime", expires, seller, category, extra,
                    auction, bidder, price, bid_dateTime, bid_extra
             FROM (SELECT A.*, B.auction, B.bidder, B.price, B."dateTime" AS bid_dateTime, B.extra AS bid_extra,
                          ROW_NUMBER() OVER (PARTITION BY A.id
                                             ORDER BY B.price DESC, B."dateTime" ASC, B.bidder, B.extra) AS rownum
                   FROM auction A, bid B
                   WHERE A.id = B.auction AND B."dateTime" BETWEEN A."dateTime" AND A.expires)
             WHERE rownum <= 1""",
    "q11": """WITH marked AS (
                  SELECT bidder, "dateTime",
                         CASE WHEN "dateTime" - lag("dateTime") OVER (PARTITION BY bidder ORDER BY "dateTime") <= 10000
                              THEN 0 ELSE 1 END AS opens
                  FROM bid),
              numbered AS (
                  SELECT bidder, "dateTime", SUM(opens) OVER (PARTITION BY bidder ORDER BY "dateTime") AS session
                  FROM marked)
              SELECT bidder, count(*) AS bid_count, min("dateTime") AS starttime, max("dateTime") + 10000 AS endtime
              FROM numbered GROUP BY bidder, session""",
}


def _files(events_path) -> list[str]:
    """An events file, or the part files of a directory (as the Spark runner writes)."""
    path = os.fspath(events_path)
    return sorted(glob.glob(os.path.join(path, "part-*"))) if os.path.isdir(path) else [path]


def load(events_path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with tables person, auction and bid from an events file."""
    db = duckdb.connect()
    columns = {"event_type": "INTEGER", **{kind: _struct(kind) for kind in COLUMNS}}
    db.execute("CREATE TABLE events AS SELECT * FROM read_json(?, format = 'newline_delimited', columns = ?)",
               [_files(events_path), columns])
    for code, kind in enumerate(COLUMNS):
        db.execute(f"CREATE TABLE {kind} AS SELECT {kind}.* FROM events WHERE event_type = {code}")
    return db


def oracle(query: str, events_path) -> list[dict]:
    """The rows of Nexmark query ``query`` ("q0" .. "q11") over an events file, keyed by the
    SQL's result columns (DECIMALs as floats)."""
    if query not in QUERIES:
        raise ValueError(f"no oracle for {query!r}; there is one for {', '.join(QUERIES)} (q12: check_q12)")
    db = load(events_path)
    try:
        cursor = db.execute(QUERIES[query])
        names = [d[0] for d in cursor.description]
        return [{n: float(v) if isinstance(v, Decimal) else v for n, v in zip(names, row)}
                for row in cursor.fetchall()]
    finally:
        db.close()


def check_q12(rows: list[dict], events_path) -> None:
    """What every Q12 run gives, whenever it runs: rows with the SQL's columns, 10 s windows
    aligned to the epoch, at most one row per bidder and window, and per bidder the counts
    adding up to the bidder's bids."""
    db = load(events_path)
    try:
        bids = dict(db.execute("SELECT bidder, count(*) FROM bid GROUP BY bidder").fetchall())
    finally:
        db.close()
    counted = collections.Counter()
    windows = set()
    for row in rows:
        assert set(row) == {"bidder", "bid_count", "starttime", "endtime"}, row
        assert row["starttime"] % 10_000 == 0 and row["endtime"] == row["starttime"] + 10_000, row
        assert row["bid_count"] >= 1, row
        assert (row["bidder"], row["starttime"]) not in windows, f"two rows for one bidder and window: {row}"
        windows.add((row["bidder"], row["starttime"]))
        counted[row["bidder"]] += row["bid_count"]
    assert counted == bids, f"per-bidder counts differ: {set(counted.items()) ^ set(bids.items())}"


def read_output(path) -> list[dict]:
    """A query's JSON Lines output: a file, or a directory of part files (the Spark runner)."""
    rows = []
    for name in _files(path):
        with open(name, encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def assert_same_rows(actual: list[dict], expected: list[dict], rel_tol: float = 1e-9) -> None:
    """Equal as multisets of rows, floats within ``rel_tol`` of each other."""

    def key(row: dict):
        return sorted((name, (1, round(v, 6)) if isinstance(v, float) else (0, v)) for name, v in row.items())

    assert len(actual) == len(expected), f"{len(actual)} rows, expected {len(expected)}"
    for got, want in zip(sorted(actual, key=key), sorted(expected, key=key)):
        assert got.keys() == want.keys(), f"columns {sorted(got)}, expected {sorted(want)}"
        for name, value in want.items():
            if isinstance(value, float) or isinstance(got[name], float):
                assert math.isclose(got[name], value, rel_tol=rel_tol), f"{name}: {got} vs expected {want}"
            else:
                assert got[name] == value, f"row {got}, expected {want}"
