"""Nothing but its place: pytest puts a conftest's folder on sys.path before loading it, so tests below tests/replay
(outputs/, openai/) import bench_helpers whichever folder is collected first."""
