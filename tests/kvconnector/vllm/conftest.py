"""Every test module here imports vLLM, which costs seconds of CPU when pytest collects it, and every test here is
marked slow. The fast tier (`make test-fast`, `-m "not slow and not e2e"`) leaves these modules out before collecting
them, so it pays nothing for them."""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def pytest_ignore_collect(collection_path, config):
    if collection_path.parent == HERE and collection_path.name.startswith("test_"):
        if "not slow" in (config.getoption("markexpr") or ""):
            return True
    return None
