"""One configuration model for the kvtier LMCache backend, shared by both adapters.

Where the keys come from:
- MP mode (L2 adapter): the `adapter_params` object of `--l2-adapter '{"type":"plugin",...,"adapter_params":{...}}'`;
  keys may be written bare (`disk_dir`) or with the `kvtier.` prefix (`kvtier.disk_dir`).
- In-process (storage plugin): LMCache's `extra_config`, keys `kvtier.<name>`; other extra_config keys are LMCache's.
Unknown keys, wrong types and impossible values are errors (one line each, naming the key).

Tiers, fastest first: the local disk tier (`disk_dir`, `disk_capacity_gb`; 0 means none), then an optional shared
directory (`shared_dir`), then an optional Redis/Valkey (`redis_url`), then an optional Mooncake Store
(`mooncake_master` with `mooncake_metadata_url`), then an optional S3 bucket (`s3_bucket`). A put goes to the top
tier; an entry evicted from a tier is demoted to the next; the bottom tier deletes. With no local disk tier every put
lands in the shared tier at once, which is how several instances share each other's prefixes without waiting for
demotion.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError
from .units import GB
from .validation import describe_validation_error

PREFIX = "kvtier."
# 10 PB: more than any one tier here; a larger number is a typo (1e300 overflowed on the way to bytes).
MAX_CAPACITY_GB = 10_000_000


class BackendConfig(BaseModel):
    # strict: a value must already have its type (YAML and JSON give numbers and booleans as such), so True is not a
    # capacity of 1 GB, nor "4" one of 4 GB; an int is still a float. No NaN or infinity either.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)

    # Local disk tier: one file per entry (4 KiB header with key and checksum, payload), timed O_DIRECT I/O.
    disk_dir: str | None = None
    disk_capacity_gb: float = Field(4.0, ge=0, le=MAX_CAPACITY_GB)
    io_mode: Literal["direct", "buffered"] = "direct"
    # When a stored entry is durable (timed_io.Sync): entry = before the store completes (fdatasync + directory
    # fsync); none = when the kernel writes it back (a power cut may lose recent entries, never serves a torn one).
    sync: Literal["entry", "none"] = "entry"
    # Shared POSIX directory (NFS, Lustre, CephFS, GekkoFS) that several instances read and write at once.
    shared_dir: str | None = None
    shared_capacity_gb: float = Field(4.0, gt=0, le=MAX_CAPACITY_GB)
    shared_io_mode: Literal["direct", "buffered"] = "buffered"
    shared_sync: Literal["entry", "none"] = "entry"
    # Stale temp files in the shared directory older than this are removed on start (younger ones may be another
    # instance's write in flight).
    shared_stale_tmp_s: float = Field(600.0, gt=0)
    # Redis / Valkey tier (redis-py URL, e.g. redis://127.0.0.1:6379/0; a Redis Cluster is
    # redis-cluster://host:port[,host:port...]).
    redis_url: str | None = None
    redis_capacity_gb: float = Field(1.0, gt=0, le=MAX_CAPACITY_GB)
    redis_namespace: str = Field("kvtier", min_length=1, max_length=64)
    # Mooncake Store tier: its master (host:port) and HTTP metadata server (http://host:port/metadata), both needed.
    mooncake_master: str | None = None
    mooncake_metadata_url: str | None = None
    mooncake_capacity_gb: float = Field(1.0, gt=0, le=MAX_CAPACITY_GB)
    mooncake_namespace: str = Field("kvtier", min_length=1, max_length=64)
    # Memory this instance lends to the store (None: 1.25 x mooncake_capacity_gb, above the master's 90 % watermark;
    # Mooncake's client lends at least 16 MiB).
    mooncake_segment_gb: float | None = Field(None, ge=16 / 1024, le=MAX_CAPACITY_GB)
    # The client's staging buffer: every value passes through it, so it bounds the largest entry (less 4 KiB).
    mooncake_local_buffer_mb: float = Field(64.0, ge=16, le=1 << 20)
    # Each call to the master ends within this (a hung master); a dead one is refused at once.
    mooncake_timeout_s: float = Field(5.0, gt=0, le=600)
    # The address other instances reach this one's segment at; None: the one the route to the master leaves from.
    mooncake_local_hostname: str | None = None
    # S3 tier (kvconnector/s3_tier.py): one object per entry under <s3_prefix><hash>.kv in this bucket. The endpoint
    # and credentials are boto3's: s3_endpoint, else AWS_ENDPOINT_URL; keys from AWS_ACCESS_KEY_ID and
    # AWS_SECRET_ACCESS_KEY (never in this config, which is written to the snapshot).
    s3_bucket: str | None = Field(None, min_length=3, max_length=63)
    s3_endpoint: str | None = None
    s3_prefix: str = Field("kvtier/", max_length=512)
    s3_capacity_gb: float = Field(1.0, gt=0, le=MAX_CAPACITY_GB)
    # Each try of a call ends within this (boto3's connect and read timeouts; the connect at most 5 s) ...
    s3_timeout_s: float = Field(5.0, gt=0, le=600)
    # ... and a call is tried at most this many times in all (botocore's standard retry mode).
    s3_max_attempts: int = Field(2, ge=1, le=10)
    # Waterfall policy.
    target_usage_ratio: float = Field(0.9, gt=0, le=1)
    promote_on_hit: bool = False
    # LMCache CPU memory kvtier may pin as io_uring registered buffers (in 1 GiB pieces, as transfers touch them;
    # O_DIRECT transfers of registered memory skip pinning each page every time), for the whole process (the last
    # backend made sets it). 0: preadv/pwritev only. Without CAP_IPC_LOCK the kernel also holds it to RLIMIT_MEMLOCK.
    io_uring_pin_gb: float = Field(16.0, ge=0, le=MAX_CAPACITY_GB)
    # Threads that run the I/O of store and load tasks.
    io_workers: int = Field(4, ge=1, le=256)
    # Serve what the directories held before a restart (entries are validated; corrupt or partial ones are removed).
    rescan_on_start: bool = True
    # Also check every payload checksum during the rescan (reads everything; loads always verify anyway).
    rescan_verify_payload: bool = False
    # Prometheus exporter: None = off, 0 = any free port.
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # JSON snapshot of all statistics written on close; "" = off, None = <disk_dir or shared_dir>/kvtier-stats.json.
    snapshot_path: str | None = None

    @field_validator(
        "disk_dir",
        "shared_dir",
        "snapshot_path",
        "redis_url",
        "redis_namespace",
        "metrics_host",
        "mooncake_master",
        "mooncake_metadata_url",
        "mooncake_namespace",
        "mooncake_local_hostname",
        "s3_bucket",
        "s3_endpoint",
        "s3_prefix",
    )
    @classmethod
    def _no_nul(cls, v: str | None) -> str | None:
        # No path, URL or host name holds a NUL byte: the OS would refuse it later, as a ValueError of its own.
        if v is not None and "\0" in v:
            raise ValueError("must not contain a NUL byte")
        return v

    @field_validator("disk_dir", "shared_dir")
    @classmethod
    def _a_directory(cls, v: str | None) -> str | None:
        # An empty path would otherwise become the current directory (os.path.abspath("")), a tier nobody asked for.
        if v is not None and not v.strip():
            raise ValueError(
                "must name a directory (an empty or blank path is not the current directory); leave it out for none"
            )
        return v

    @field_validator(
        "disk_capacity_gb", "shared_capacity_gb", "redis_capacity_gb", "mooncake_capacity_gb", "s3_capacity_gb"
    )
    @classmethod
    def _at_least_a_byte(cls, v: float) -> float:
        # 1e-10 GB is 0 bytes once whole, and the disk tier's 0 means "all the free space": the opposite.
        if v and v * GB < 1:
            raise ValueError(f"{v:g} GB is less than one byte (0 means none)")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("redis://", "rediss://", "unix://", "redis-cluster://")):
            raise ValueError("must start with redis://, rediss://, unix:// or redis-cluster://")
        return v

    @field_validator("mooncake_master")
    @classmethod
    def _host_port(cls, v: str | None) -> str | None:
        if v is not None:
            host, _, port = v.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError("must be host:port (the master's RPC port)")
        return v

    @field_validator("mooncake_metadata_url")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be the HTTP metadata server's URL, http://host:port/metadata")
        return v

    @field_validator("s3_endpoint")
    @classmethod
    def _s3_url(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("http://", "https://")):
            raise ValueError("must be the S3 endpoint's URL, http(s)://host[:port]")
        return v

    @model_validator(mode="after")
    def _tiers(self) -> BackendConfig:
        if (self.mooncake_master is None) != (self.mooncake_metadata_url is None):
            raise ValueError("mooncake_master and mooncake_metadata_url go together: set both or neither")
        if not self.has_disk and not (self.shared_dir or self.redis_url or self.mooncake_master or self.s3_bucket):
            raise ValueError(
                "no tier configured: set disk_dir (with disk_capacity_gb > 0), shared_dir, redis_url, mooncake_master "
                "or s3_bucket"
            )
        if self.disk_dir and self.shared_dir and _same_dir(self.disk_dir, self.shared_dir):
            raise ValueError("disk_dir and shared_dir must be different directories")
        return self

    @property
    def has_disk(self) -> bool:
        return self.disk_dir is not None and self.disk_capacity_gb > 0

    def resolved_snapshot_path(self) -> str | None:
        if self.snapshot_path == "":
            return None
        if self.snapshot_path:
            return self.snapshot_path
        base = self.disk_dir or self.shared_dir
        import os

        return os.path.join(base, "kvtier-stats.json") if base else None

    # ---- constructors from what LMCache hands us -----------------------------------------------------------------
    @classmethod
    def from_params(cls, params: dict[str, Any] | None) -> BackendConfig:
        """From an L2 adapter's adapter_params (bare or `kvtier.`-prefixed keys)."""
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise ConfigError(f"kvtier: adapter_params must be an object, got {type(params).__name__}")
        clean = {}
        for k, v in params.items():
            name = k[len(PREFIX) :] if isinstance(k, str) and k.startswith(PREFIX) else k
            if name in clean:
                raise ConfigError(f"kvtier: key {name!r} given twice (bare and with the kvtier. prefix)")
            clean[name] = v
        return cls.validated(clean)

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> BackendConfig:
        """From LMCache's extra_config: only `kvtier.*` keys are ours."""
        clean = {k[len(PREFIX) :]: v for k, v in (extra or {}).items() if isinstance(k, str) and k.startswith(PREFIX)}
        return cls.validated(clean)

    @classmethod
    def validated(cls, d: dict[str, Any]) -> BackendConfig:
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            raise ConfigError(
                describe_validation_error(
                    exc, "kvtier: invalid configuration", key_prefix=PREFIX, unknown_key="unknown key"
                )
            ) from None


def _same_dir(a: str, b: str) -> bool:
    import os

    return os.path.realpath(a) == os.path.realpath(b)
