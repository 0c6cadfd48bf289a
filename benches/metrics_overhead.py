#!/usr/bin/env python3
"""What serving metrics costs: 4 KiB random reads through two rapidfs mounts of the same data,
one with --metrics-addr and one without, measured in the same run, alternating.

Each mount runs its own built-in emulator (--emulator) over the same directory in /dev/shm
(tmpfs), so the data never touches a disk. Reads use O_DIRECT (the kernel page cache is
bypassed, every read is a FUSE request) at random 4 KiB-aligned offsets of a file that was
read once first, so the daemon answers from its block cache: the shortest path a request can
take, where the metrics' share of the work is largest. The reader, both daemons and their
emulators share the machine's cores.

Prints a table and writes JSON (machine, configuration, every round, the median ratio).

    python3 benches/metrics_overhead.py [--binary target/release/rapidfs] [--ops 20000]
"""

import argparse
import json
import mmap
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

BUCKET = "bench"
BLOCK = 4096


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mount(binary, root, mnt, extra):
    cmd = [binary, "mount", BUCKET, mnt, "--emulator", root] + extra
    subprocess.run(cmd, check=True, stdin=subprocess.DEVNULL)


def unmount(mnt):
    subprocess.run(["umount", mnt], check=False)


def daemon_pid(mnt):
    """The rapidfs daemon whose command line names `mnt`."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"mount" in args and mnt.encode() in args:
            return int(pid)
    raise RuntimeError(f"no daemon for {mnt}")


def cpu_ns(pid):
    """CPU time of every thread of `pid` so far, in ns (schedstat: exact, not in ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass  # a thread that just ended
    return total


def open_direct(path):
    return os.open(path, os.O_RDONLY | os.O_DIRECT)


def timed_reads(fd, offsets, buf):
    """Seconds spent on 4 KiB O_DIRECT preads at `offsets`."""
    start = time.perf_counter()
    for off in offsets:
        if os.preadv(fd, [buf], off) != BLOCK:
            raise RuntimeError(f"short read at {off}")
    return time.perf_counter() - start


def interleaved(paths, size, ops, batch, seed):
    """Mean seconds per read for each mode; the modes take turns every `batch` reads (the
    first one alternating), so a burst of noise from the shared cores hits both alike."""
    rng = random.Random(seed)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    fds = {m: open_direct(p) for m, p in paths.items()}
    spent = {m: 0.0 for m in paths}
    try:
        modes = list(paths)
        for b in range(ops // batch):
            offsets = [rng.randrange(size // BLOCK) * BLOCK for _ in range(batch)]
            for m in (modes if b % 2 == 0 else modes[::-1]):
                spent[m] += timed_reads(fds[m], offsets, buf)
    finally:
        for fd in fds.values():
            os.close(fd)
    n = (ops // batch) * batch
    return {m: t / n for m, t in spent.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    default_bin = os.path.join(here, "..", "target", "release", "rapidfs")
    if not os.path.exists(default_bin):
        default_bin = os.path.join(here, "..", "target", "debug", "rapidfs")
    ap.add_argument("--binary", default=default_bin)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--ops", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--control", action="store_true",
                    help="A/A check: neither mount serves metrics (the ratio shows the harness's bias)")
    ap.add_argument("--json", default=os.path.join(here, "..", "target", "metrics_overhead.json"))
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    size = args.size_mb << 20

    work = tempfile.mkdtemp(prefix="rapidfs-mbench-", dir="/dev/shm")
    root = os.path.join(work, "root")
    os.makedirs(os.path.join(root, BUCKET))
    with open(os.path.join(root, BUCKET, "data.bin"), "wb") as f:
        for _ in range(args.size_mb):
            f.write(os.urandom(1 << 20))
    mnts = {"off": tempfile.mkdtemp(prefix="off-", dir=work),
            "on": tempfile.mkdtemp(prefix="on-", dir=work)}
    port = free_port()
    try:
        mount(binary, root, mnts["off"], [])
        mount(binary, root, mnts["on"], [] if args.control else ["--metrics-addr", f"127.0.0.1:{port}"])
        for m in mnts.values():  # warm each daemon's block cache with one sequential pass
            fd = os.open(os.path.join(m, "data.bin"), os.O_RDONLY)
            while os.read(fd, 1 << 20):
                pass
            os.close(fd)
        rounds = []
        paths = {m: os.path.join(p, "data.bin") for m, p in mnts.items()}
        pids = {m: daemon_pid(p) for m, p in mnts.items()}
        for r in range(args.rounds):
            before = {m: cpu_ns(pid) for m, pid in pids.items()}
            got = interleaved(paths, size, args.ops, args.batch, r)
            cpu = {m: (cpu_ns(pid) - before[m]) / args.ops / 1e3 for m, pid in pids.items()}
            rounds.append({"round": r, "off_us": got["off"] * 1e6, "on_us": got["on"] * 1e6,
                           "ratio": got["on"] / got["off"],
                           "off_cpu_us": cpu["off"], "on_cpu_us": cpu["on"],
                           "cpu_ratio": cpu["on"] / cpu["off"]})
        served = 0
        if not args.control:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
            served = text.decode().count("rapidfs_fuse_requests_total{")
    finally:
        for m in mnts.values():
            unmount(m)
        subprocess.run(["rm", "-rf", work], check=False)

    ratios = [r["ratio"] for r in rounds]
    cpu_ratios = [r["cpu_ratio"] for r in rounds]
    print(f"{'round':>5} {'latency off µs':>15} {'on µs':>7} {'on/off':>7}"
          f" {'daemon CPU off µs/req':>22} {'on µs':>7} {'on/off':>7}")
    for r in rounds:
        print(f"{r['round']:>5} {r['off_us']:>15.1f} {r['on_us']:>7.1f} {r['ratio']:>7.3f}"
              f" {r['off_cpu_us']:>22.2f} {r['on_cpu_us']:>7.2f} {r['cpu_ratio']:>7.3f}")
    print(f"median on/off: latency {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}), "
          f"daemon CPU per request {statistics.median(cpu_ratios):.3f} "
          f"(min {min(cpu_ratios):.3f}, max {max(cpu_ratios):.3f}); "
          f"{served} request series were being served; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    out = {
        "benchmark": "metrics_overhead",
        "workload": f"4 KiB O_DIRECT random preads, {args.ops} per mode per round, "
                    f"modes alternating every {args.batch}, warm block cache",
        "machine": {"cores": os.cpu_count(), "kernel": platform.release()},
        "config": {"control": args.control, "binary": binary, "size_mb": args.size_mb, "ops": args.ops,
                   "rounds": args.rounds, "batch": args.batch, "backend": "built-in emulator over /dev/shm"},
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "load_average": os.getloadavg()[0],
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.abspath(args.json)}")


if __name__ == "__main__":
    sys.exit(main())
