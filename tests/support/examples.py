"""Inputs for the windowed examples (pageviews, sensors, sessions) and the results they
must give, computed here independently of gearbus from each example's documented semantics."""

from __future__ import annotations

import collections
import random

MINUTE = 60_000


def pageview_events(count: int, seed: int = 5) -> list[dict]:
    rng = random.Random(seed)
    ts, events = 1_700_000_000_000, []
    for _ in range(count):
        ts += rng.randint(0, 900)
        events.append({"member": f"m{rng.randint(1, 12)}", "page": f"/p{rng.randint(1, 30)}", "ts": ts})
    return events


def expected_pageviews(events: list[dict]) -> list[dict]:
    """In-order input: every record is on time; the early trigger fires every 5."""
    totals = collections.Counter((e["member"], e["ts"] // 10_000 * 10_000) for e in events)
    rows = []
    for (member, start), total in totals.items():
        window = {"member": member, "window_start": start, "window_end": start + 10_000}
        rows += [{**window, "count": 5, "final": False}] * (total // 5)
        rows.append({**window, "count": total % 5, "final": True})
    return rows


def sensor_readings(seed: int = 11) -> list[dict]:
    """Readings every ~250 ms per sensor over ~40 minutes, shuffled up to 4 s out of
    order, plus stragglers placed in the file 90 s later (late, some still allowed) and
    400 s later (too late)."""
    rng = random.Random(seed)
    base, readings = 1_700_000_000_000, []
    for i in range(10_000):
        ts = base + i * 250 + rng.randint(0, 4000)
        readings.append({"sensor": f"s{i % 4}", "temp": round(rng.uniform(15, 25), 2), "ts": ts})
    readings.sort(key=lambda r: r["ts"] + rng.randint(0, 4000))
    stragglers = []
    for i in range(60):
        victim = readings.pop(rng.randrange(len(readings) // 2))
        stragglers.append((victim, rng.choice([90_000, 400_000])))
    for reading, delay in stragglers:
        position = next((j for j, r in enumerate(readings) if r["ts"] > reading["ts"] + delay), len(readings))
        readings.insert(position, reading)
    return readings


def expected_sensors(readings, max_delay, lateness, batch):
    """Simulate the documented semantics batch by batch: the watermark after a batch is
    the newest timestamp − max_delay − 1; ACCUMULATING panes; LATE panes for allowed
    stragglers; too-late ones dropped."""
    state, fired, rows, dropped, watermark = {}, set(), [], [], -(2**63)

    def emit(key, timing):
        total, n = state[key]
        rows.append({"sensor": key[0], "window_start": key[1], "window_end": key[1] + MINUTE,
                     "avg": round(total / n, 6), "count": n, "timing": timing})

    newest = -(2**63)
    for start in range(0, len(readings), batch):
        for r in readings[start:start + batch]:
            window = r["ts"] // MINUTE * MINUTE
            end_max = window + MINUTE - 1
            key = (r["sensor"], window)
            if end_max + lateness <= watermark:
                dropped.append(r)
                continue
            total, n = state.get(key, (0.0, 0))
            state[key] = (total + r["temp"], n + 1)
            if end_max <= watermark:
                emit(key, "late")
            newest = max(newest, r["ts"])
        watermark = newest - max_delay - 1
        for key in sorted(k for k in state if k not in fired and k[1] + MINUTE - 1 <= watermark):
            emit(key, "on_time")
            fired.add(key)
        for key in [k for k in state if k[1] + MINUTE - 1 + lateness <= watermark]:
            del state[key]
    for key in sorted(k for k in state if k not in fired):
        emit(key, "on_time")
    return rows, dropped


def clicks(seed: int = 17) -> list[dict]:
    rng = random.Random(seed)
    ts, events = 1_700_000_000_000, []
    for _ in range(4000):
        ts += rng.choice([200, 1_000, 5_000, 20_000, 31_000, 90_000]) // 8
        events.append({"user": f"u{rng.randint(1, 8)}", "page": f"/p{rng.randint(1, 6)}", "ts": ts})
    return events


def expected_sessions(events, gap):
    by_user = collections.defaultdict(list)
    for e in events:
        by_user[e["user"]].append(e)
    rows = []
    for user, evs in by_user.items():
        evs.sort(key=lambda e: e["ts"])
        session = [evs[0]]
        for e in evs[1:] + [None]:
            if e is not None and e["ts"] <= session[-1]["ts"] + gap:
                session.append(e)
                continue
            rows.append({"user": user, "session_start": session[0]["ts"], "session_end": session[-1]["ts"] + gap,
                         "events": len(session), "pages": sorted({s["page"] for s in session})})
            session = [e]
    return rows
