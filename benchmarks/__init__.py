"""The benchmarks, each run as `python benchmarks/NAME.py`; a package only so the tests import them as
`benchmarks.NAME` (the repository root is on sys.path under pytest). Not installed with kvtier."""
