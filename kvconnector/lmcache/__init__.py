"""Thin LMCache adapters over `kvconnector.backend.KvtierBackend` (pinned: lmcache==0.5.6).

- `kvconnector.lmcache.l2_adapter.KvtierL2Adapter`: MP mode (`--l2-adapter '{"type":"plugin",...}'`).
- `kvconnector.lmcache.storage_plugin.KvtierStoragePlugin`: in-process mode (`storage_plugins`, LMCacheConnectorV1).
Importing this package imports nothing from LMCache; each adapter module does.
"""
