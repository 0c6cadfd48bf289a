#!/usr/bin/env python3
"""Prefetch benchmark: what the sampler helper and the small-file fast path buy.

One command, one run, a table for people and JSON for machines (median, min and max of
--runs runs; every ratio is against a baseline measured in the same run):

  1. helper: a torch DataLoader (--workers processes, shuffled, decoding nothing) over a few
     thousand ~110 KiB files with --latency-us of emulator latency, samples/s with
     RapidfsSampler vs a plain RandomSampler, each on a fresh mount;
  2. memory: the same epoch with the helper and a budget of a quarter of the dataset: peak
     resident memory of the daemon vs budget, bytes fetched (daemon counters) vs dataset;
  3. fast path: 4 reader processes reading cold 128 KiB files in shuffled order, files/s of
     this rapidfs, of --base-bin (the read path before the fast path) and of the local
     directory read cold, at 0 ms and at --latency-us.

The emulator (`rapidfs emulator --memory`, same binary) and the mount share the machine's
cores with the readers; the table says how many. Needs root (drop_caches, FUSE) and the
Python of tests/setup.sh (RAPIDFS_PYTHON) with torch.

  python3 benches/prefetch.py --bin target/release/rapidfs --base-bin /tmp/base/rapidfs
"""

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUCKET = "bench"

LOADER = r"""
import json, os, sys, time
sys.path.insert(0, os.environ["SAMPLER_DIR"])
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler
from rapidfs_sampler import RapidfsSampler

root, top, mode, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Files(Dataset):
    def __init__(self, top):
        self.paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs)
    def __len__(self):
        return len(self.paths)
    def __getitem__(self, i):
        with open(self.paths[i], "rb", buffering=0) as f:
            n = 0
            while True:
                b = f.read(1 << 20)
                if not b:
                    return n
                n += len(b)

t0 = time.perf_counter()
ds = Files(top)
listed = time.perf_counter() - t0
base = RandomSampler(ds, generator=torch.Generator().manual_seed(7))
sampler = RapidfsSampler(base, ds.paths, root) if mode == "helper" else base
loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=workers,
                    collate_fn=lambda b: b)
t0 = time.perf_counter()
first = None
n = nbytes = 0
for batch in loader:
    if first is None:
        first = time.perf_counter() - t0
    n += len(batch)
    nbytes += sum(batch)
t = time.perf_counter() - t0
print(json.dumps({"samples": n, "bytes": nbytes, "seconds": t, "first_batch": first,
                  "list_seconds": listed}))
"""

READER = r"""
import os, sys, time
from multiprocessing import Pool

def read(paths):
    n = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                n += len(b)
    return n

if __name__ == "__main__":
    paths = sys.stdin.read().split()
    procs = int(sys.argv[1])
    parts = [paths[i::procs] for i in range(procs)]
    with Pool(procs) as pool:
        t0 = time.perf_counter()
        total = sum(pool.map(read, parts))
        t = time.perf_counter() - t0
    print(len(paths), total, t)
"""


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_dataset(root, sub, count, size_of):
    top = os.path.join(root, BUCKET, sub)
    total = 0
    rnd = random.Random(count)
    for i in range(count):
        d = os.path.join(top, "c%02d" % (i % 20))
        os.makedirs(d, exist_ok=True)
        size = size_of(rnd)
        with open(os.path.join(d, "img%06d.jpg" % i), "wb") as f:
            f.write(rnd.randbytes(size))
        total += size
    return total


def image_size(rnd):
    # 16 KiB .. 1 MiB, median about 110 KiB.
    return int(min(1 << 20, max(16 << 10, rnd.lognormvariate(11.6, 0.6))))


