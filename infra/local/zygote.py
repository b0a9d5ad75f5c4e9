"""The local Lambda's snapshot template: `python -m infra.local.zygote <handler>` (SOCK-style zygote).

It runs the real awslambdaric bootstrap with one change: the snapshot point. Where awslambdaric, after
init and the before-snapshot hooks, asks `GET /restore/next` and Lambda freezes the VM, the template
instead serves forks. Each fork is a restored copy: it takes its own Runtime API address and log pipe,
asks its own `/restore/next`, and awslambdaric carries on in it exactly as on Lambda (after-restore hooks,
then the invocation loop, or `Runtime.AfterRestoreError` and exit 65).

Control channel (a SOCK_SEQPACKET Unix socket inherited as fd `WARMSTART_ZYGOTE_FD`), a JSON object a message:
  template → host  {"event": "ready", "pid", "threads", "rss_kb"}   at the snapshot point
                   {"event": "forked", "id", "pid"}                  after each fork
                   {"event": "exit", "id", "pid", "code"}            when a fork exits (code as Popen has it)
  host → template  {"fork": id, "env": {...}} with the fork's output pipe passed as SCM_RIGHTS
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import sys
import traceback
from typing import Any

FD_VARIABLE = "WARMSTART_ZYGOTE_FD"
_CLIENT_MODULE = "runtime_client"  # awslambdaric's C extension


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _rss_kb() -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmRSS:"):
                return int(line.split()[1])
    return 0


class ForkServer:
    """Stands in for `client.restore_next` in the template; returns only in a fork, as its restore."""

    def __init__(self, sock: socket.socket, client: Any) -> None:
        self.sock = sock
        self.client = client
        self.children: dict[int, tuple[str, int]] = {}  # pidfd -> (fork id, pid)

    def restore_next(self) -> None:
        # On Lambda the snapshot is taken inside awslambdaric's GET /restore/next, after it has imported
        # http.client for it (~30 ms): do the same here, or every copy would pay that import.
        import http.client  # noqa: F401

        # ...and after it resolved and connected to the Runtime API: the first getaddrinfo() loads glibc's
        # NSS configuration and modules (~10 ms), which every copy would otherwise load again.
        host, _, port = self.client.lambda_runtime_address.rpartition(":")
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        _send(self.sock, {"event": "ready", "pid": os.getpid(), "threads": _threads(), "rss_kb": _rss_kb()})
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is not self.sock:
                    self._reap(key.fd, selector)
                    continue
                data, fds, _flags, _addr = socket.recv_fds(self.sock, 65536, 1)
                if not data:
                    os._exit(0)  # the host is gone: so is the snapshot
                if self._fork(json.loads(data), fds[0], selector):
                    return  # in the child: this was its restore

    def _fork(self, request: dict[str, Any], out: int, selector: selectors.BaseSelector) -> bool:
        pid = os.fork()
        if pid == 0:
            selector.close()
            self._become_instance(request, out)
            return True
        os.close(out)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (request["fork"], pid)
        selector.register(pidfd, selectors.EVENT_READ)
        _send(self.sock, {"event": "forked", "id": request["fork"], "pid": pid})
        return False

    def _reap(self, pidfd: int, selector: selectors.BaseSelector) -> None:
        selector.unregister(pidfd)
        os.close(pidfd)
        fork_id, pid = self.children.pop(pidfd)
        _, status = os.waitpid(pid, 0)
        _send(self.sock, {"event": "exit", "id": fork_id, "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def _become_instance(self, request: dict[str, Any], out: int) -> None:
        # Into this copy's own cgroup first, so its restore runs and is charged under its own quota.
        for procs in request.get("cgroup", ()):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        os.setsid()  # its own process group: the host kills it (and its children) on its own
        for pidfd in self.children:
            os.close(pidfd)
        self.children.clear()
        self.sock.close()
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.environ.update(request["env"])
        address = request["env"]["AWS_LAMBDA_RUNTIME_API"]
        # The C client reads AWS_LAMBDA_RUNTIME_API once, when its library loads: load it only now, here.
        del sys.modules[_CLIENT_MODULE]
        import runtime_client  # type: ignore[import-not-found]
        from awslambdaric import lambda_runtime_client

        runtime_client.initialize_client(lambda_runtime_client._user_agent())
        lambda_runtime_client.runtime_client = runtime_client
        self.client.lambda_runtime_address = address
        del self.client.restore_next  # back to awslambdaric's own: GET /restore/next on this copy's API
        self.client.restore_next()


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(os.environ.pop(FD_VARIABLE)))
    # Keep awslambdaric's C client unloaded in the template (see _become_instance): importing it fails
    # softly, and the template never needs it since it never polls for invocations.
    sys.modules[_CLIENT_MODULE] = None  # type: ignore[assignment]
    from awslambdaric import bootstrap
    from awslambdaric.lambda_config import LambdaConfigProvider
    from awslambdaric.lambda_runtime_client import LambdaRuntimeClient

    config = LambdaConfigProvider(argv)
    client = LambdaRuntimeClient(config.api_address, config.use_thread_polling)
    client.restore_next = ForkServer(sock, client).restore_next  # the snapshot point
    try:
        bootstrap.run(config.handler, client)
    except SystemExit as e:  # awslambdaric's sys.exit(64 / 65 / 1)
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    else:
        code = 0
    # A forked copy must not run the C++ static destructors: they join threads (ONNX Runtime's
    # housekeeping thread) that fork() did not copy, and would wait forever. Flush, then leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv)
