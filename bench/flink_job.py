"""One Nexmark query on Apache Flink (PyFlink's Table API, a local mini-cluster), over an
events file: what bench/nexmark_flink.py times beside gearbus. It runs in the virtual
environment that bench keeps for PyFlink, so it imports nothing of gearbus.

    python flink_job.py QUERY EVENTS.jsonl --checkpoint-dir DIR [--parallelism 2]
                        [--state hashmap|rocksdb] [--rows OUT.jsonl]

The queries are the nexmark repository's SQL (nexmark-flink/src/main/resources/queries),
unchanged but for two adaptations to an events file instead of its generator: the table
reads the file with the filesystem connector's JSON format, and since the file's times are
epoch milliseconds (as gearbus's events files are) the table and the views turn
``dateTime`` and ``expires`` into TIMESTAMP(3) (in UTC) where the repository's generator
makes them so. The watermark is the repository's, 4 s behind ``dateTime``. The Flink
configuration is the repository's (mini-batch, split distinct aggregates, incremental
checkpoints) with checkpoints every second, exactly-once, as gearbus's.

Without ``--rows`` the results go to the repository's blackhole sinks (what is timed);
with it the same sink table is a filesystem sink in the Debezium JSON changelog format
(updating queries, q4 and q9, retract rows), which is applied once the job has ended and
the final rows written as JSON Lines keyed by the sink's columns, times as epoch ms: what
``--check`` holds against the oracle. Prints one JSON line: ``{"query", "running_s"}``,
running being the job's time from submission to its end.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import shutil
import sys
import time

_MS = "CAST(TO_TIMESTAMP_LTZ({}, 3) AS TIMESTAMP(3))"

EVENTS_DDL = """
CREATE TABLE nexmark_events (
    event_type INT,
    person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR,
               state VARCHAR, `dateTime` BIGINT, extra VARCHAR>,
    auction ROW<id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT,
                `dateTime` BIGINT, expires BIGINT, seller BIGINT, category BIGINT, extra VARCHAR>,
    bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR,
            `dateTime` BIGINT, extra VARCHAR>,
    `dateTime` AS """ + _MS.format("""CASE WHEN event_type = 0 THEN person.`dateTime`
                                           WHEN event_type = 1 THEN auction.`dateTime`
                                           ELSE bid.`dateTime` END""") + """,
    WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')
"""

VIEWS = [
    """CREATE VIEW person AS SELECT person.id, person.name, person.emailAddress, person.creditCard,
       person.city, person.state, `dateTime`, person.extra FROM nexmark_events WHERE event_type = 0""",
    """CREATE VIEW auction AS SELECT auction.id, auction.itemName, auction.description, auction.initialBid,
       auction.reserve, `dateTime`, """ + _MS.format("auction.expires") + """ AS expires, auction.seller,
       auction.category, auction.extra FROM nexmark_events WHERE event_type = 1""",
    """CREATE VIEW bid AS SELECT bid.auction, bid.bidder, bid.price, bid.channel, bid.url, `dateTime`,
       bid.extra FROM nexmark_events WHERE event_type = 2""",
]

#: Per query: the sink's columns (name and type) and the SELECT the repository inserts into it.
QUERIES = {
    "q0": ("auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra VARCHAR",
           "SELECT auction, bidder, price, `dateTime`, extra FROM bid"),
    "q1": ("auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` TIMESTAMP(3), extra VARCHAR",
           "SELECT auction, bidder, 0.908 * price as price, `dateTime`, extra FROM bid"),
    "q2": ("auction BIGINT, price BIGINT",
           "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": ("name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
           """SELECT P.name, P.city, P.state, A.id
              FROM auction AS A INNER JOIN person AS P on A.seller = P.id
              WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"""),
    "q4": ("id BIGINT, final BIGINT",
           """SELECT Q.category, AVG(Q.final)
              FROM (SELECT MAX(B.price) AS final, A.category
                    FROM auction A, bid B
                    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
                    GROUP BY A.id, A.category) Q
              GROUP BY Q.category"""),
    "q5": ("auction BIGINT, num BIGINT",
           """SELECT AuctionBids.auction, AuctionBids.num
              FROM (SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
                    FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
                    GROUP BY auction, window_start, window_end) AS AuctionBids
              JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
                    FROM (SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
                          FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND,
                                         INTERVAL '10' SECOND))
                          GROUP BY auction, window_start, window_end) AS CountBids
                    GROUP BY CountBids.starttime, CountBids.endtime) AS MaxBids
              ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime AND
                 AuctionBids.num >= MaxBids.maxn"""),
    "q7": ("auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` TIMESTAMP(3), extra VARCHAR",
           """SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
              from bid B
              JOIN (SELECT MAX(price) AS maxprice, window_end as `dateTime`
                    FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                    GROUP BY window_start, window_end) B1
              ON B.price = B1.maxprice
              WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`"""),
    "q8": ("id BIGINT, name VARCHAR, stime TIMESTAMP(3)",
           """SELECT P.id, P.name, P.starttime
              FROM (SELECT id, name, window_start AS starttime, window_end AS endtime
                    FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                    GROUP BY id, name, window_start, window_end) P
              JOIN (SELECT seller, window_start AS starttime, window_end AS endtime
                    FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
                    GROUP BY seller, window_start, window_end) A
              ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"""),
    "q9": ("id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
           "`dateTime` TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR, "
           "auction BIGINT, bidder BIGINT, price BIGINT, bid_dateTime TIMESTAMP(3), bid_extra VARCHAR",
           """SELECT id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra,
                     auction, bidder, price, bid_dateTime, bid_extra
              FROM (SELECT A.*, B.auction, B.bidder, B.price, B.`dateTime` AS bid_dateTime, B.extra AS bid_extra,
                           ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
                    FROM auction A, bid B
                    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires)
              WHERE rownum <= 1"""),
    "q11": ("bidder BIGINT, bid_count BIGINT, starttime TIMESTAMP(3), endtime TIMESTAMP(3)",
            """SELECT B.bidder, count(*) as bid_count,
                      SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime,
                      SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime
               FROM bid B
               GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)"""),
}

#: The nexmark repository's Flink configuration (conf/config.yaml, config_v2.yaml) that
#: applies to one machine, with gearbus's checkpoint interval.
CONFIGURATION = {
    "execution.runtime-mode": "streaming",
    "execution.checkpointing.interval": "1 s",
    "execution.checkpointing.mode": "EXACTLY_ONCE",
    "execution.checkpointing.incremental": "true",
    "table.exec.mini-batch.enabled": "true",
    "table.exec.mini-batch.allow-latency": "2 s",
    "table.exec.mini-batch.size": "50000",
    "table.optimizer.distinct-agg.split.enabled": "true",
    "table.local-time-zone": "UTC",
}

_EPOCH = datetime.datetime(1970, 1, 1)
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?")


def sink_columns(query: str) -> list[str]:
    """The names of a query's sink columns (commas inside a type's parentheses do not split)."""
    return [column.split()[0].strip("`") for column in re.split(r",(?![^()]*\))", QUERIES[query][0])]


