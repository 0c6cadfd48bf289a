#!/usr/bin/env python3
"""rapidfs write-path benchmark (issues 5 and 6): one command, a table for people, JSON for machines.

    sudo python3 benches/write_bench.py [--runs 3] [--append-mib 512] [--out target/bench/write.json]

The same operations on a local directory and on rapidfs, measured in the same run:
  - appends: 1 MiB writes with fsync every 8 MiB (a log or shard writer); throughput and the
    latency of each fsync (p50/p99);
  - checkpoint: a 1 GiB file written in 1 MiB writes and closed (on the local directory
    fsync + close, so both sides end with the bytes durable; rapidfs's close persists);
  - torch.save-style checkpoint: the same 1 GiB, but a 4 KiB header is written first and
    patched at the end (seek back to 0), as zip writers do: on rapidfs this leaves the
    streaming path for the staging path (the streamed bytes are read back into a staged copy,
    patched, and uploaded as a new generation at close); compared with the plain streaming
    checkpoint of the same run and with the local directory (fsync + close);
  - small files: --small-files files of 16 KiB, each created, written and closed, in a new
    directory; files per second (the local directory without fsync, as tools write them).
rapidfs mounts the emulator (memory backend, a separate process on loopback, restarted for
every run so memory does not pile up). Every figure is the median of --runs runs with min
and max, and each rapidfs figure is also given as a ratio to the local directory. The
emulator, the daemon and the writer share the machine's cores: see "cores" in the output.
"""
import argparse, json, os, platform, shutil, socket, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# RAPIDFS_BIN overrides the binary (and skips the release build), e.g. to try the script out.
BIN = os.environ.get("RAPIDFS_BIN", os.path.join(ROOT, "target", "release", "rapidfs"))
MIB = 1 << 20
BUCKET = "bench"


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rapidfs:
    """An emulator process (memory backend, empty bucket) and a rapidfs mount of it."""

    def __init__(self, work, mnt):
        self.mnt = mnt
        root = os.path.join(work, "emulator-root")
        os.makedirs(os.path.join(root, BUCKET), exist_ok=True)
        self.port = free_port()
        self.emu = subprocess.Popen(
            [BIN, "emulator", "--memory", "--root", root, "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.emu.poll() is not None:
                    sys.exit("the emulator did not start")
                time.sleep(0.1)
        conf = os.path.join(work, "rapidfs.toml")
        with open(conf, "w") as f:
            f.write(f'[write]\nstaging_dir = "{work}/staging"\n')
        sh(BIN, "mount", BUCKET, mnt, "--endpoint", f"http://127.0.0.1:{self.port}", "--config", conf)

    def stop(self):
        subprocess.run(["umount", self.mnt], stderr=subprocess.DEVNULL)
        self.emu.terminate()
        self.emu.wait()


def appends(path, total_mib, sync_every_mib, block):
    """Writes total_mib in 1 MiB writes, fsync every sync_every_mib; (GB/s, fsync latencies)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    lat = []
    t0 = time.perf_counter()
    try:
        for i in range(total_mib):
            os.write(fd, block)
            if (i + 1) % sync_every_mib == 0:
                t = time.perf_counter()
                os.fsync(fd)
                lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    return total_mib * MIB / (time.perf_counter() - t0) / 1e9, lat


def checkpoint(path, total_mib, block, fsync):
    """A checkpoint: total_mib in 1 MiB writes, then (fsync and) close; seconds to durable."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(total_mib):
            os.write(fd, block)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def torch_style(path, total_mib, block, fsync):
    """A torch.save-style checkpoint: header placeholder, data, then the header patched;
    seconds to durable."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"\0" * 4096)
        for _ in range(total_mib):
            os.write(fd, block)
        os.pwrite(fd, b"HEADER" * 682, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def small_files(dirpath, count, size):
    """count files of size bytes, each created, written, closed; files per second."""
    os.makedirs(dirpath)
    data = os.urandom(size)
    t0 = time.perf_counter()
    for i in range(count):
        fd = os.open(os.path.join(dirpath, f"f{i:05d}.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    return count / (time.perf_counter() - t0)


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--append-mib", type=int, default=512)
    ap.add_argument("--checkpoint-mib", type=int, default=1024)
    ap.add_argument("--small-files", type=int, default=1000)
    ap.add_argument("--work", default="/var/tmp/rapidfs-write-bench")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench", "write.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: mounting needs it")
    if "RAPIDFS_BIN" not in os.environ:
        sh("cargo", "build", "--release", "--quiet", cwd=ROOT)

    shutil.rmtree(args.work, ignore_errors=True)
    local = os.path.join(args.work, "local")
    mnt = os.path.join(args.work, "rapidfs")
    os.makedirs(local)
    os.makedirs(mnt)
    block = os.urandom(MIB)
    measures = ("append_GBps", "fsync_p50_ms", "fsync_p99_ms", "checkpoint_s", "torch_style_s",
                "small_files_per_s")
    res = {}
    for target in ("local", "rapidfs"):
        runs = {k: [] for k in measures}
        for r in range(args.runs):
            rapid = Rapidfs(args.work, mnt) if target == "rapidfs" else None
            root = mnt if rapid else local
            try:
                gbps, lat = appends(os.path.join(root, f"append-{r}.bin"), args.append_mib, 8, block)
                secs = checkpoint(os.path.join(root, f"ckpt-{r}.pt"), args.checkpoint_mib, block,
                                  fsync=rapid is None)
                patched = torch_style(os.path.join(root, f"torch-{r}.pt"), args.checkpoint_mib, block,
                                      fsync=rapid is None)
                rate = small_files(os.path.join(root, f"small-{r}"), args.small_files, 16 * 1024)
            finally:
                if rapid:
                    rapid.stop()
                else:
                    shutil.rmtree(local)
                    os.makedirs(local)
            runs["append_GBps"].append(gbps)
            runs["fsync_p50_ms"].append(pct(lat, 0.5) * 1e3)
            runs["fsync_p99_ms"].append(pct(lat, 0.99) * 1e3)
            runs["checkpoint_s"].append(secs)
            runs["torch_style_s"].append(patched)
            runs["small_files_per_s"].append(rate)
        for k, v in runs.items():
            res[f"{k}/{target}"] = summary(v)

    def med(key):
        return res[key]["median"]

    ratios = {
        "append throughput rapidfs/local": med("append_GBps/rapidfs") / med("append_GBps/local"),
        "fsync p50 rapidfs/local": med("fsync_p50_ms/rapidfs") / med("fsync_p50_ms/local"),
        "fsync p99 rapidfs/local": med("fsync_p99_ms/rapidfs") / med("fsync_p99_ms/local"),
        "checkpoint time rapidfs/local": med("checkpoint_s/rapidfs") / med("checkpoint_s/local"),
        "torch-style (staging) time rapidfs/local": med("torch_style_s/rapidfs") / med("torch_style_s/local"),
        "torch-style (staging) / plain checkpoint (streaming), rapidfs":
            med("torch_style_s/rapidfs") / med("checkpoint_s/rapidfs"),
        "small files per second rapidfs/local": med("small_files_per_s/rapidfs") / med("small_files_per_s/local"),
    }
    out = {
        "benchmark": "rapidfs write path (issues 5 and 6)",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "load_average_at_end": os.getloadavg(),
        "configuration": {"runs": args.runs, "append_mib": args.append_mib, "fsync_every_mib": 8,
                          "checkpoint_mib": args.checkpoint_mib, "write_size": MIB,
                          "small_files": args.small_files, "small_file_bytes": 16 * 1024,
                          "staging_dir": args.work + "/staging",
                          "local": args.work + "/local (local fsync + close for the checkpoint)",
                          "emulator": "memory backend, separate process, loopback",
                          "rapidfs": "default config but write.staging_dir (release build)",
                          "note": "emulator, daemon and writer share the same cores"},
        "results": res, "ratios": ratios,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)

    print(f"\nrapidfs write benchmark: {os.cpu_count()} cores, kernel {platform.release()}, "
          f"median of {args.runs} (min..max); emulator, daemon and writer share the cores\n")
    print(f"{'measure':<24} {'target':<8} {'median':>10} {'min':>10} {'max':>10}")
    for key, v in res.items():
        what, target = key.split("/")
        print(f"{what:<24} {target:<8} {v['median']:>10.3f} {v['min']:>10.3f} {v['max']:>10.3f}")
    print()
    for k, v in ratios.items():
        print(f"{k:<62} {v:>8.2f}x")
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
