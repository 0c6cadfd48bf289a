#!/usr/bin/env python3
"""rapidfs read-path benchmark (issue 4): one command, a table for people, JSON for machines.

    sudo python3 benches/read_bench.py [--runs 3] [--out target/bench/read.json]

Same data in three places, measured in the same run: the local directory (page cache), a
bindfs passthrough of it (the cost of FUSE alone), and rapidfs mounted over the emulator
(memory backend preloaded from the same directory, a separate process on loopback). Cold
passes drop the page cache (and remount rapidfs, whose block cache would otherwise answer),
then read the local file once so the baselines serve from memory: what is measured is the
filesystem, not the disk. Every figure is the median of --runs runs, with min and max, and
each rapidfs figure is given as a ratio to its baseline. The emulator, the daemon and the
reader share the machine's cores: see "cores" in the output.
"""
import argparse, json, os, platform, random, shutil, socket, statistics, subprocess, sys, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "rapidfs")
MIB = 1 << 20
BUCKET = "bench"


def sh(*cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def drop_caches():
    sh("sync")
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data(data_dir, files, file_kb):
    bucket = os.path.join(data_dir, BUCKET)
    stamp = os.path.join(data_dir, f".made-{files}-{file_kb}")
    if os.path.exists(stamp):
        return bucket
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(os.path.join(bucket, "many"))
    with open(os.path.join(bucket, "big.bin"), "wb") as f:
        for _ in range(1024):
            f.write(os.urandom(MIB))
    chunk = os.urandom(file_kb * 1024)
    for i in range(files):
        with open(os.path.join(bucket, "many", f"f{i:05d}"), "wb") as f:
            f.write(chunk[i % 97:] + chunk[: i % 97])
    open(stamp, "w").close()
    return bucket


class Rapidfs:
    """The emulator process and a rapidfs mount of it."""

    def __init__(self, data_dir, mnt, config):
        self.mnt, self.config = mnt, config
        self.port = free_port()
        self.emu = subprocess.Popen(
            [BIN, "emulator", "--memory", "--root", data_dir, "--listen", f"127.0.0.1:{self.port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline or self.emu.poll() is not None:
                    sys.exit("the emulator did not start")
                time.sleep(0.2)

    def mount(self):
        sh(BIN, "mount", BUCKET, self.mnt, "--endpoint", f"http://127.0.0.1:{self.port}",
           "--config", self.config)

    def unmount(self):
        sh("umount", self.mnt)

    def remount(self):
        self.unmount()
        self.mount()

    def stop(self):
        self.emu.terminate()
        self.emu.wait()


def read_file(path, buf=MIB):
    fd = os.open(path, os.O_RDONLY)
    n = 0
    try:
        while True:
            b = os.read(fd, buf)
            if not b:
                return n
            n += len(b)
    finally:
        os.close(fd)


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def random_reads(path, count, seed):
    rng = random.Random(seed)
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    lat = []
    try:
        for _ in range(count):
            off = rng.randrange(0, size // 4096) * 4096
            t = time.perf_counter()
            os.pread(fd, 4096, off)
            lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    lat.sort()
    return lat[len(lat) // 2], lat[int(len(lat) * 0.99)]


def many_files(dir_, readers):
    names = sorted(os.listdir(dir_))
    parts = [names[i::readers] for i in range(readers)]
    def work(part):
        for n in part:
            read_file(os.path.join(dir_, n))
    threads = [threading.Thread(target=work, args=(p,)) for p in parts]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return len(names) / (time.perf_counter() - t)


def ls_l(dir_):
    return timed(lambda: sh("ls", "-l", dir_, stdout=subprocess.DEVNULL))


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--file-kb", type=int, default=128)
    ap.add_argument("--random-reads", type=int, default=2000)
    ap.add_argument("--work", default="/tmp/rapidfs-bench")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench", "read.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: cold passes drop the page cache")
    for tool in ("bindfs", "fusermount3"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing: source tests/setup.sh installs it")
    sh("cargo", "build", "--release", "--quiet", cwd=ROOT)

    data_dir = os.path.join(args.work, "data")
    local = make_data(data_dir, args.files, args.file_kb)
    bind_mnt = os.path.join(args.work, "bindfs")
    rfs_mnt = os.path.join(args.work, "rapidfs")
    for d in (bind_mnt, rfs_mnt):
        os.makedirs(d, exist_ok=True)
    config = os.path.join(args.work, "rapidfs.toml")
    with open(config, "w") as f:
        f.write("[fs]\nmount_timeout_ms = 60000\n")
    rapid = Rapidfs(data_dir, rfs_mnt, config)
    sh("bindfs", local, bind_mnt)
    rapid.mount()
    targets = {"local": local, "bindfs": bind_mnt, "rapidfs": rfs_mnt}
    res = {}

    def cold():
        rapid.remount()
        drop_caches()
        read_file(os.path.join(local, "big.bin"))

    try:
        gib = 1024 * MIB
        for name, root in targets.items():
            cold_runs, warm_runs = [], []
            for _ in range(args.runs):
                cold()
                path = os.path.join(root, "big.bin")
                cold_runs.append(gib / timed(lambda: read_file(path)) / 1e9)
                warm_runs.append(gib / timed(lambda: read_file(path)) / 1e9)
            res[f"seq_1gib_cold_GBps/{name}"] = summary(cold_runs)
            res[f"seq_1gib_second_pass_GBps/{name}"] = summary(warm_runs)

        for name in ("bindfs", "rapidfs"):
            p50s, p99s = [], []
            for r in range(args.runs):
                cold()
                p50, p99 = random_reads(os.path.join(targets[name], "big.bin"), args.random_reads, r)
                p50s.append(p50 * 1e6)
                p99s.append(p99 * 1e6)
            res[f"rand_4k_qd1_p50_us/{name}"] = summary(p50s)
            res[f"rand_4k_qd1_p99_us/{name}"] = summary(p99s)

        for name, root in targets.items():
            cold_runs, warm_runs, ls_runs = [], [], []
            for _ in range(args.runs):
                cold()
                ls_runs.append(ls_l(os.path.join(root, "many")) * 1e3)
                cold()
                d = os.path.join(root, "many")
                cold_runs.append(many_files(d, 4))
                warm_runs.append(many_files(d, 4))
            res[f"files_128k_4readers_cold_per_s/{name}"] = summary(cold_runs)
            res[f"files_128k_4readers_second_pass_per_s/{name}"] = summary(warm_runs)
            res[f"ls_l_10000_ms/{name}"] = summary(ls_runs)
    finally:
        for m in (rfs_mnt, bind_mnt):
            subprocess.run(["umount", m], stderr=subprocess.DEVNULL)
        rapid.stop()

    def med(key):
        return res[key]["median"]

    ratios = {
        "seq_cold rapidfs/bindfs": med("seq_1gib_cold_GBps/rapidfs") / med("seq_1gib_cold_GBps/bindfs"),
        "seq_cold rapidfs/local": med("seq_1gib_cold_GBps/rapidfs") / med("seq_1gib_cold_GBps/local"),
        "seq_second_pass rapidfs/local": med("seq_1gib_second_pass_GBps/rapidfs") / med("seq_1gib_second_pass_GBps/local"),
        "rand_p50 rapidfs/bindfs": med("rand_4k_qd1_p50_us/rapidfs") / med("rand_4k_qd1_p50_us/bindfs"),
        "files_cold rapidfs/local": med("files_128k_4readers_cold_per_s/rapidfs") / med("files_128k_4readers_cold_per_s/local"),
        "files_second_pass rapidfs/local": med("files_128k_4readers_second_pass_per_s/rapidfs") / med("files_128k_4readers_second_pass_per_s/local"),
        "ls_l rapidfs/local": med("ls_l_10000_ms/rapidfs") / med("ls_l_10000_ms/local"),
    }
    targets_met = {
        "(1) cold sequential >= bindfs": ratios["seq_cold rapidfs/bindfs"] >= 1.0,
        "(2) random 4K p50 < 150 us": med("rand_4k_qd1_p50_us/rapidfs") < 150,
        "(2) random 4K p99 < 1 ms": med("rand_4k_qd1_p99_us/rapidfs") < 1000,
        "(3) 128K files cold >= half of local": ratios["files_cold rapidfs/local"] >= 0.5,
        "(5) second passes within 10% of local": ratios["seq_second_pass rapidfs/local"] >= 0.9
        and ratios["files_second_pass rapidfs/local"] >= 0.9,
    }
    out = {
        "benchmark": "rapidfs read path (issue 4)",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "load_average_at_end": os.getloadavg(),
        "configuration": {"runs": args.runs, "files": args.files, "file_kb": args.file_kb,
                          "random_reads": args.random_reads, "read_buffer": MIB,
                          "emulator": "memory backend, separate process, loopback",
                          "rapidfs": "default config (release build)",
                          "note": "emulator, daemon and reader share the same cores"},
        "results": res, "ratios": ratios, "targets_met": targets_met,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)

    print(f"\nrapidfs read benchmark: {os.cpu_count()} cores, kernel {platform.release()}, "
          f"median of {args.runs} (min..max); emulator, daemon and reader share the cores\n")
    print(f"{'measure':<42} {'target':<8} {'median':>10} {'min':>10} {'max':>10}")
    for key, v in res.items():
        what, target = key.split("/")
        print(f"{what:<42} {target:<8} {v['median']:>10.3f} {v['min']:>10.3f} {v['max']:>10.3f}")
    print()
    for k, v in ratios.items():
        print(f"{k:<42} {v:>8.2f}x")
    print()
    for k, v in targets_met.items():
        print(f"{k:<42} {'met' if v else 'NOT met'}")
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
