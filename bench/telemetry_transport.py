"""What a reader pays per telemetry message: the agent's datagram socket against connections.

The agent reads trainers' datagrams with one blocking `recvmsg` each, asking the kernel for the
sender's credentials (agent/telemetry/inbox.py), because the kernel queues only
`net.unix.max_dgram_qlen` (often 10) datagrams on an unconnected socket. Connected sockets
(`SOCK_SEQPACKET`: message boundaries kept, the sender known once per connection from
`SO_PEERCRED`) have no such limit, so a reader could sleep between batches and drain every
connection at once. This measures both readers side by side in one run, under the agent
benchmark's load (bench/agent.py: 64 ranks sending 10 messages a second each, in bursts),
each reader validating every message as the agent does; the reader thread's own CPU clock.

    .venv/bin/python bench/telemetry_transport.py [--seconds 10] [--pace 0.1]
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from typing import Callable

from burnrate.agent.telemetry.schema import MAX_MESSAGE_BYTES, validate

RANKS, RATE_HZ = 64, 10.0
_CREDENTIALS = socket.CMSG_SPACE(struct.calcsize("iII"))


def messages() -> list[bytes]:
    return [json.dumps({"v": 1, "training_job": f"job-{r // 8}", "namespace": "ml", "pod": f"pod-{r}",
                        "rank": r % 8, "world_size": 8, "local_rank": r % 8, "step": 1, "time": time.time(),
                        "steps": 1, "step_s": 0.1, "data_wait_s": 0.004, "compute_s": 0.09, "samples": 8,
                        "tokens": 8192, "flops": 6e12, "loss": 2.5, "grad_norm": 1.0, "mfu": 0.4}).encode()
            for r in range(RANKS)]


def _thread_cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def datagrams(path: str, stop: threading.Event, out: dict) -> tuple[threading.Thread, Callable[[], list]]:
    """The agent's way: one blocking recvmsg with credentials a datagram."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    server.bind(path)

    def read() -> None:
        start, count = _thread_cpu(), 0
        while True:
            payload, _, _, _ = server.recvmsg(MAX_MESSAGE_BYTES + 1, _CREDENTIALS)
            if not payload and stop.is_set():
                break
            validate(payload)
            count += 1
        out.update(cpu=_thread_cpu() - start, count=count)
        server.close()

    def senders() -> list:
        socks = [socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(RANKS)]
        return [lambda data, s=s: s.sendto(data, path) for s in socks] + [lambda: [s.close() for s in socks]]

    return threading.Thread(target=read), senders


def connections(path: str, stop: threading.Event, out: dict, pace_s: float
                ) -> tuple[threading.Thread, Callable[[], list]]:
    """Connected SEQPACKET sockets read through epoll: one message from each ready connection a
    poll, then `pace_s` of sleep, so that each wake-up finds most ranks' messages waiting."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen(RANKS * 2)
    server.setblocking(False)
    poller = select.epoll()
    poller.register(server.fileno(), select.EPOLLIN)
    open_ = {}

    def read() -> None:
        start, count = _thread_cpu(), 0
        while True:
            events = poller.poll(0.5)
            if not events:
                if stop.is_set():
                    break
                continue
            for fd, _ in events:
                if fd == server.fileno():
                    while True:
                        try:
                            conn, _ = server.accept()
                        except BlockingIOError:
                            break
                        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII"))
                        open_[conn.fileno()] = conn
                        poller.register(conn.fileno(), select.EPOLLIN)
                    continue
                payload = open_[fd].recv(MAX_MESSAGE_BYTES + 1)
                if not payload:
                    poller.unregister(fd)
                    open_.pop(fd).close()
                    continue
                validate(payload)
                count += 1
            time.sleep(pace_s)
        out.update(cpu=_thread_cpu() - start, count=count)
        for conn in open_.values():
            conn.close()
        poller.close()
        server.close()

    def senders() -> list:
        socks = []
        for _ in range(RANKS):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            s.connect(path)
            s.setblocking(False)
            socks.append(s)
        return [lambda data, s=s: s.send(data) for s in socks] + [lambda: [s.close() for s in socks]]

    return threading.Thread(target=read), senders


def run(kind: str, seconds: float, pace_s: float) -> dict:
    tmp = tempfile.mkdtemp(prefix="burnrate-transport-")
    path, stop, out = os.path.join(tmp, "telemetry.sock"), threading.Event(), {}
    try:
        reader, make = datagrams(path, stop, out) if kind == "datagrams" else connections(path, stop, out, pace_s)
        reader.start()
        *send, close = make()
        payloads, sent = messages(), 0
        next_at = t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for rank in range(RANKS):
                try:
                    send[rank](payloads[rank])
                    sent += 1
                except OSError:
                    pass
            next_at += 1.0 / RATE_HZ
            time.sleep(max(0.0, next_at - time.monotonic()))
        time.sleep(0.5)
        stop.set()
        if kind == "datagrams":
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"", path)
        reader.join()
        close()
        return {"sent": sent, "read": out["count"], "us": 1e6 * out["cpu"] / max(out["count"], 1),
                "core": 100 * out["cpu"] / seconds}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--pace", type=float, default=0.1, help="the connection reader's sleep between polls, s")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each reader, alternately")
    args = parser.parse_args()
    rows = {"datagrams": [], "connections": []}
    for _ in range(args.rounds):
        for kind in rows:
            rows[kind].append(run(kind, args.seconds, args.pace))
    print(f"{RANKS} ranks x {RATE_HZ:g} messages/s in bursts, {args.seconds:g} s a run, {os.cpu_count()} CPUs; "
          f"connections polled every {args.pace:g} s\n")
    print("| reader | messages sent / read | µs of the reader's CPU a message | % of a core |")
    print("|---|---|---|---|")
    for kind, runs in rows.items():
        print(f"| {kind} | " + ", ".join(f"{r['sent']}/{r['read']}" for r in runs) + " | "
              + ", ".join(f"{r['us']:.2f}" for r in runs) + " | " + ", ".join(f"{r['core']:.3f}" for r in runs) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
