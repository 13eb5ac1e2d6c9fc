#!/usr/bin/env python3
"""Idle long-polls against one `nimbus serve` (scripts/bench-server): opens N connections, each
holding `GET …/changes?wait=60` (as devices do when nothing changes), and reports the server's
resident memory and CPU while they wait, next to the same server idle.

    idle-polls.py URL TOKEN CONTAINER SERVER_PID [--polls N] [--seconds S]
"""
import argparse, asyncio, json, os, resource, sys, time, urllib.request

CLK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK  # utime + stime


def waiting(url):
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("nimbus_longpolls_waiting "):
                return int(float(line.split()[1]))
    return -1


async def hold(host, port, request, opened):
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    await writer.drain()
    opened.append(writer)
    try:
        await reader.read(1)  # answered (a commit, the wait's end, or the server going away)
    except Exception:
        pass


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("url"); p.add_argument("token"); p.add_argument("container"); p.add_argument("pid", type=int)
    p.add_argument("--polls", type=int, default=10_000)
    p.add_argument("--seconds", type=float, default=10)
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.polls + 1024), hard))
    host, port = a.url.split("//")[1].rsplit(":", 1)
    with urllib.request.urlopen(urllib.request.Request(f"{a.url}/v1/containers/{a.container}", method="PUT",
                                headers={"Authorization": f"Bearer {a.token}"}), timeout=5) as r:
        cursor = json.load(r)["cursor"]
    request = (f"GET /v1/containers/{a.container}/changes?since={cursor}&wait=60 HTTP/1.1\r\nHost: {host}\r\n"
               f"Authorization: Bearer {a.token}\r\n\r\n").encode()

    rss0, cpu0, t0 = rss_kib(a.pid), cpu_seconds(a.pid), time.monotonic()
    await asyncio.sleep(a.seconds / 2)
    idle_cpu = (cpu_seconds(a.pid) - cpu0) / (time.monotonic() - t0)

    opened, tasks = [], []
    started = time.monotonic()
    for i in range(a.polls):
        tasks.append(asyncio.create_task(hold(host, int(port), request, opened)))
        if i % 500 == 499:
            await asyncio.sleep(0.05)  # let the server accept as they come
    while waiting(a.url) < a.polls and time.monotonic() - started < 50:
        await asyncio.sleep(0.2)
    held = waiting(a.url)
    ready = time.monotonic() - started
    rss1, cpu1, t1 = rss_kib(a.pid), cpu_seconds(a.pid), time.monotonic()
    await asyncio.sleep(a.seconds)
    busy_cpu = (cpu_seconds(a.pid) - cpu1) / (time.monotonic() - t1)
    rss2 = rss_kib(a.pid)
    print(f"server  {a.polls} idle long-polls: {held} held after {ready:.1f} s; server RSS {rss0 / 1024:.0f} MB idle -> "
          f"{max(rss1, rss2) / 1024:.0f} MB with them ({(max(rss1, rss2) - rss0) / a.polls:.1f} KiB each); "
          f"CPU while they wait {busy_cpu * 100:.1f} % of a core (idle server {idle_cpu * 100:.1f} %)")
    for w in opened:
        w.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
