"""What one DynamoDB write costs the client, by how it is sent: plain HTTP against botocore.

    .venv/bin/python benchmarks/client_floor.py [--requests 3000] [--rounds 3] [--threads 8]

One DynamoDB Local, one table. Each round sends ``--requests`` conditional UpdateItems of a claim's
shape (a condition, four attributes set, ``ReturnValues=ALL_NEW``; each to an item of its own) from
``--threads`` threads of this process, once per way of sending, the order reversed every other
round (one warm-up round first, not counted):

* **plain HTTP**: the request body sent over keep-alive ``http.client`` with a signature DynamoDB
  Local accepts (it reads the access key only): no signing, no parsing of the answer;
* **botocore**, as the engine and the peer use it (through pynamodb): default settings;
* **botocore without parameter validation**, and **also without retries**: the two knobs a client
  could turn to make botocore cheaper.

Prints per way: requests/s, the client's CPU per request (this process, from /proc) and DynamoDB
Local's, and the rate as a share of plain HTTP's. The engine's task needs at least a put, a claim
and a finish: three such requests, whichever client sends them (issue 31).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import botocore.config
import botocore.session

sys.path.insert(0, str(Path(__file__).resolve().parent))
import throughput  # noqa: E402  - sets up the import paths and Powertools' switches
from coworker_local.database import embedded_database  # noqa: E402

TABLE = "client-floor"


def claim_like(key: str) -> dict:
    """An UpdateItem body shaped like a claim (a condition, several attributes, the new item back)."""
    return {"TableName": TABLE, "Key": {"key": {"S": key}},
            "UpdateExpression": "SET #s = :s, #o = :o, #e = :e ADD #a :one",
            "ConditionExpression": "attribute_not_exists(#o) OR #e < :now",
            "ExpressionAttributeNames": {"#s": "status", "#o": "lock_owner", "#e": "lock_expires_at",
                                         "#a": "attempts"},
            "ExpressionAttributeValues": {":s": {"S": "processing"}, ":o": {"S": "worker-1"},
                                          ":e": {"S": "2026-11-27T17:00:00.000000+0000"}, ":one": {"N": "1"},
                                          ":now": {"S": "2026-11-27T16:00:00.000000+0000"}},
            "ReturnValues": "ALL_NEW"}


def botocore_sender(endpoint: str, threads: int, config: botocore.config.Config) -> Callable[[list[dict]], None]:
    client = botocore.session.get_session().create_client(
        "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
        aws_secret_access_key="test", config=config.merge(botocore.config.Config(max_pool_connections=threads)))

    def send(bodies: list[dict]) -> None:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda body: client._make_api_call("UpdateItem", body), bodies))
    return send


def http_sender(endpoint: str, threads: int) -> Callable[[list[dict]], None]:
    where = urlsplit(endpoint)
    local = threading.local()
    authorization = ("AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, "
                     "SignedHeaders=host;x-amz-date;x-amz-target, Signature=" + "0" * 64)

    def one(body: bytes) -> None:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(str(where.hostname), where.port)
        connection.request("POST", "/", body=body, headers={
            "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "DynamoDB_20120810.UpdateItem",
            "X-Amz-Date": "20260101T000000Z", "Authorization": authorization})
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"DynamoDB Local answered {answer.status}")

    def send(bodies: list[dict]) -> None:
        encoded = [json.dumps(body).encode() for body in bodies]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(one, encoded))
    return send


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args(argv)
    print(f"$ .venv/bin/python benchmarks/client_floor.py --requests {args.requests} --rounds {args.rounds} "
          f"--threads {args.threads}")
    with embedded_database("dynamodb-local") as database:
        endpoint, pid = database.endpoint, getattr(database, "pid", None)
        admin = botocore.session.get_session().create_client(
            "dynamodb", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="test",
            aws_secret_access_key="test")
        admin.create_table(TableName=TABLE, KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
                           AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                           BillingMode="PAY_PER_REQUEST")
        ways = {
            "plain HTTP": http_sender(endpoint, args.threads),
            "botocore": botocore_sender(endpoint, args.threads, botocore.config.Config()),
            "botocore, no validation": botocore_sender(
                endpoint, args.threads, botocore.config.Config(parameter_validation=False)),
            "botocore, no validation, no retries": botocore_sender(
                endpoint, args.threads, botocore.config.Config(parameter_validation=False,
                                                               retries={"mode": "legacy", "max_attempts": 0})),
        }
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
        sent = 0
        for round_no in range(args.rounds + 1):
            order = list(ways.items()) if round_no % 2 == 0 else list(reversed(ways.items()))
            for name, send in order:
                bodies = [claim_like(f"item-{sent + n}") for n in range(args.requests)]
                sent += args.requests
                client0, server0 = throughput.process_cpu_seconds(os.getpid()), throughput.process_cpu_seconds(pid)
                started = time.perf_counter()
                send(bodies)
                seconds = time.perf_counter() - started
                client = throughput.process_cpu_seconds(os.getpid()) - client0
                server = throughput.process_cpu_seconds(pid) - server0
                if round_no:
                    results[name].append((args.requests / seconds, 1000 * client / args.requests,
                                          1000 * server / args.requests))
    plain = statistics.median(rate for rate, _, _ in results["plain HTTP"])
    print(f"\nMedians of {args.rounds} rounds ({args.threads} threads, {args.requests:,} requests a round):")
    for name, figures in results.items():
        rate = statistics.median(figure[0] for figure in figures)
        print(f"  {name:<37} {rate:7.1f} requests/s   CPU/request: client "
              f"{statistics.median(f[1] for f in figures):.3f} ms + DynamoDB Local "
              f"{statistics.median(f[2] for f in figures):.3f} ms   {rate / plain:.2f} of plain HTTP")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
