"""A small known workload for the tracer tests: buffered pwrite + fdatasync,
fadvise(DONTNEED), then pread of what was written, looped. argv: PATH SECONDS."""

import os
import sys
import time

path, seconds = sys.argv[1], float(sys.argv[2])
block = os.urandom(64 * 1024)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
deadline = time.monotonic() + seconds
off = 0
print("ready", flush=True)
while time.monotonic() < deadline:
    for i in range(8):
        os.pwrite(fd, block, off + i * len(block))
    os.fdatasync(fd)
    os.posix_fadvise(fd, off, 8 * len(block), os.POSIX_FADV_DONTNEED)
    for i in range(8):
        os.pread(fd, len(block), off + i * len(block))
    off = (off + 8 * len(block)) % (64 << 20)
    time.sleep(0.002)
os.close(fd)
