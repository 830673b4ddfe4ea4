"""An S3 object store as a tier (boto3; tested against Ceph's radosgw). One object per entry: the 4 KiB header page
of a disk entry (key, length, shape, dtype, payload checksum), then the payload, under `<prefix><hash of the key>.kv`,
so a key never reaches the store unescaped. Several instances may share a bucket and prefix, so this is a shared
tier: a key missing from this instance's index is probed there, and on start the prefix is listed and adopted.

What kvtier relies on, and how it holds (each checked by tests/kvconnector/test_s3_tier.py against a real radosgw):
- atomic visibility: an S3 PUT is all or nothing: a GET returns the previous object (or none) until the new one is
  whole, never part of it (AWS S3 User Guide, "Amazon S3 data consistency model": a PUT of an object is atomic; Ceph
  radosgw writes an object's data first and makes it visible by one atomic write of its head). A reader polling
  entries while another instance puts them sees misses or whole entries only (tested).
- integrity: every read checks the object's length (Content-Length) against the entry's, the header (magic, its
  own checksum, key, length) and the payload's xxh3 checksum, so a damaged or foreign object is refused
  (`CorruptEntryError`: the store drops the entry, counts `corrupt_dropped`, and deletes the object), never served.
- bounded time: boto3's `connect_timeout` and `read_timeout` are `timeout_s` (capped at 5 s for the connect) and each
  call is tried `max_attempts` times in all (botocore's `standard` retry mode: exponential backoff with jitter
  between tries, under a second before the first retry, at most 20 s: boto3 docs, "Retries"), so a dead or hung
  endpoint costs a call about max_attempts x (connect or read timeout) plus the backoff, never a hang (tested with
  the default 2 tries: radosgw SIGSTOPped, then killed).
- errors: a call the store cannot answer (refused connection, timeout, a 5xx) becomes the `OSError` the store
  counts for any tier (`read_errors`, `write_errors` here); a missing object (404, NoSuchKey) is `EntryNotFound`.
- capacity: kvtier accounts for what this instance put or adopted (`capacity_bytes`), as for the other tiers, and
  deletes the object of an entry it evicts; the bucket itself has no limit kvtier knows of.
Device time is the S3 call (request, transfer of the body); host time the header, checksum and copies. A put copies
the payload once (header and payload into one body); a get reads the header, then the payload straight into the
caller's buffer (`StreamingBody.readinto`).

Credentials and endpoint come as boto3 users expect: the arguments if given, otherwise `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` and `AWS_ENDPOINT_URL` from the environment (boto3's own lookup: boto3 docs, "Credentials"
and "Configuration"). Path-style addressing (`bucket` in the path, as radosgw serves without DNS); request and response
checksums only where S3 requires them (`when_required`, botocore 1.36 on): kvtier checks its own xxh3 checksum on
every read, and botocore's default CRC32 would be a second pass over every payload on the host (radosgw of Ceph 16
accepts both ways: checked).

Why boto3, not obstore: measured with `python -m benchmarks.s3_clients` (boto3 1.44.18, obstore 0.12.1; one client,
one request in flight, radosgw of Ceph 16.2.15 with three memstore OSDs on a 2-core machine shared with other work;
table in kvconnector/README.md): obstore is ahead for small objects (128 KiB: put 4.7 against 6.6 ms, get 1.6
against 3.5 ms; 1 MiB: put 12.6 against 14.8 ms, get 2.9 against 4.1 ms: boto3 does more per request), the two
are even at 4 MiB, and boto3 is ahead at 16 MiB (put 118 against 218 ms, get 44 against 54 ms). boto3 is kept: ahead
or even from 4 MiB (an LMCache chunk of 256 tokens of Llama-3-8B is 32 MiB: 32 layers x 8 KV heads x 128 x K and V
x 2 bytes x 256), with timeouts and retries that are botocore's documented Config; for engines' small blocks
(128 KiB-2 MiB) an obstore client would save 1-2 ms a call, still to be measured with many requests in flight.
"""

from __future__ import annotations

import os
import threading
from time import perf_counter_ns

from .entry_format import (
    ENTRY_NAME,
    MAX_KEY_BYTES,
    PAGE,
    EntryHeader,
    check_entry,
    entry_bytes,
    file_name_for,
    unpack_header,
)
from .errors import ConfigError, CorruptEntryError, EntryNotFound, one_line
from .tiers import Tier
from .timed_io import OpTiming, scratch

MISSING = ("404", "NoSuchKey", "NotFound")
MAX_CONNECT_TIMEOUT_S = 5.0


