#!/usr/bin/env python3
"""Put and get of whole objects through two Python S3 clients, boto3 and obstore, against one radosgw, alternating.

What the S3 tier (kvconnector/s3_tier.py) needs of a client: one PUT of a whole object from memory, one GET of a whole
object into memory, bounded time. Each round puts `--count` objects of each size through one client, reads them back
(compared), deletes them; the clients alternate round by round. Reported per client and size: median put and get
latency over all operations and MB/s (size / median latency), and obstore / boto3 as a ratio. One thread each, so
these are latency figures (one request in flight), what the tier's one call per entry sees.

Without --endpoint it starts its own Ceph cluster (deploy/ceph.py: root, the Ceph packages) and removes it after;
with --endpoint it uses AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment.

  python -m benchmarks.s3_clients                                 # 1, 4, 16 MiB; 5 rounds; about a minute
  python -m benchmarks.s3_clients --sizes 1MiB,16MiB --rounds 3 --endpoint http://HOST:7480
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvconnector.units import parse_size

MiB = 1 << 20
BUCKET = "kvtier-client-bench"


def boto3_client(endpoint: str, key: str, secret: str):
    import boto3
    from botocore.config import Config

    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(
            s3={"addressing_style": "path"},
            connect_timeout=5,
            read_timeout=30,
            retries={"max_attempts": 1, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )

    def put(name: str, data: bytes) -> None:
        s3.put_object(Bucket=BUCKET, Key=name, Body=data)

    def get(name: str) -> bytes:
        return s3.get_object(Bucket=BUCKET, Key=name)["Body"].read()

    def delete(name: str) -> None:
        s3.delete_object(Bucket=BUCKET, Key=name)

    return s3, put, get, delete


def obstore_client(endpoint: str, key: str, secret: str):
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=key,
        secret_access_key=secret,
        region="us-east-1",
        virtual_hosted_style_request=False,
        client_options={"allow_http": True, "connect_timeout": "5s", "timeout": "30s"},
    )

    def put(name: str, data: bytes) -> None:
        obstore.put(store, name, data)

    def get(name: str) -> bytes:
        return obstore.get(store, name).bytes()

    def delete(name: str) -> None:
        obstore.delete(store, name)

    return put, get, delete


def run(endpoint: str, key: str, secret: str, sizes: list[int], rounds: int, total_bytes: int) -> list[dict]:
    s3, *boto = boto3_client(endpoint, key, secret)
    s3.create_bucket(Bucket=BUCKET)
    clients = {"boto3": boto, "obstore": obstore_client(endpoint, key, secret)}
    lat = {(c, s, op): [] for c in clients for s in sizes for op in ("put", "get")}
    for r in range(rounds):
        order = list(clients) if r % 2 == 0 else list(reversed(clients))
        for size in sizes:
            data = os.urandom(size)
            count = max(2, total_bytes // size)
            for c in order:
                put, get, delete = clients[c]
                names = [f"{c}-{size}-{i}" for i in range(count)]
                for n in names:
                    t0 = time.perf_counter_ns()
                    put(n, data)
                    lat[c, size, "put"].append(time.perf_counter_ns() - t0)
                for n in names:
                    t0 = time.perf_counter_ns()
                    got = get(n)
                    lat[c, size, "get"].append(time.perf_counter_ns() - t0)
                    if bytes(got) != data:
                        sys.exit(f"{c}: object {n} came back different")
                for n in names:
                    delete(n)
    s3.delete_bucket(Bucket=BUCKET)
    rows = []
    for size in sizes:
        row = {"size_mib": size / MiB}
        for c in clients:
            for op in ("put", "get"):
                ms = statistics.median(lat[c, size, op]) / 1e6
                row[f"{c}_{op}_ms"] = ms
                row[f"{c}_{op}_mb_s"] = size / 1e6 / (ms / 1e3)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB", help="object sizes, comma-separated [1MiB,4MiB,16MiB]")
    ap.add_argument("--rounds", type=int, default=5, help="rounds per client (alternating) [5]")
    ap.add_argument("--bytes-per-round", default="64MiB", help="bytes each client puts per size and round [64MiB]")
    ap.add_argument("--endpoint", help="an S3 endpoint (keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
    args = ap.parse_args(argv)
    sizes = [int(parse_size(s)) for s in args.sizes.split(",")]
    total = int(parse_size(args.bytes_per_round))
    if args.endpoint:
        rows = run(args.endpoint, os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"], sizes,
                   args.rounds, total)  # fmt: skip
    else:
        from deploy import ceph

        why = ceph.missing()
        if why:
            sys.exit(f"cannot start a Ceph cluster: {why}")
        with tempfile.TemporaryDirectory(prefix="kvtier-s3-bench-") as d:
            t0 = time.monotonic()
            cluster = ceph.up(Path(d))
            print(f"ceph up in {time.monotonic() - t0:.1f} s at {cluster.endpoint}", file=sys.stderr)
            try:
                s3 = cluster.s3()
                rows = run(s3["endpoint"], s3["access_key"], s3["secret_key"], sizes, args.rounds, total)
            finally:
                ceph.down(Path(d))
    print("| object | put ms p50 boto3 / obstore | get ms p50 boto3 / obstore | put MB/s boto3 / obstore | "
          "get MB/s boto3 / obstore |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['size_mib']:g} MiB | {r['boto3_put_ms']:.1f} / {r['obstore_put_ms']:.1f} | "
            f"{r['boto3_get_ms']:.1f} / {r['obstore_get_ms']:.1f} | {r['boto3_put_mb_s']:.0f} / "
            f"{r['obstore_put_mb_s']:.0f} | {r['boto3_get_mb_s']:.0f} / {r['obstore_get_mb_s']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
