"""What a finished run leaves besides its JSON: an Excel workbook, a long-format CSV, PNG figures, and (while it
runs) an I/O trace log of every storage operation. Each writer reads the results document of `kvtier bench` and
tolerates sections that older files lack. matplotlib, openpyxl and zstandard are imported only when used."""

from .csv_out import write_csv
from .io_trace import IOTraceLog, get_request_phase, read_trace, request_phase, set_request_phase
from .plots import write_plots
from .xlsx import write_xlsx

__all__ = [
    "IOTraceLog",
    "get_request_phase",
    "read_trace",
    "request_phase",
    "set_request_phase",
    "write_csv",
    "write_plots",
    "write_xlsx",
]
