"""A bucket line with a negative count is a bad number, said as such, not a "truncated" trace (a cut line): the same
answer as the JSON form gives. Text traces from the fixtures with one count made negative."""

from __future__ import annotations

import re

import pytest
from trace_helpers import FIXTURES

from tracing.distill import main
from tracing.histparse import TraceParseError, parse_trace

TEXT = FIXTURES / "fio_randrw70_128k_qd8.txt"


def _negated(nth: int, value: str | None = None) -> str:
    """The fixture with the count of its nth bucket line replaced by a negative number."""
    lines = TEXT.read_text().splitlines(keepends=True)
    buckets = [i for i, ln in enumerate(lines) if re.match(r"^[\[(]", ln)]
    i = buckets[nth]
    lines[i] = re.sub(r"(\S)(\s+)(\d+)(\s*\|)", lambda m: m[1] + m[2] + (value or "-" + m[3]) + m[4], lines[i], count=1)
    return "".join(lines)


@pytest.mark.parametrize("nth, value", [(0, None), (1, None), (-1, None), (2, "-1"), (3, "-99999999999999999999")])
def test_a_negative_bucket_count_is_a_bad_number_not_a_cut(tmp_path, capsys, nth, value):
    path = tmp_path / "t.txt"
    path.write_text(_negated(nth, value))
    with pytest.raises(TraceParseError, match="negative bucket count"):
        parse_trace(path.read_text())
    rc = main(["-i", str(path), "-o", str(tmp_path / "job.fio")])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and "negative bucket count" in err[0], err
    assert "truncated" not in err[0]
    assert not (tmp_path / "job.fio").exists()
