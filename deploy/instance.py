"""The processes of one stack instance (or node): kvtier's settings, LMCache's server, vLLM, and the endpoints the
stack records for it. Only commands and files here; deploy/run_stack.py starts them (deploy/processes.py).

Standard library only (see deploy/processes.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    """What every instance of one `up` shares (the flags of `up`, checked)."""

    python: str
    device: str
    model: str
    served_name: str
    mode: str  # mp | inprocess
    l2: str  # kvtier | lmcache-fs | none
    io_mode: str
    disk_gb: str
    shared_gb: str
    l1_gb: str
    chunk: str
    vllm_settings: list[str]
    env: list[str]  # `env` assignments every server's command starts with
    vllm_extra: list[str] = field(default_factory=list)
    lmcache_extra: list[str] = field(default_factory=list)


@dataclass
class Instance:
    """Instance i: where it listens and keeps its disk tier, and what it is run inside (a node's namespace)."""

    index: int
    host: str
    vllm_port: int
    lmcache_port: int
    lmcache_http_port: int
    metrics_port: int
    kv_dir: str
    shared_dir: str = ""  # kvtier's shared tier, "" for none
    # kvtier's keys of a shared tier that is a service (redis_url; s3_bucket, s3_endpoint, ...): its capacity is
    # --shared-gb, under the key `capacity_key`
    remote: dict = field(default_factory=dict)
    capacity_key: str = ""
    netns: str = ""
    gpus: str = ""  # CUDA_VISIBLE_DEVICES, "" to leave it alone

    @property
    def vllm(self) -> str:
        return f"http://{self.host}:{self.vllm_port}"

    @property
    def lmcache_http(self) -> str:
        return f"http://{self.host}:{self.lmcache_http_port}"

    @property
    def kvtier_metrics(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def endpoints(self) -> dict:
        """Its entry of endpoints.json "instances" (key order as readers have always seen it)."""
        return {
            "vllm": self.vllm,
            "lmcache_port": self.lmcache_port,
            "lmcache_http": self.lmcache_http,
            "kvtier_metrics": self.kvtier_metrics,
            "lmcache_metrics": self.lmcache_http + "/metrics",
            "kv_dir": self.kv_dir,
        }

    def kvtier_params(self, s: Settings) -> dict:
        """kvtier's adapter_params (MP server) or kvtier.* keys (in-process plugin)."""
        p = {
            "disk_dir": self.kv_dir,
            "disk_capacity_gb": float(s.disk_gb),
            "io_mode": s.io_mode,
            "metrics_port": self.metrics_port,
            "metrics_host": self.host,
            "snapshot_path": self.kv_dir + "/kvtier-stats.json",
        }
        if self.shared_dir:
            p.update(shared_dir=self.shared_dir, shared_capacity_gb=float(s.shared_gb))
        if self.remote:
            p.update(self.remote, **{self.capacity_key: float(s.shared_gb)})
        return p

    def prefix(self, s: Settings) -> list[str]:
        """What a server command of this instance starts with: its namespace, then its environment."""
        inns = ["ip", "netns", "exec", self.netns] if self.netns else []
        gpus = [f"CUDA_VISIBLE_DEVICES={self.gpus}"] if self.gpus else []
        return [*inns, *s.env, *gpus]

    def l2_adapter(self, s: Settings) -> str | None:
        """The MP server's --l2-adapter JSON; None for --l2 none (LMCache's L1 is all there is)."""
        if s.l2 == "kvtier":
            p = self.kvtier_params(s)
            # "shared": LMCache tags the adapter's cache events with it; kvtier's tiers say the same (a shared dir)
            spec = {
                "type": "plugin",
                "module_path": "kvconnector.lmcache.l2_adapter",
                "class_name": "KvtierL2Adapter",
                "shared": bool(self.shared_dir or self.remote),
                "adapter_params": p,
            }
            return json.dumps(spec)
        if s.l2 == "lmcache-fs":
            return json.dumps({"type": "fs", "base_path": self.kv_dir, "use_odirect": s.io_mode == "direct"})
        return None

    def lmcache_command(self, s: Settings) -> list[str]:
        """The LMCache MP server (ZMQ on the loopback, HTTP and kvtier's metrics on the instance's address)."""
        l2 = self.l2_adapter(s)
        return [
            *self.prefix(s),
            s.python,
            "-m",
            "lmcache.v1.multiprocess.http_server",
            *("--host", "127.0.0.1", "--port", str(self.lmcache_port)),
            *("--http-host", self.host, "--http-port", str(self.lmcache_http_port)),
            *("--prometheus-port", str(self.lmcache_http_port + 20), "--chunk-size", s.chunk),
            *("--l1-size-gb", s.l1_gb, "--eviction-policy", "LRU", "--supported-transfer-mode", "auto"),
            *(["--l2-adapter", l2] if l2 is not None else []),
            *s.lmcache_extra,
        ]

    def inprocess_config(self, s: Settings) -> str:
        """The LMCACHE_CONFIG_FILE of in-process LMCache with the kvtier storage plugin."""
        lines = [
            f"chunk_size: {int(s.chunk)}",
            "local_cpu: true",
            f"max_local_cpu_size: {float(s.l1_gb)}",
            'storage_plugins: ["kvtier"]',
            "extra_config:",
            "  storage_plugin.kvtier.module_path: kvconnector.lmcache.storage_plugin",
            "  storage_plugin.kvtier.class_name: KvtierStoragePlugin",
        ]
        lines += [f"  kvtier.{k}: {json.dumps(v)}" for k, v in self.kvtier_params(s).items()]
        return "\n".join(lines) + "\n"

    def kv_transfer_config(self, s: Settings) -> str:
        if s.mode == "inprocess":
            return '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
        return json.dumps(
            {
                "kv_connector": "LMCacheMPConnector",
                "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector",
                "kv_role": "kv_both",
                "kv_connector_extra_config": {
                    "lmcache.mp.host": "tcp://127.0.0.1",
                    "lmcache.mp.port": self.lmcache_port,
                },
            }
        )

    def vllm_command(self, s: Settings, inprocess_config: Path | None = None) -> list[str]:
        env = [f"LMCACHE_CONFIG_FILE={inprocess_config}"] if inprocess_config else []
        return [
            *self.prefix(s),
            *env,
            s.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *("--model", s.model, "--served-model-name", s.served_name, "--dtype", "bfloat16"),
            *s.vllm_settings,
            "--enforce-eager",
            *("--host", self.host, "--port", str(self.vllm_port)),
            *("--kv-transfer-config", self.kv_transfer_config(s)),
            *s.vllm_extra,
        ]
