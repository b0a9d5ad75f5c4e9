"""Who is on the other end of a loopback TCP connection: the Runtime API answers only its own instance.

Why a peer check: awslambdaric's C client speaks plain HTTP to `AWS_LAMBDA_RUNTIME_API` (host:port) and
sends no header we could put a secret in; it cannot use a unix socket; a network namespace per instance
would cut the function off from the network (S3 model fetches) and needs privileges. The kernel, though,
knows which socket connected: the client's socket is found by its exact 4-tuple (sock_diag netlink, one
request, no scan of the host's sockets), and it belongs to the instance if that socket's inode is in the
instance process's fd table. The check runs once per connection, and awslambdaric keeps one keep-alive
connection for all its calls, so the cost per invocation is near zero (`bench/local/limits.py guard`).
"""

from __future__ import annotations

import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF


def _addr(ip: str) -> bytes:
    """An address as inet_diag_sockid holds it: 16 bytes, IPv4 in the first 4."""
    if ":" in ip:
        return socket.inet_pton(socket.AF_INET6, ip)
    return socket.inet_aton(ip) + bytes(12)


def tcp_inode(src: tuple[str, int], dst: tuple[str, int]) -> int | None:
    """Inode of the TCP socket whose local end is `src` and remote end `dst` (None: no such socket)."""
    family = socket.AF_INET6 if ":" in src[0] else socket.AF_INET
    sockid = struct.pack("!HH", src[1], dst[1]) + _addr(src[0]) + _addr(dst[0])
    sockid += struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
    header = struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0)
    try:
        # A fresh netlink socket per lookup (~10 us): nothing to share between loop threads or to leak.
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(1.0)
            sock.send(header + request)
            reply = sock.recv(4096)
    except OSError:
        return _proc_net_inode(src, dst)
    _length, kind = struct.unpack_from("=IH", reply)
    if kind == NLMSG_ERROR:
        return None
    # inet_diag_msg after the 16-byte header: 4 bytes, sockid (48), expires, rqueue, wqueue, uid, inode
    (inode,) = struct.unpack_from("=I", reply, 16 + 4 + 48 + 16)
    return int(inode)


def _proc_net_inode(src: tuple[str, int], dst: tuple[str, int]) -> int | None:
    """Fallback without sock_diag: scan /proc/net/tcp (IPv4 only)."""
    if ":" in src[0]:
        return None

    def hexaddr(addr: tuple[str, int]) -> str:
        return f"{struct.unpack('<I', socket.inet_aton(addr[0]))[0]:08X}:{addr[1]:04X}"

    local, remote = hexaddr(src), hexaddr(dst)
    try:
        with open("/proc/net/tcp") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                    return int(fields[9])
    except OSError:
        pass
    return None


def owns_inode(pid: int, inode: int) -> bool:
    """Is socket `inode` open in process `pid` (its threads share the fd table)?"""
    target = f"socket:[{inode}]"
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            for entry in entries:
                try:
                    if os.readlink(entry.path) == target:
                        return True
                except OSError:
                    continue
    except OSError:
        return False
    return False


def _session_members(sid: int) -> list[int]:
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != sid:
            try:
                if os.getsid(int(name)) == sid:
                    members.append(int(name))
            except OSError:
                continue
    return members


def connected_from(conn: socket.socket, pid: int) -> bool:
    """Was `conn` (an accepted connection) opened by process `pid`, or by a process of the session it
    leads? Each instance leads its own session (its sandbox: what the handler starts stays in it, and no
    other process can join a session it did not start). The instance itself is the fast path; the session
    scan runs only for its children's connections and for strangers, on their way to a refusal."""
    try:
        peer_addr = conn.getpeername()[:2]
        local_addr = conn.getsockname()[:2]
    except OSError:
        return False
    inode = tcp_inode(peer_addr, local_addr)
    if inode is None:
        return False
    if owns_inode(pid, inode):
        return True
    try:
        if os.getsid(pid) != pid:  # not a session leader (yet): only the process itself counts
            return False
    except OSError:
        return False
    return any(owns_inode(member, inode) for member in _session_members(pid))
