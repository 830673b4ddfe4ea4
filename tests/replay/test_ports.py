"""replay.common.ports: servers get ports outside the kernel's source-port range, so that a server restarted on its
own port never finds it taken by an outgoing connection."""

import socket

import pytest

from replay.common import ports


def test_ports_are_free_and_outside_the_kernels_source_port_range():
    eph = ports.ephemeral_range()
    for _ in range(50):
        base = ports.free_port_block(60)
        assert all(p not in eph for p in range(base, base + 60))
        assert ports.LOWEST <= base and base + 59 <= 65535
    with socket.socket() as s:  # and one can listen there
        s.bind(("127.0.0.1", ports.free_port()))
        s.listen()


def test_a_block_with_offsets_keeps_every_shifted_port_outside_the_range_too():
    """A Redis node's cluster bus listens on its port + 10000; both must be safe."""
    eph = ports.ephemeral_range()
    for _ in range(50):
        base = ports.free_port_block(3, offsets=(0, 10000))
        every = [*range(base, base + 3), *range(base + 10000, base + 10003)]
        assert not [p for p in every if p in eph] and max(every) <= 65535


def test_a_port_in_use_is_never_given(monkeypatch, tmp_path):
    """With the range set so that a single port is left (10000), a listener there makes the block impossible."""
    f = tmp_path / "range"
    f.write_text("10001\t65535\n")
    monkeypatch.setattr(ports, "LOCAL_PORT_RANGE", f)
    assert ports.ephemeral_range() == range(10001, 65536)
    if not ports.all_free([10000]):
        pytest.skip("port 10000 is taken on this host")
    assert ports.free_port() == 10000  # the only port left
    with socket.socket() as s:
        s.bind(("127.0.0.1", 10000))
        s.listen()
        taken = r"no free block of 1 ports on 127\.0\.0\.1 outside the source-port range 10001-65535"
        with pytest.raises(RuntimeError, match=taken):
            ports.free_port()


def test_a_range_that_leaves_no_room_says_so(monkeypatch, tmp_path):
    f = tmp_path / "range"
    f.write_text("1024 65535\n")
    monkeypatch.setattr(ports, "LOCAL_PORT_RANGE", f)
    with pytest.raises(RuntimeError, match="no block of 2 ports outside the source-port range 1024-65535"):
        ports.free_port_block(2)


def test_an_unreadable_range_file_means_linuxs_default(monkeypatch, tmp_path):
    monkeypatch.setattr(ports, "LOCAL_PORT_RANGE", tmp_path / "absent")
    assert ports.ephemeral_range() == range(32768, 61000)
