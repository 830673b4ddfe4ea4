"""What a finished run leaves besides its JSON, for both drivers.

`kvtier bench`: an Excel workbook, a long-format CSV, PNG figures, and (while it runs) an I/O trace log of every
storage operation; each writer reads the results document and tolerates sections that older files lack.
`kvtier replay`: per-request JSONL and CSV (plus per-round CSV), PNG figures and the closing tables, from its summary
and per-request rows. matplotlib, openpyxl and zstandard are imported only when used."""

from .csv_out import write_csv, write_requests_csv
from .io_trace import IOTraceLog, get_request_phase, read_trace, request_phase, set_request_phase
from .jsonl import write_jsonl
from .plots import write_plots, write_replay_plots
from .tables import replay_tables
from .xlsx import write_xlsx

__all__ = [
    "IOTraceLog",
    "get_request_phase",
    "read_trace",
    "replay_tables",
    "request_phase",
    "set_request_phase",
    "write_csv",
    "write_jsonl",
    "write_plots",
    "write_replay_plots",
    "write_requests_csv",
    "write_xlsx",
]