class Emulator:
    def __init__(self, binary, root, latency_us):
        self.port = free_port()
        cmd = [binary, "emulator", "--memory", "--root", root,
               "--listen", "127.0.0.1:%d" % self.port]
        if latency_us:
            cmd += ["--latency-us", str(latency_us)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise SystemExit("the emulator did not start")
                time.sleep(0.1)
        self.endpoint = "http://127.0.0.1:%d" % self.port

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class Mount:
    """A foreground daemon (its pid is ours to sample) on a fresh mountpoint."""

    def __init__(self, binary, endpoint, memory_mb=None, config=None):
        self.dir = tempfile.mkdtemp(prefix="rapidfs-bench-")
        self.path = os.path.realpath(self.dir)
        cmd = [binary, "mount", BUCKET, self.path, "--foreground", "--endpoint", endpoint]
        if memory_mb:
            cmd += ["--memory-mb", str(memory_mb)]
        if config:
            cmd += ["--config", config]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while not os.path.ismount(self.path):
            if time.time() > deadline or self.proc.poll() is not None:
                raise SystemExit("the mount did not come up")
            time.sleep(0.05)

    def control(self, req):
        sys.path.insert(0, os.path.join(REPO, "python"))
        from rapidfs_sampler import socket_path
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(socket_path(self.path))
        s.sendall((json.dumps(req) + "\n").encode())
        reply = json.loads(s.makefile("rb").readline())
        s.close()
        return reply

    def stop(self):
        subprocess.run(["fusermount3", "-u", self.path], check=False)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RssSampler(threading.Thread):
    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_flag = pid, 0, False

    def run(self):
        while not self.stop_flag:
            try:
                with open("/proc/%d/status" % self.pid) as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            self.peak = max(self.peak, int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.02)


def epoch(python, mount, top, mode, workers):
    env = dict(os.environ, SAMPLER_DIR=os.path.join(REPO, "python"))
    env.pop("RAPIDFS_CONTROL_SOCKET", None)
    out = subprocess.run([python, "-c", LOADER, mount.path, top, mode, str(workers)],
                         env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("DataLoader failed: %s" % out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def read_files(python, paths, procs):
    out = subprocess.run([python, "-c", READER, str(procs)], input="\n".join(paths),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("readers failed: %s" % out.stderr[-2000:])
    n, total, t = out.stdout.split()
    return int(n) / float(t)


def summary(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target/release/rapidfs"))
    ap.add_argument("--base-bin", help="rapidfs binary before the small-file fast path")
    ap.add_argument("--python", default=os.environ.get("RAPIDFS_PYTHON", sys.executable))
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--small-files", type=int, default=1500)
    ap.add_argument("--latency-us", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="bench-prefetch.json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (drop_caches, FUSE)")

    work = tempfile.mkdtemp(prefix="rapidfs-bench-data-")
    result = {"cores": os.cpu_count(), "kernel": platform.release(), "config": vars(a)}
    try:
        dataset = make_dataset(work, "ds", a.files, image_size)
        small = make_dataset(work, "small", a.small_files, lambda r: 128 << 10)
        emu = Emulator(a.bin, work, a.latency_us)
        try:
            # 1. The helper against a plain sampler, each on a fresh, cold mount.
            rates = {"plain": [], "helper": []}
            used = []
            for _ in range(a.runs):
                for mode in ("plain", "helper"):
                    drop_caches()
                    m = Mount(a.bin, emu.endpoint)
                    try:
                        r = epoch(a.python, m, os.path.join(m.path, "ds"), mode, a.workers)
                        rates[mode].append(r["samples"] / r["seconds"])
                        if mode == "helper":
                            used.append(m.control({"op": "stats"})["prefetch_used"])
                    finally:
                        m.stop()
            ratio = [h / p for h, p in zip(rates["helper"], rates["plain"])]
            result["helper"] = {"plain_samples_s": summary(rates["plain"]),
                                "helper_samples_s": summary(rates["helper"]),
                                "ratio": summary(ratio), "prefetch_used": used,
                                "files": a.files, "dataset_bytes": dataset}
            # 2. Memory: a budget of a quarter of the dataset.
            budget_mb = max(16, dataset // 4 // (1 << 20))
            drop_caches()
            m = Mount(a.bin, emu.endpoint, memory_mb=budget_mb)
            rss = RssSampler(m.proc.pid)
            rss.start()
            try:
                r = epoch(a.python, m, os.path.join(m.path, "ds"), "helper", a.workers)
                st = m.control({"op": "stats"})
            finally:
                rss.stop_flag = True
                rss.join()
                m.stop()
            fetched = st["prefetch_bytes"] + st["demand_bytes"] + st["readahead_bytes"]
            result["memory"] = {"budget_mb": budget_mb, "peak_rss_mb": rss.peak / (1 << 20),
                                "fetched_over_dataset": fetched / dataset,
                                "samples_s": r["samples"] / r["seconds"], "stats": st}
        finally:
            emu.stop()

        # 3. The fast path: cold 128 KiB files, 4 readers, shuffled.
        names = sorted(os.path.relpath(os.path.join(d, f), os.path.join(work, BUCKET))
                       for d, _, fs in os.walk(os.path.join(work, BUCKET, "small")) for f in fs)
        random.Random(1).shuffle(names)
        fast = {}
        for latency in (0, a.latency_us):
            emu = Emulator(a.bin, work, latency)
            try:
                rows = {"local": [], "rapidfs": [], "base": []}
                for _ in range(a.runs):
                    drop_caches()
                    rows["local"].append(read_files(
                        a.python, [os.path.join(work, BUCKET, n) for n in names], 4))
                    for key, binary in (("rapidfs", a.bin), ("base", a.base_bin)):
                        if not binary:
                            continue
                        m = Mount(binary, emu.endpoint)
                        try:
                            # Listing first: the reads that follow cost reads only.
                            for _ in os.walk(os.path.join(m.path, "small")):
                                pass
                            drop_caches()
                            rows[key].append(read_files(
                                a.python, [os.path.join(m.path, n) for n in names], 4))
                        finally:
                            m.stop()
                row = {k: summary(v) for k, v in rows.items() if v}
                row["rapidfs_vs_local"] = summary(
                    [x / y for x, y in zip(rows["rapidfs"], rows["local"])])
                if rows["base"]:
                    row["rapidfs_vs_base"] = summary(
                        [x / y for x, y in zip(rows["rapidfs"], rows["base"])])
                fast["%dus" % latency] = row
            finally:
                emu.stop()
        result["fast_path"] = fast
    finally:
        shutil.rmtree(work, ignore_errors=True)

    h = result["helper"]
    print("prefetch benchmark: %d cores, kernel %s; emulator, mount and readers share them"
          % (result["cores"], result["kernel"]))
    print("\n1. DataLoader, %d workers, %d files (%.0f MiB), %d us latency, fresh cold mount"
          % (a.workers, a.files, dataset / (1 << 20), a.latency_us))
    print("   %-22s %12s %12s %12s" % ("", "median", "min", "max"))
    for k, label in (("plain_samples_s", "plain samples/s"), ("helper_samples_s", "helper samples/s"),
                     ("ratio", "helper / plain")):
        s = h[k]
        print("   %-22s %12.2f %12.2f %12.2f" % (label, s["median"], s["min"], s["max"]))
    mm = result["memory"]
    print("\n2. Budget %d MiB (dataset / 4), helper: peak RSS %.0f MiB (budget + %.0f), "
          "fetched %.3fx dataset, %d evicted unused"
          % (mm["budget_mb"], mm["peak_rss_mb"], mm["peak_rss_mb"] - mm["budget_mb"],
             mm["fetched_over_dataset"], mm["stats"]["prefetch_evicted_unused"]))
    print("\n3. Cold 128 KiB files, 4 readers, files/s")
    for lat, row in fast.items():
        cells = ["%s %.0f" % (k, row[k]["median"]) for k in ("local", "rapidfs", "base") if k in row]
        ratios = ["rapidfs/local %.2f" % row["rapidfs_vs_local"]["median"]]
        if "rapidfs_vs_base" in row:
            ratios.append("rapidfs/base %.2f" % row["rapidfs_vs_base"]["median"])
        print("   %-8s %s | %s" % (lat, ", ".join(cells), ", ".join(ratios)))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print("\nJSON: %s" % a.out)


if __name__ == "__main__":
    main()
