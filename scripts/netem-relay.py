#!/usr/bin/env python3
"""A userspace stand-in for netem (this kernel has no sch_netem): two TUN interfaces, every IP
packet read from one is written to the other after a fixed delay, and a share of them is lost.
Used by NetLab (the tests) and scripts/bench-sync.

    netem-relay.py TUN_A TUN_B [--delay-ms D] [--loss PERCENT] [--seed S]

Creates both interfaces and prints "ready" once they exist; the caller then moves them into
their namespaces, addresses them (point to point) and brings them up. Runs until killed. The
rate of a link is shaped with tbf on the interfaces as usual.
"""
import argparse, collections, fcntl, os, random, select, struct, sys, time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a"); p.add_argument("b")
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0, help="percent of packets lost, each way")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    delay, loss = args.delay_ms / 1000.0, args.loss / 100.0
    fa, fb = open_tun(args.a), open_tun(args.b)
    other = {fa: fb, fb: fa}
    # Constant delay: each direction is a FIFO of (due time, packet).
    queues = {fa: collections.deque(), fb: collections.deque()}  # keyed by the fd to write to
    print("ready", flush=True)
    while True:
        now = time.monotonic()
        for out, q in queues.items():
            while q and q[0][0] <= now:
                _, pkt = q.popleft()
                try:
                    os.write(out, pkt)
                except (BlockingIOError, OSError):
                    pass  # the interface is down or full: the packet is lost, as on a wire
        due = [q[0][0] for q in queues.values() if q]
        timeout = max(0.0, min(due) - now) if due else 1.0
        ready, _, _ = select.select([fa, fb], [], [], timeout)
        for fd in ready:
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if loss and rng.random() < loss:
                    continue
                queues[other[fd]].append((time.monotonic() + delay, pkt))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