def plain(value):
    """A value of the changelog file as the oracle gives it: times as epoch ms."""
    if isinstance(value, str) and _TIMESTAMP.fullmatch(value):
        moment = datetime.datetime.fromisoformat(value.replace(" ", "T"))
        return (moment - _EPOCH) // datetime.timedelta(milliseconds=1)
    return value


def final_rows(query: str, directory: str) -> list[dict]:
    """The rows left once the changelog the sink wrote (Debezium JSON: ``before``, ``after``,
    ``op``) is applied in order, keyed by the sink's columns. Part files in progress (names
    starting with a dot) hold nothing committed and are skipped."""
    live = collections.Counter()
    names = sink_columns(query)
    parts = sorted(os.path.join(root, name) for root, _, files in os.walk(directory) for name in files
                   if not name.startswith("."))
    for part in parts:
        with open(part, encoding="utf-8") as changes:
            for line in changes:
                change = json.loads(line)
                for side, sign in (("before", -1), ("after", 1)):
                    if change.get(side) is not None:
                        live[tuple(plain(change[side][n]) for n in names)] += sign
    if any(count < 0 for count in live.values()):
        raise RuntimeError(f"{query}: the changelog retracts a row it never added")
    return [dict(zip(names, values)) for values, count in live.items() for _ in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("query", choices=sorted(QUERIES))
    parser.add_argument("events", help="the events file (JSON Lines)")
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--state", choices=("hashmap", "rocksdb"), default="hashmap")
    parser.add_argument("--rows", metavar="OUT.jsonl",
                        help="write the final rows to this file instead of the blackhole")
    opts = parser.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment

    settings = EnvironmentSettings.in_streaming_mode()
    env = TableEnvironment.create(settings)
    config = env.get_config()
    for key, value in {**CONFIGURATION, "parallelism.default": str(opts.parallelism),
                       "state.backend.type": opts.state,
                       "execution.checkpointing.dir": "file://" + os.path.abspath(opts.checkpoint_dir)}.items():
        config.set(key, value)
    env.execute_sql(EVENTS_DDL.format(path=os.path.abspath(opts.events)))
    for view in VIEWS:
        env.execute_sql(view)
    columns, select = QUERIES[opts.query]
    changelog = os.path.abspath(opts.rows) + ".changelog" if opts.rows else None
    if changelog:
        shutil.rmtree(changelog, ignore_errors=True)
    sink = (f"'connector' = 'filesystem', 'path' = '{changelog}', 'format' = 'debezium-json'" if changelog
            else "'connector' = 'blackhole'")
    env.execute_sql(f"CREATE TABLE nexmark_{opts.query} ({columns}) WITH ({sink})")
    started = time.perf_counter()
    env.execute_sql(f"INSERT INTO nexmark_{opts.query} {select}").wait()
    running = time.perf_counter() - started
    if changelog:
        with open(opts.rows, "w", encoding="utf-8") as out:
            out.writelines(json.dumps(row) + "\n" for row in final_rows(opts.query, changelog))
    print(json.dumps({"query": opts.query, "running_s": running}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
