#!/usr/bin/env python3
"""Read-path benchmark of issue 4: rapidfs over the memory-backed emulator on loopback, against
bindfs over a local copy of the same data and against that local copy itself.

    python3 benches/read_path.py            # full run: 1 GiB file, 10,000 x 128 KiB, 3 runs
    python3 benches/read_path.py --quick    # smoke run: small sizes, 1 run

Workloads (each measured in every run; medians of the runs with min and max):
  1. cold sequential read of the big file with 1 MiB reads: rapidfs, bindfs, local;
  2. 4 KiB preads at random 4 KiB-aligned offsets of the big file, queue depth 1 (page cache
     dropped first, fresh mounts): p50/p99 for rapidfs, bindfs, local;
  3. the small files read by 4 parallel reader processes (cold): files/s, rapidfs vs local
     (bindfs for reference);
  4. `ls -l` of the 10,000-entry directory on fresh mounts: rapidfs, bindfs, local;
  5. second pass of 1 and 3 on the same mounts (page cache warm) vs local, and vs
     `bindfs -o kernel_cache` (the kernel keeps a FUSE file's page cache across opens: the
     ceiling any FUSE filesystem reaches on this kernel).

"Cold" follows shared/design/MEASURING.md: fresh mounts, `sync; echo 3 >
/proc/sys/vm/drop_caches`, then the local backing files are read once so that bindfs and the
local baseline serve from the page cache and the emulator serves from its memory: what is
measured is the filesystem, not the disk. The local copy read straight after dropping the
caches (from disk) is printed too, for reference only.

Prints a table (figures, ratios against the same run's baselines, the CPU seconds each
daemon spent per pass, the targets met or missed) and writes
target/bench-results/read_path.json (cores, kernel, load, configuration, every run). The
benchmark and everything it starts run at nice -10 (`--nice`) because the machine is shared. Needs root (drop_caches, mounts), fuse3 and bindfs (installed with apt-get when
missing, as tests/setup.sh does). Talks to nothing but 127.0.0.1. Unmounts everything and
stops the emulator on any exit, including failures and SIGINT/SIGTERM.
"""

import argparse
import json
import multiprocessing
import os
import platform
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
KiB = 1 << 10
BUCKET = "bench"
READERS = 4

