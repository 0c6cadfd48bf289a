#!/usr/bin/env python3
"""What serving metrics costs: 4 KiB random reads through three rapidfs mounts of the same
data, one with --metrics-addr and two without, measured in the same run, taking turns. The
second mount without metrics is the harness's own noise floor (its ratio to the first should
be 1.0).

Each mount runs its own built-in emulator (--emulator) over a directory of its own in /dev/shm
(tmpfs; one emulator serves a directory at a time), each holding a hard link to the same data
file, so the data never touches a disk. Reads use O_DIRECT (the kernel page cache is
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
    first one rotating), so a burst of noise from the shared cores hits all alike."""
    rng = random.Random(seed)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    fds = {m: open_direct(p) for m, p in paths.items()}
    spent = {m: 0.0 for m in paths}
    try:
        modes = list(paths)
        for b in range(ops // batch):
            offsets = [rng.randrange(size // BLOCK) * BLOCK for _ in range(batch)]
            k = b % len(modes)
            for m in modes[k:] + modes[:k]:
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
    ap.add_argument("--json", default=os.path.join(here, "..", "target", "metrics_overhead.json"))
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    size = args.size_mb << 20

    work = tempfile.mkdtemp(prefix="rapidfs-mbench-", dir="/dev/shm")
    data = os.path.join(work, "data.bin")
    with open(data, "wb") as f:
        for _ in range(args.size_mb):
            f.write(os.urandom(1 << 20))
    mnts = {m: tempfile.mkdtemp(prefix=f"{m}-", dir=work) for m in ("off", "off2", "on")}
    roots = {m: os.path.join(work, f"root-{m}") for m in mnts}
    for root in roots.values():
        os.makedirs(os.path.join(root, BUCKET))
        os.link(data, os.path.join(root, BUCKET, "data.bin"))
    port = free_port()
    try:
        mount(binary, roots["off"], mnts["off"], [])
        mount(binary, roots["off2"], mnts["off2"], [])
        mount(binary, roots["on"], mnts["on"], ["--metrics-addr", f"127.0.0.1:{port}"])
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
                           "noise_ratio": got["off2"] / got["off"],
                           "off_cpu_us": cpu["off"], "on_cpu_us": cpu["on"],
                           "cpu_ratio": cpu["on"] / cpu["off"],
                           "noise_cpu_ratio": cpu["off2"] / cpu["off"]})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        served = text.decode().count("rapidfs_fuse_requests_total{")
    finally:
        for m in mnts.values():
            unmount(m)
        subprocess.run(["rm", "-rf", work], check=False)

    def med(key):
        v = [r[key] for r in rounds]
        return f"{statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"

    print(f"{'round':>5} {'latency off µs':>15} {'on µs':>7} {'on/off':>7} {'off2/off':>8}"
          f" {'daemon CPU off µs/req':>22} {'on µs':>7} {'on/off':>7} {'off2/off':>8}")
    for r in rounds:
        print(f"{r['round']:>5} {r['off_us']:>15.1f} {r['on_us']:>7.1f} {r['ratio']:>7.3f}"
              f" {r['noise_ratio']:>8.3f} {r['off_cpu_us']:>22.2f} {r['on_cpu_us']:>7.2f}"
              f" {r['cpu_ratio']:>7.3f} {r['noise_cpu_ratio']:>8.3f}")
    print(f"median [min-max] latency on/off {med('ratio')}, noise floor off2/off "
          f"{med('noise_ratio')}; daemon CPU per request on/off {med('cpu_ratio')}, noise floor "
          f"{med('noise_cpu_ratio')}; {served} request series served; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = {
        "benchmark": "metrics_overhead",
        "workload": f"4 KiB O_DIRECT random preads, {args.ops} per mode per round, "
                    f"modes alternating every {args.batch}, warm block cache",
        "machine": {"cores": os.cpu_count(), "kernel": platform.release()},
        "config": {"binary": binary, "size_mb": args.size_mb, "ops": args.ops,
                   "rounds": args.rounds, "batch": args.batch, "backend": "built-in emulator over /dev/shm"},
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
        "median_noise_ratio": statistics.median(r["noise_ratio"] for r in rounds),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rounds),
        "median_noise_cpu_ratio": statistics.median(r["noise_cpu_ratio"] for r in rounds),
        "load_average": os.getloadavg()[0],
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {os.path.abspath(args.json)}")


if __name__ == "__main__":
    sys.exit(main())
