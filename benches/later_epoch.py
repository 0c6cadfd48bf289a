#!/usr/bin/env python3
"""A later hinted epoch after the kernel evicted the files' pages but kept their inodes (what
memory pressure does to a dataset larger than the page cache).

    sudo python3 benches/later_epoch.py [--bin target/release/rapidfs] [--runs 3]

1,000 image-like files (16 KiB..1 MiB, median ~110 KiB) on a `rapidfs emulator --memory` with
5 ms latency; each run mounts afresh and reads two epochs, each hinted over the control socket
in its own shuffled order, by 4 threads; between the epochs `echo 1 > drop_caches` drops the
page cache (not the inodes). Two spans of `read.prefetch_page_cache_mb`:
  default  half the machine's memory: the files count as still held, nothing is prefetched
           (what every span did before the open clock existed);
  1 MiB    the files opened earlier count as evicted and are prefetched again.
Reports the second epoch's files/s (median of the runs) and their ratio, and writes
target/bench-results/later_epoch.json. Talks to nothing but 127.0.0.1.
"""

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
import prefetch as bench  # noqa: E402  (the emulator, dataset and mount helpers)
from rapidfs_sampler import socket_path  # noqa: E402

FILES = 1000
THREADS = 4
LATENCY_US = 5000


def read_epoch(mountpoint, order):
    """Reads `order` with THREADS threads taking the next file in turn; files/s."""
    turn = iter(order)
    lock = threading.Lock()

    def work():
        while True:
            with lock:
                rel = next(turn, None)
            if rel is None:
                return
            with open(os.path.join(mountpoint, rel), "rb") as f:
                f.read()

    start = time.time()
    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(order) / (time.time() - start)


def two_epochs(binary, endpoint, span_mb):
    """Second-epoch files/s of a fresh mount with `read.prefetch_page_cache_mb = span_mb`."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as cfg:
        cfg.write("[read]\nprefetch_page_cache_mb = %d\n" % span_mb)
    mount = bench.Mount(binary, endpoint, config=cfg.name)
    try:
        # One connection for both epochs: a hint lasts as long as its connection.
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.connect(socket_path(mount.path))
        replies = ctl.makefile("rb")
        rate = None
        for epoch in range(2):
            order = ["d/c%02d/img%06d.jpg" % (i % 20, i)
                     for i in random.Random(epoch).sample(range(FILES), FILES)]
            ctl.sendall((json.dumps({"op": "hint", "paths": order}) + "\n").encode())
            replies.readline()
            rate = read_epoch(mount.path, order)
            subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=True)
        ctl.close()
        return rate
    finally:
        mount.stop()
        os.unlink(cfg.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "target", "release", "rapidfs"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (drop_caches)")
    if not os.path.exists(args.bin):
        subprocess.run(["cargo", "build", "--release", "--bin", "rapidfs"], cwd=REPO, check=True)
    root = os.path.join(REPO, "target", "later-epoch-data")
    if not os.path.isdir(root):
        bench.make_dataset(root, "d", FILES, bench.image_size)
    emulator = bench.Emulator(args.bin, root, LATENCY_US)
    rates = {"default": [], "1 MiB": []}
    try:
        for _ in range(args.runs):
            for name, span in (("default", 0), ("1 MiB", 1)):
                rates[name].append(two_epochs(args.bin, emulator.endpoint, span))
                print("%-8s second epoch %.0f files/s" % (name, rates[name][-1]), flush=True)
    finally:
        emulator.stop()
    median = {k: statistics.median(v) for k, v in rates.items()}
    ratio = median["1 MiB"] / median["default"]
    print("second epoch after the page cache was dropped, %d threads, %d ms, median of %d:"
          % (THREADS, LATENCY_US // 1000, args.runs))
    print("  span default %.0f files/s, span 1 MiB %.0f files/s: %.2fx"
          % (median["default"], median["1 MiB"], ratio))
    out = os.path.join(REPO, "target", "bench-results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "later_epoch.json"), "w") as f:
        json.dump({"files": FILES, "threads": THREADS, "latency_us": LATENCY_US,
                   "runs": rates, "median": median, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
