"""An entry's blocks are reserved with fallocate(2); a filesystem that cannot allocate (s3fs and other FUSE
filesystems, NFS before 4.2) answers EOPNOTSUPP and the write goes on. Never glibc's posix_fallocate emulation,
which then writes a byte into every 4 KiB block of the range: observed on the real system calls with strace, the
filesystem's refusal injected (strace -e inject=fallocate:error=EOPNOTSUPP)."""

import re
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")]

SCRIPT = textwrap.dedent(
    """
    import sys
    from kvconnector.tiers import DiskTier
    from kvconnector.timed_io import aligned_buffer

    tier = DiskTier(sys.argv[1], capacity_bytes=1 << 30, io_mode=sys.argv[2])
    buf = aligned_buffer(4 << 20)
    buf[:] = bytes(range(256)) * (len(buf) // 256)
    tier.write("k", [buf], len(buf))
    out = aligned_buffer(4 << 20)
    tier.read("k", len(buf), out)
    assert bytes(out) == bytes(buf)
    """
)


@pytest.mark.parametrize("io_mode", ["buffered", "direct"])
@pytest.mark.parametrize("refused", [False, True], ids=["allocates", "cannot-allocate"])
def test_a_filesystem_that_cannot_allocate_gets_no_byte_per_block(tmp_path, io_mode, refused):
    out = tmp_path / "strace.txt"
    inject = ["-e", "inject=fallocate:error=EOPNOTSUPP"] if refused else []
    subprocess.run(
        ["strace", "-f", "-qq", "-o", str(out), "-e", "trace=fallocate,pwrite64,pwritev", *inject]
        + [sys.executable, "-c", SCRIPT, str(tmp_path / "cache"), io_mode],
        check=True,
        timeout=120,
    )
    calls = out.read_text().splitlines()
    fallocates = [c for c in calls if re.search(r"\bfallocate\(\d+, 0, 0, \d+\)", c)]
    one_byte = [c for c in calls if re.search(r'pwrite64\(\d+, "\\0", 1,', c)]
    assert len(fallocates) == 1, calls  # the entry's one reservation, its range whole
    assert ("EOPNOTSUPP" in fallocates[0]) == refused
    assert one_byte == [], one_byte[:3]  # glibc's emulation would have written 1,025 of them
