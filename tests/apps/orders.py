"""A test app joining orders with payments and shipments, with keyed state:

    orders.py ORDERS.jsonl PAYMENTS.jsonl SHIPMENTS.jsonl OUT_DIR

- paid.jsonl: each order with the payments of its id made 0..1000 ms after it (interval join);
- shipped.jsonl: each order with the shipments of its id in the same 1 s window, orders
  without a shipment too (left window join);
- totals.jsonl: each customer's running total of paid amounts (stateful_map after the join).
Events carry ``"t"`` (epoch ms); up to 100 ms out of order.
"""

import os

from gearbus import Pipeline, TumblingWindows


def t(event):
    return event["t"]


def order_id(event):
    return event["order"]


def add(total, pair):
    total = (total or 0) + pair.right["amount"]
    return total, {"customer": pair.left["customer"], "total": total}


def application(args):
    orders_path, payments_path, shipments_path, out = args
    p = Pipeline("orders", parallelism=2, config={"executors": 2, "batch_records": 16})
    orders = p.read_jsonl(orders_path, timestamp_fn=t, max_out_of_orderness_ms=100, name="orders")
    payments = p.read_jsonl(payments_path, timestamp_fn=t, max_out_of_orderness_ms=100, name="payments")
    shipments = p.read_jsonl(shipments_path, timestamp_fn=t, max_out_of_orderness_ms=100, name="shipments")
    paid = orders.interval_join(payments, left_key=order_id, right_key=order_id, lower_ms=0, upper_ms=1000,
                                name="paid")
    (paid.map(lambda pair: [pair.left["order"], pair.right["payment"]], name="paid_ids")
         .write_jsonl(os.path.join(out, "paid.jsonl"), name="write_paid"))
    (paid.group_by(lambda pair: pair.left["customer"], name="by_customer")
         .stateful_map(add, name="running_total")
         .write_jsonl(os.path.join(out, "totals.jsonl"), name="write_totals"))
    (orders.join(shipments, left_key=order_id, right_key=order_id, window=TumblingWindows(1000), how="left",
                 name="shipped")
           .map(lambda pair: [pair.left["order"], pair.right and pair.right["shipment"]], name="shipped_ids")
           .write_jsonl(os.path.join(out, "shipped.jsonl"), name="write_shipped"))
    return p
