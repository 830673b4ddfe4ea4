"""A buffered workload for the page-cache check: write FILE_MIB MiB to PATH
(fsync'd, so the bytes are on disk and in the page cache), then, once told
"go" on stdin, read the whole file back ROUNDS times with read() (served
from the page cache), and move SOCK_MIB MiB through a socket pair (socket
bytes, not file bytes). argv: PATH FILE_MIB ROUNDS SOCK_MIB."""

import os
import socket
import sys

path, file_mib, rounds, sock_mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
chunk = os.urandom(1 << 20)
with open(path, "wb") as f:
    for _ in range(file_mib):
        f.write(chunk)
    f.flush()
    os.fsync(f.fileno())
print("ready", flush=True)
sys.stdin.readline()
for _ in range(rounds):
    fd = os.open(path, os.O_RDONLY)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
a, b = socket.socketpair()
piece = chunk[: 64 << 10]  # under the socket buffer: one thread sends, then receives
for _ in range(sock_mib * 16):
    a.sendall(piece)
    got = 0
    while got < len(piece):
        got += len(b.recv(len(piece) - got))
print("done", flush=True)
sys.stdin.readline()