FULL = dict(big_bytes=1 << 30, files=10_000, file_bytes=128 * KiB, random_reads=4000, runs=3)
QUICK = dict(big_bytes=64 * MiB, files=1_000, file_bytes=128 * KiB, random_reads=500, runs=1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Environment: packages, data, processes, mounts, caches.


def ensure_packages():
    """fuse3 and bindfs, installed the way tests/setup.sh does it (without its Python venv,
    which the benchmark does not need)."""
    missing = [pkg for cmd, pkg in (("fusermount3", "fuse3"), ("bindfs", "bindfs"))
               if shutil.which(cmd) is None]
    if missing:
        log(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
                       stdout=subprocess.DEVNULL)


def small_name(i):
    return f"f{i:05d}.bin"


def make_data(root, sizes):
    """ROOT/bench/big.bin and ROOT/bench/small/f*.bin of random bytes; reused when the
    manifest matches."""
    manifest = os.path.join(root, ".manifest.json")
    want = {k: sizes[k] for k in ("big_bytes", "files", "file_bytes")}
    try:
        with open(manifest) as f:
            if json.load(f) == want:
                return
    except (OSError, ValueError):
        pass
    log(f"generating data under {root}")
    shutil.rmtree(root, ignore_errors=True)
    small = os.path.join(root, BUCKET, "small")
    os.makedirs(small)
    with open(os.path.join(root, BUCKET, "big.bin"), "wb") as f:
        left = sizes["big_bytes"]
        while left:
            n = min(left, 16 * MiB)
            f.write(os.urandom(n))
            left -= n
    for i in range(sizes["files"]):
        with open(os.path.join(small, small_name(i)), "wb") as f:
            f.write(os.urandom(sizes["file_bytes"]))
    subprocess.run(["sync"], check=True)
    with open(manifest, "w") as f:
        json.dump(want, f)


def drop_caches():
    """Drops the page, dentry and inode caches, then brings `ls` and its libraries back from
    disk so that the first system measured after a drop does not pay for them."""
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    subprocess.run(["ls", "-l", "/"], stdout=subprocess.DEVNULL, check=True)


def cpu_seconds(pid):
    """User + system CPU time of a process (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def find_pid(words):
    """The pid of the live process whose argv contains every one of `words`."""
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        if argv and all(any(w == a or a.endswith("/" + w) for a in argv) for w in words):
            return int(d)
    return None


def bdi_read_ahead_kb(path):
    st = os.stat(path)
    try:
        with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb") as f:
            return int(f.read())
    except OSError:
        return None


def is_mounted(path):
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real for line in f)


class Bench:
    """Owns the emulator process and every mount, and undoes them all in `close()`."""

    def __init__(self, binary, root, work):
        self.binary = binary
        self.root = root
        self.local = os.path.join(root, BUCKET)
        self.work = work
        self.emulator = None
        self.endpoint = None
        self.mounts = {}  # mountpoint -> daemon pid (or None)
        self.n_mount = 0

    def start_emulator(self):
        log_path = os.path.join(self.work, "emulator.log")
        self.emulator = subprocess.Popen(
            [self.binary, "emulator", "--memory", "--root", self.root,
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True)
        line = self.emulator.stdout.readline()
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if not m:
            raise RuntimeError(f"emulator did not start: {line.strip()!r} (see {log_path})")
        self.endpoint = m.group(1)
        log(f"emulator {self.endpoint} pid {self.emulator.pid} (memory, preloading {self.root})")

    def _mountpoint(self, kind):
        self.n_mount += 1
        mnt = os.path.join(self.work, f"{kind}{self.n_mount}")
        os.makedirs(mnt)
        return mnt

    def mount_rapidfs(self):
        mnt = self._mountpoint("rapidfs")
        # The first mount may wait for the emulator's preload: retry a few times.
        for attempt in range(5):
            r = subprocess.run(
                [self.binary, "mount", BUCKET, mnt, "--endpoint", self.endpoint,
                 "--log-file", os.path.join(self.work, "mount.log")],
                capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                break
            if attempt == 4 or self.emulator.poll() is not None:
                raise RuntimeError(f"rapidfs mount failed: {r.stderr.strip()}")
            time.sleep(2)
        self.mounts[mnt] = find_pid(["rapidfs", "mount", mnt])
        return mnt

    def mount_bindfs(self, kernel_cache=False):
        """bindfs over the local copy; with `kernel_cache`, the kernel keeps its page cache
        across opens (the ceiling any FUSE filesystem reaches for warm reads)."""
        mnt = self._mountpoint("bindfs-kc" if kernel_cache else "bindfs")
        opts = ["-o", "kernel_cache"] if kernel_cache else []
        subprocess.run(["bindfs", *opts, self.local, mnt], check=True, timeout=60)
        self.mounts[mnt] = find_pid(["bindfs", mnt])
        return mnt

    def pid(self, mnt):
        return self.mounts.get(mnt)

    def unmount(self, mnt):
        pid = self.mounts.pop(mnt, None)
        for cmd in (["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not is_mounted(mnt):
                break
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        if pid is not None:
            deadline = time.time() + 10
            while cpu_seconds(pid) is not None and time.time() < deadline:
                time.sleep(0.05)
            if cpu_seconds(pid) is not None:
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(mnt)
        except OSError:
            pass

    def unmount_all(self):
        for mnt in list(self.mounts):
            self.unmount(mnt)

    def close(self):
        try:
            self.unmount_all()
        finally:
            if self.emulator is not None and self.emulator.poll() is None:
                self.emulator.terminate()
                try:
                    self.emulator.wait(10)
                except subprocess.TimeoutExpired:
                    self.emulator.kill()
                    self.emulator.wait()


# ---------------------------------------------------------------------------------------------
# Workloads. Each returns its figure plus the CPU seconds the daemons spent meanwhile.


def read_whole(path, buf):
    """Reads a file to the end with 1 MiB reads; returns the byte count."""
    total = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            n = os.readv(fd, [buf])
            if n == 0:
                return total
            total += n
    finally:
        os.close(fd)


def seq_read(path, expect):
    buf = bytearray(MiB)
    t0 = time.perf_counter()
    n = read_whole(path, buf)
    dt = time.perf_counter() - t0
    if n != expect:
        raise RuntimeError(f"{path}: read {n} bytes, expected {expect}")
    return dt


def random_reads(path, offsets):
    """4 KiB preads at `offsets`, one at a time; latencies in microseconds and the bytes."""
    lat, data = [], []
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in offsets:
            t0 = time.perf_counter_ns()
            b = os.pread(fd, 4096, off)
            lat.append((time.perf_counter_ns() - t0) / 1000)
            data.append(b)
    finally:
        os.close(fd)
    return lat, data


def _reader(paths, expect, barrier, out):
    buf = bytearray(MiB)
    barrier.wait()
    bad = 0
    for p in paths:
        if read_whole(p, buf) != expect:
            bad += 1
    out.send((time.perf_counter(), bad))
    out.close()


def parallel_files(directory, names, expect):
    """READERS processes read `names` (dealt round robin) under `directory`; returns the
    seconds from the common start to the last reader's end."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(READERS + 1)
    procs, pipes = [], []
    for i in range(READERS):
        rd, wr = ctx.Pipe(duplex=False)
        paths = [os.path.join(directory, n) for n in names[i::READERS]]
        p = ctx.Process(target=_reader, args=(paths, expect, barrier, wr))
        p.start()
        procs.append(p)
        pipes.append(rd)
    try:
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        ends, bad = [], 0
        for rd in pipes:
            if not rd.poll(600):
                raise RuntimeError("a reader process did not finish within 600 s")
            end, b = rd.recv()
            ends.append(end)
            bad += b
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    if bad:
        raise RuntimeError(f"{bad} files under {directory} did not read {expect} bytes")
    return max(ends) - t0


def ls_l(directory, entries):
    t0 = time.perf_counter()
    r = subprocess.run(["ls", "-l", directory], capture_output=True, text=True, timeout=600)
    dt = time.perf_counter() - t0
    lines = r.stdout.count("\n") - 1  # minus the "total" line
    if r.returncode != 0 or lines != entries:
        raise RuntimeError(f"ls -l {directory}: rc {r.returncode}, {lines} entries of {entries}")
    return dt


def warm_local(paths):
    """Reads the local backing files once (the MEASURING.md cold procedure)."""
    buf = bytearray(MiB)
    for p in paths:
        read_whole(p, buf)


class Cpu:
    """CPU seconds used by the given pids between construction and `done()`."""

    def __init__(self, pids):
        self.pids = {k: v for k, v in pids.items() if v is not None}
        self.start = {k: cpu_seconds(v) for k, v in self.pids.items()}

    def done(self):
        out = {}
        for k, pid in self.pids.items():
            end = cpu_seconds(pid)
            if end is not None and self.start[k] is not None:
                out[k] = round(end - self.start[k], 3)
        return out


def one_run(b, sizes, run, rng):
    """Every workload once; returns ({figure: {system: seconds or us}}, CPU notes, read-ahead)."""
    big = sizes["big_bytes"]
    fbytes = sizes["file_bytes"]
    names = [small_name(i) for i in range(sizes["files"])]
    local_big = os.path.join(b.local, "big.bin")
    local_small = os.path.join(b.local, "small")
    local_small_paths = [os.path.join(local_small, n) for n in names]
    res, cpu = {}, {}

    def systems(with_kc):
        """(name, mountpoint or local dir, daemons to account CPU to) on fresh mounts."""
        out = [("rapidfs", b.mount_rapidfs()), ("bindfs", b.mount_bindfs())]
        if with_kc:
            out.append(("bindfs-kc", b.mount_bindfs(kernel_cache=True)))
        out = [(n, m, {n: b.pid(m)}) for n, m in out]
        out[0][2]["emulator"] = b.emulator.pid
        return out + [("local", b.local, {})]

    def measure(figure, name, pids, fn):
        c = Cpu(pids)
        res.setdefault(figure, {})[name] = fn()
        cpu.setdefault(figure, {})[name] = c.done()

    # 1 + 5a: sequential read of the big file, cold then warm, on fresh mounts.
    log(f"run {run}: sequential read of {big >> 20} MiB")
    sys_ = systems(with_kc=True)
    drop_caches()
    measure("seq_local_disk_s", "local", {}, lambda: seq_read(local_big, big))
    warm_local([local_big])
    for phase in ("cold", "warm"):
        for name, d, pids in sys_:
            path = os.path.join(d, "big.bin")
            measure(f"seq_{phase}_s", name, pids, lambda: seq_read(path, big))
    ra = {name: bdi_read_ahead_kb(d) for name, d, _ in sys_}
    b.unmount_all()

    # 2: random 4 KiB preads, queue depth 1, page cache dropped, fresh mounts.
    log(f"run {run}: {sizes['random_reads']} random 4 KiB preads")
    offsets = [rng.randrange(big // 4096) * 4096 for _ in range(sizes["random_reads"])]
    sys_ = systems(with_kc=False)
    drop_caches()
    warm_local([local_big])
    with open(local_big, "rb") as f:
        want = [os.pread(f.fileno(), 4096, off) for off in offsets]
    for name, d, pids in sys_:
        lat, data = {}, {}

        def run_random():
            lat["us"], data["bytes"] = random_reads(os.path.join(d, "big.bin"), offsets)
            return statistics.quantiles(lat["us"], n=100, method="inclusive")

        measure("rand_quantiles_us", name, pids, run_random)
        if data["bytes"] != want:
            raise RuntimeError(f"{name}: random reads returned wrong bytes")
        q = res["rand_quantiles_us"].pop(name)
        res.setdefault("rand_p50_us", {})[name] = q[49]
        res.setdefault("rand_p99_us", {})[name] = q[98]
    res.pop("rand_quantiles_us", None)
    b.unmount_all()

    # 3 + 5b: the small files by 4 readers, cold then warm, on fresh mounts.
    log(f"run {run}: {sizes['files']} files by {READERS} readers")
    sys_ = systems(with_kc=True)
    drop_caches()
    measure("files_local_disk_s", "local", {},
            lambda: parallel_files(local_small, names, fbytes))
    warm_local(local_small_paths)
    for phase in ("cold", "warm"):
        for name, d, pids in sys_:
            small = os.path.join(d, "small")
            measure(f"files_{phase}_s", name, pids, lambda: parallel_files(small, names, fbytes))
    b.unmount_all()

    # 4: ls -l of the many-entry directory on fresh mounts.
    log(f"run {run}: ls -l of {sizes['files']} entries")
    sys_ = systems(with_kc=False)
    drop_caches()
    for n in names:
        os.stat(os.path.join(local_small, n))
    for name, d, pids in sys_:
        small = os.path.join(d, "small")
        measure("ls_s", name, pids, lambda: ls_l(small, sizes["files"]))
    b.unmount_all()
    return res, cpu, ra


# ---------------------------------------------------------------------------------------------
# Figures, ratios, targets, table.


def figures(raw, sizes):
    """Per-run seconds -> per-run figures in their display units."""
    big_mb = sizes["big_bytes"] / 1e6
    out = {}
    for sys_, s in raw["seq_cold_s"].items():
        out.setdefault("seq_cold_MBps", {})[sys_] = big_mb / s
    for sys_, s in raw["seq_warm_s"].items():
        out.setdefault("seq_warm_MBps", {})[sys_] = big_mb / s
    out["seq_local_disk_MBps"] = {"local": big_mb / raw["seq_local_disk_s"]["local"]}
    out["rand_p50_us"] = dict(raw["rand_p50_us"])
    out["rand_p99_us"] = dict(raw["rand_p99_us"])
    for key, src in (("files_cold_per_s", "files_cold_s"), ("files_warm_per_s", "files_warm_s"),
                     ("files_local_disk_per_s", "files_local_disk_s")):
        out[key] = {s: sizes["files"] / t for s, t in raw[src].items()}
    out["ls_ms"] = {s: t * 1000 for s, t in raw["ls_s"].items()}
    return out


# (label, figure key, unit, baselines of the ratio column)
ROWS = [
    ("1 seq read cold", "seq_cold_MBps", "MB/s", ("bindfs",)),
    ("  local from disk (ref)", "seq_local_disk_MBps", "MB/s", ()),
    ("2 4K random p50", "rand_p50_us", "us", ("bindfs",)),
    ("2 4K random p99", "rand_p99_us", "us", ("bindfs",)),
    ("3 files x4 cold", "files_cold_per_s", "files/s", ("local",)),
    ("  local from disk (ref)", "files_local_disk_per_s", "files/s", ()),
    ("4 ls -l fresh mount", "ls_ms", "ms", ("bindfs", "local")),
    ("5 seq read warm", "seq_warm_MBps", "MB/s", ("local", "bindfs-kc")),
    ("5 files x4 warm", "files_warm_per_s", "files/s", ("local", "bindfs-kc")),
]
SYSTEMS = ("rapidfs", "bindfs", "bindfs-kc", "local")
# Which figure's CPU notes belong to which row of the CPU table.
CPU_ROWS = [("1 seq read cold", "seq_cold_s"), ("2 4K random reads", "rand_quantiles_us"),
            ("3 files x4 cold", "files_cold_s"), ("4 ls -l", "ls_s"),
            ("5 seq read warm", "seq_warm_s"), ("5 files x4 warm", "files_warm_s")]
DAEMONS = ("rapidfs", "emulator", "bindfs", "bindfs-kc")


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def summarize(per_run):
    """Medians/min/max of every figure and of every per-run ratio rapidfs/baseline."""
    out = {}
    for _, key, unit, bases in ROWS:
        entry = {"unit": unit, "ratio_baselines": list(bases)}
        for s in SYSTEMS:
            vals = [r[key][s] for r in per_run if s in r[key]]
            if vals:
                entry[s] = summary(vals)
        for b in SYSTEMS[1:]:
            if all("rapidfs" in r[key] and b in r[key] for r in per_run):
                entry[f"rapidfs/{b}"] = summary([r[key]["rapidfs"] / r[key][b] for r in per_run])
        out[key] = entry
    return out


def summarize_cpu(cpu_runs):
    """{row label: {daemon: median CPU seconds}} over the runs (all systems of a figure)."""
    out = {}
    for label, fig in CPU_ROWS:
        got = {}
        for d in DAEMONS:
            vals = [sum(v.get(d, 0) for v in run.get(fig, {}).values()) for run in cpu_runs
                    if any(d in v for v in run.get(fig, {}).values())]
            if vals:
                got[d] = statistics.median(vals)
        out[label] = got
    return out


def targets(s):
    t = []
    seq = s["seq_cold_MBps"]["rapidfs/bindfs"]["median"]
    t.append(("(1) cold seq read >= bindfs", f"rapidfs/bindfs = {seq:.2f}", seq >= 1.0))
    p50 = s["rand_p50_us"]["rapidfs"]["median"]
    p99 = s["rand_p99_us"]["rapidfs"]["median"]
    t.append(("(2) 4K random p50 < 150 us", f"{p50:.0f} us", p50 < 150))
    t.append(("(2) 4K random p99 < 1 ms", f"{p99:.0f} us", p99 < 1000))
    f = s["files_cold_per_s"]["rapidfs/local"]["median"]
    t.append(("(3) cold files/s >= 0.5 x local", f"rapidfs/local = {f:.2f}", f >= 0.5))
    for key, what in (("seq_warm_MBps", "seq read"), ("files_warm_per_s", "files/s")):
        w = s[key]["rapidfs/local"]["median"]
        kc = s[key].get("rapidfs/bindfs-kc", {}).get("median")
        extra = f" (FUSE page-cache ceiling, bindfs -o kernel_cache: rapidfs/bindfs-kc = {kc:.2f})" if kc else ""
        t.append((f"(5) warm {what} within 10% of local", f"rapidfs/local = {w:.2f}{extra}", w >= 0.9))
    return [{"target": a, "value": v, "met": m} for a, v, m in t]


def fmt(x):
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def cell(e):
    if e is None:
        return "-"
    if len(e["runs"]) == 1:
        return fmt(e["median"])
    return f"{fmt(e['median'])} [{fmt(e['min'])}-{fmt(e['max'])}]"


def columns(head, rows):
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [head, ["-" * w for w in widths], *rows]]


def table(s, cpu, tg, sizes, runs, loads):
    rows = []
    for label, key, unit, bases in ROWS:
        e = s[key]
        ratio = ", ".join(f"{cell(e.get(f'rapidfs/{b}'))} vs {b}" for b in bases)
        rows.append([label, unit, *(cell(e.get(x)) for x in SYSTEMS), ratio])
    lines = [f"read-path benchmark: median [min-max] of {runs} run(s); big file "
             f"{sizes['big_bytes'] >> 20} MiB, {sizes['files']} files x "
             f"{sizes['file_bytes'] >> 10} KiB, {sizes['random_reads']} random reads; "
             f"{os.cpu_count()} cores shared by the emulator, the mount daemons and the readers; "
             f"load average during the runs {min(loads):.1f}-{max(loads):.1f}",
             *columns(["workload", "unit", *SYSTEMS, "rapidfs/baseline"], rows), "",
             "daemon CPU seconds per pass (median; what the 2 shared cores paid):"]
    lines += columns(["workload", *DAEMONS],
                     [[label, *(f"{cpu[label][d]:.2f}" if d in cpu[label] else "-" for d in DAEMONS)]
                      for label, _ in CPU_ROWS])
    lines.append("")
    for t in tg:
        lines.append(f"{'MET   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def machine():
    info = {"cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            info["cpu"] = m.group(1) if m else None
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except OSError:
        pass
    return info


def git_head():
    r = subprocess.run(["git", "-C", REPO, "log", "-1", "--format=%H %s"],
                       capture_output=True, text=True)
    return r.stdout.strip() or None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one run (smoke test)")
    ap.add_argument("--runs", type=int, help="runs to take the median of (default 3, quick 1)")
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "rapidfs"))
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    ap.add_argument("--data", help="where the generated data lives (default target/bench-data[-quick])")
    ap.add_argument("--out", default=os.path.join(REPO, "target", "bench-results", "read_path.json"))
    ap.add_argument("--seed", type=int, default=4)
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness of the benchmark and everything it starts (default -10: "
                         "other work on the machine disturbs the figures less; 0 to keep)")
    args = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("read_path.py: needs root (drop_caches, FUSE mounts)")
    sizes = dict(QUICK if args.quick else FULL)
    if args.runs:
        sizes["runs"] = args.runs
    data = args.data or os.path.join(REPO, "target", "bench-data-quick" if args.quick else "bench-data")

    ensure_packages()
    if args.nice:
        os.nice(args.nice)
    if not args.no_build:
        log("cargo build --release")
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=REPO, check=True)
    if not os.access(args.binary, os.X_OK):
        sys.exit(f"read_path.py: no rapidfs binary at {args.binary}")
    make_data(data, sizes)

    work = tempfile.mkdtemp(prefix="rapidfs-bench-")
    b = Bench(args.binary, os.path.abspath(data), work)

    def on_signal(signum, _frame):
        # Further signals must not interrupt the cleanup this one starts.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    rng = random.Random(args.seed)
    per_run, raw_runs, cpu_runs, read_ahead, loads = [], [], [], None, []
    try:
        b.start_emulator()
        for run in range(1, sizes["runs"] + 1):
            loads.append(os.getloadavg()[0])
            raw, cpu, read_ahead = one_run(b, sizes, run, rng)
            loads.append(os.getloadavg()[0])
            raw_runs.append(raw)
            cpu_runs.append(cpu)
            per_run.append(figures(raw, sizes))
    finally:
        b.close()
        shutil.rmtree(work, ignore_errors=True)

    s = summarize(per_run)
    tg = targets(s)
    cpu = summarize_cpu(cpu_runs)
    text = table(s, cpu, tg, sizes, sizes["runs"], loads)
    print(text)
    result = {
        "benchmark": "read_path (issue 4)",
        "command": " ".join(["python3", "benches/read_path.py", *sys.argv[1:]]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "config": {
            **sizes,
            "readers": READERS,
            "read_size": MiB,
            "rapidfs_commit": git_head(),
            "rapidfs_binary": args.binary,
            "emulator": "rapidfs emulator --memory --root DATA --listen 127.0.0.1:0 (same machine)",
            "rapidfs_mount": "rapidfs mount bench MNT --endpoint http://127.0.0.1:PORT (defaults)",
            "bindfs": "bindfs DATA/bench MNT (defaults)",
            "bindfs-kc": "bindfs -o kernel_cache DATA/bench MNT (FUSE page-cache ceiling, warm rows)",
            "nice": args.nice,
            "load_average_1min": loads,
            "bdi_read_ahead_kb": read_ahead,
            "cold": "fresh mounts; sync; echo 3 > /proc/sys/vm/drop_caches; local backing files read once",
            "shared_cores": "the emulator, the mount daemon, bindfs and the readers share all cores",
        },
        "summary": s,
        "targets": tg,
        "runs": per_run,
        "raw_seconds": raw_runs,
        "daemon_cpu_seconds": cpu_runs,
        "daemon_cpu_seconds_median": cpu,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"read_path.py: interrupted ({e or 'SIGINT'}); mounts and emulator cleaned up")
