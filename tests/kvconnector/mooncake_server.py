"""A real Mooncake Store for the tests (deploy/mooncake_store.py): the wheel's HTTP metadata server and
`mooncake_master` on 127.0.0.1 (free ports), logs in a directory the caller gives; skipped where Mooncake is not
installed. The master can be killed and started again on the same port (the fault tests); `stop` ends both."""

from __future__ import annotations

import pytest

from deploy import mooncake_store


class MooncakeServer(mooncake_store.MooncakeStore):
    def __init__(self, log_dir) -> None:
        why = mooncake_store.missing()
        if why:
            pytest.skip(why)
        super().__init__(log_dir)