class S3Tier(Tier):
    kind = "s3"
    max_key_bytes = MAX_KEY_BYTES  # the key is in each object's header

    def __init__(
        self,
        bucket: str,
        capacity_bytes: int,
        prefix: str = "kvtier/",
        name: str = "s3",
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str | None = None,
        timeout_s: float = 5.0,
        max_attempts: int = 2,
        create_bucket: bool = True,
        max_connections: int = 16,
    ) -> None:
        super().__init__(name, capacity_bytes)
        try:
            import boto3
            import botocore.exceptions
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigError(f"tier {name}: boto3 is not installed (pip install 'kvtier[s3]'): {exc}") from None
        if not bucket:
            raise ConfigError(f"tier {name}: an S3 bucket name is needed")
        if not timeout_s > 0 or not 1 <= max_attempts <= 10:
            raise ConfigError(
                f"tier {name}: timeout_s > 0 and 1 <= max_attempts <= 10, not {timeout_s}, {max_attempts}"
            )
        self.bucket = bucket
        self.prefix = prefix
        self._boto3_version = boto3.__version__
        self.endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
        self.timeout_s = float(timeout_s)
        self.max_attempts = int(max_attempts)
        self._errors = (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError)
        self._client_error = botocore.exceptions.ClientError
        self._unwritten = threading.local()  # the key whose write just failed in this thread (see delete)
        config = Config(
            connect_timeout=min(self.timeout_s, MAX_CONNECT_TIMEOUT_S),
            read_timeout=self.timeout_s,
            retries={"max_attempts": self.max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            max_pool_connections=max_connections,
        )
        try:
            self._s3 = boto3.session.Session().client(
                "s3",
                endpoint_url=self.endpoint,
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                region_name=region or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                config=config,
            )
            self._ensure_bucket(create_bucket)
        except (*self._errors, ValueError) as exc:
            raise ConfigError(
                f"tier {name}: cannot use S3 bucket {bucket!r} at {self.endpoint or 'the AWS default endpoint'}: "
                f"{one_line(exc)}"
            ) from None

    def _ensure_bucket(self, create: bool) -> None:
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except self._client_error as exc:
            if _code(exc) not in MISSING:
                raise
            if not create:  # said by __init__ after the bucket and endpoint
                raise ValueError(f"no such bucket; create it first (aws s3 mb s3://{self.bucket})") from None
            self._s3.create_bucket(Bucket=self.bucket)

    def object_key(self, key: str) -> str:
        return f"{self.prefix}{file_name_for(key)}"

    # ---- the tier --------------------------------------------------------------------------------------------------
    def write(self, key, chunks, nbytes, shape=(), dtype="uint8"):
        t0 = perf_counter_ns()
        value = entry_bytes(key, chunks, nbytes, shape, dtype)
        okey = self.object_key(key)
        d0 = perf_counter_ns()
        try:
            self._call("write_errors", self._s3.put_object, Bucket=self.bucket, Key=okey, Body=value)
        except OSError:
            self._unwritten.key = key
            raise
        d1 = perf_counter_ns()
        return OpTiming(host_ns=d0 - t0, device_ns=d1 - d0, nbytes=nbytes)

    def read(self, key, nbytes, dest=None):
        t0 = perf_counter_ns()
        okey = self.object_key(key)
        where = f"s3 {self.bucket}/{okey}"
        header = scratch.header
        payload = dest[:nbytes] if dest is not None else scratch.data_buffer(nbytes)
        d0 = perf_counter_ns()
        try:
            resp = self._s3.get_object(Bucket=self.bucket, Key=okey)
        except self._client_error as exc:
            if _code(exc) in MISSING:
                raise EntryNotFound(key) from None
            self.fallbacks["read_errors"] += 1
            raise OSError(f"{where}: {one_line(exc)}") from exc
        except self._errors as exc:
            self.fallbacks["read_errors"] += 1
            raise OSError(f"{where}: {one_line(exc)}") from exc
        body = resp["Body"]
        try:
            size = resp.get("ContentLength")
            if size != PAGE + nbytes:
                raise CorruptEntryError(f"{where}: holds {size} bytes, expected {PAGE + nbytes}")
            try:
                _read_exactly(body, header)
                _read_exactly(body, payload)
            except self._errors as exc:
                self.fallbacks["read_errors"] += 1
                raise OSError(f"{where}: the body broke off: {one_line(exc)}") from exc
        finally:
            body.close()
        d1 = perf_counter_ns()
        check_entry(header, payload, key, nbytes, where)
        return OpTiming(host_ns=(perf_counter_ns() - t0) - (d1 - d0), device_ns=d1 - d0, nbytes=nbytes)

    def _call(self, counter: str, fn, **kwargs):
        """One boto3 call (with botocore's bounded retries); a store that cannot answer is counted and becomes the
        OSError the store counts for any tier."""
        try:
            return fn(**kwargs)
        except self._errors as exc:
            self.fallbacks[counter] += 1
            raise OSError(f"s3 {self.bucket}/{kwargs.get('Key', '')}: {one_line(exc)}") from exc

    def delete(self, key):
        if getattr(self._unwritten, "key", None) == key:
            # The store deletes what a failed write may have left; a PUT that failed left nothing visible, and asking
            # an endpoint that just failed would cost a second timeout.
            self._unwritten.key = None
            return
        try:
            self._s3.delete_object(Bucket=self.bucket, Key=self.object_key(key))  # a missing object is no error
        except self._errors:
            self.fallbacks["delete_errors"] += 1

    def probe(self, key: str) -> EntryHeader | None:
        """The header of `key` if some instance stored it (and it looks whole); else None. One ranged GET of the
        header page; a damaged header is removed and counted."""
        hdr = self._header(self.object_key(key))
        return hdr if hdr is not None and hdr.key == key else None

    def _header(self, okey: str) -> EntryHeader | None:
        try:
            resp = self._s3.get_object(Bucket=self.bucket, Key=okey, Range=f"bytes=0-{PAGE - 1}")
            page = resp["Body"].read()
        except self._client_error as exc:
            if _code(exc) not in MISSING and _code(exc) != "InvalidRange":  # InvalidRange: an empty object
                self.fallbacks["probe_errors"] += 1
            return None
        except self._errors:
            self.fallbacks["probe_errors"] += 1
            return None
        total = _total_length(resp)
        try:
            hdr = unpack_header(page, okey)
            if total != PAGE + hdr.payload_nbytes:
                raise CorruptEntryError(f"{okey}: {total} bytes, the header says {PAGE + hdr.payload_nbytes}")
        except CorruptEntryError:
            self.fallbacks["corrupt_removed"] += 1
            try:
                self._s3.delete_object(Bucket=self.bucket, Key=okey)
            except self._errors:
                self.fallbacks["delete_errors"] += 1
            return None
        return hdr

    def scan(self) -> list[EntryHeader]:
        """Headers of every entry under the prefix (for a restart, or an instance joining); damaged ones are deleted
        and counted. A listing that fails is counted (`scan_errors`) and what was found so far is kept."""
        out = []
        try:
            for page in self._entry_pages():
                for okey in page:
                    hdr = self._header(okey)
                    if hdr is not None and file_name_for(hdr.key) == okey[len(self.prefix) :]:
                        out.append(hdr)
        except self._errors:
            self.fallbacks["scan_errors"] += 1
        return out

    def _entry_pages(self):
        """The object keys under the prefix, a listing page (up to 1,000) at a time, of names kvtier gives only:
        anything else is not ours to read or delete."""
        pages = self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
        for page in pages:
            yield [o["Key"] for o in page.get("Contents", ()) if ENTRY_NAME.fullmatch(o["Key"][len(self.prefix) :])]

    def remove_all(self) -> int:
        """Delete every entry object under the prefix (names kvtier gives only), a thousand a call: a run that made
        its prefix leaves nothing behind. How many went; failures are counted (`delete_errors`)."""
        removed = 0
        try:
            for keys in self._entry_pages():
                if keys:
                    resp = self._s3.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
                    )
                    failed = len(resp.get("Errors", ()))
                    self.fallbacks["delete_errors"] += failed
                    removed += len(keys) - failed
        except self._errors:
            self.fallbacks["delete_errors"] += 1
        return removed

    def describe(self):
        return {
            **super().describe(),
            "endpoint": self.endpoint,
            "bucket": self.bucket,
            "prefix": self.prefix,
            "timeout_s": self.timeout_s,
            "max_attempts": self.max_attempts,
            "client": f"boto3 {self._boto3_version}",
            "shared": True,
        }

    def close(self):
        self._s3.close()


def _read_exactly(body, buf) -> None:
    view = memoryview(buf).cast("B")
    got = 0
    while got < len(view):
        n = body.readinto(view[got:])
        if not n:
            raise CorruptEntryError(f"the object ended after {got} of {len(view)} bytes")
        got += n


def _total_length(resp: dict) -> int | None:
    """The whole object's length from a ranged GET's Content-Range (`bytes 0-4095/TOTAL`)."""
    rng = resp.get("ContentRange") or ""
    _, _, total = rng.rpartition("/")
    return int(total) if total.isdigit() else resp.get("ContentLength")


def _code(exc) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
