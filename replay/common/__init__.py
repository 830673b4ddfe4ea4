"""What every part of kvtier shares that is no part of a driver: deploy/, the benchmarks and both drivers import it.

- `cli`: the one error contract of every subcommand (`UserError`: one line, exit 2; anything else a bug: exit 1),
  signals, a closed stdout.
- `ports`: the one port picker (ports outside the kernel's source-port range).
- `leftovers`: temp directories of killed runs, found and cleaned.
- `json_files`: reading the user's files (JSON, YAML, regular files only) and writing JSON atomically.
- `settings`: one validated configuration from flags, a YAML file and `KVTIER_*` variables.
- `prometheus_text`: /metrics pages as samples.

It imports nothing of the drivers, the sources or the outputs (tests/test_layers.py).
"""
