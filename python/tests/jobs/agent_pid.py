"""The process serving a Unix socket: its peer credentials (SO_PEERCRED), read from a connection that says nothing
(the agent closes it like any client that leaves)."""

import socket
import struct


def agent_pid(path: str) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        pid, _uid, _gid = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return pid
