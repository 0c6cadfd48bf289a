#!/usr/bin/env python3
"""Read-path benchmark of issue 18: rapidfs over the memory-backed emulator on loopback, against
bindfs over a local copy of the same data (the cost of FUSE itself) and that local copy itself.

    python3 benches/read_path.py            # full run: 3 runs, about 3-4 min
    python3 benches/read_path.py --quick    # smoke run: small sizes, 1 run, about 10 s
    python3 benches/read_path.py --baseline-binary /tmp/rapidfs-old
                                            # also mounts an older build as "rapidfs-before"

Workloads, each measured in every run on fresh mounts, cold (medians of the runs, min and max):
  a. one reader reads a 1 GiB file (big0.bin) with 1 MiB reads, as `dd bs=1M` does: GB/s;
  b. four reader processes read four different 1 GiB files (big0..big3.bin) at once, 1 MiB
     reads: aggregate GB/s;
  c. four reader processes read 5,000 files of 16 KiB-1 MiB (lognormal, median about 110 KiB,
     one directory) whole, in an order shuffled each run: files/s;
  d. a 2 GiB safetensors file (a Llama-like layout of about 200 F16/F32 tensors, 8 KiB-64 MiB)
     loaded and every tensor touched: with `safetensors.safe_open(framework="np")` and
     `get_tensor` when safetensors and numpy import in this Python, else by mmap-ing the file
     and touching one byte per 4 KiB page of every tensor (the JSON says which; the local
     copy's figure is then only the cost of mapping its cached pages): GB/s;
  e. 4 KiB preads at random 4 KiB-aligned offsets of big0.bin, queue depth 1: p50/p99 in us.
Every pass checks the byte count of every file it reads; the safetensors load checks a sum of
the bytes it touched and the random reads check the bytes against the local copy.

Systems: rapidfs (`--binary`), rapidfs-ro (the same build mounted `--read-only`, as a dataset
is in training: the kernel reads its files without sending open, flush or release),
rapidfs-before (`--baseline-binary`, when given: an older build
mounted over the same emulator in the same runs, so before/after ratios come from one run;
the emulator is always --binary's build),
bindfs (defaults) over the local copy, and the local copy. "Cold" follows
shared/design/MEASURING.md: fresh mounts, `sync; echo 3 > /proc/sys/vm/drop_caches`, then the
local files of the workload are read once so that bindfs and the local copy serve from the page
cache and the emulator from its memory: what is measured is the filesystem, not the disk. The
order of the systems rotates from run to run, and each mount is unmounted after its pass so
that its page cache does not crowd the others. With --back-memory-mib N (off by default; see
benchlib's back_free_memory), before each system's pass the host backs N MiB of free memory
again (a file written beside the data and deleted): on a virtual machine whose kernel hands
freed memory back to its host, the pages the drop of the caches freed otherwise cost the pass
a host fault each on their first touch.

For every workload and system the table gives the rate, the ratios to bindfs (and rapidfs to
rapidfs-before), the CPU time of the mount daemon and of the emulator (utime + stime from
/proc/PID/stat around the pass) per GiB, per file or per random read, and the machine's idle
share during the pass (idle + iowait over all jiffies of all CPUs in /proc/stat; other work on
the machine lowers it too, hence the load average in the header): the emulator, the daemons
and the readers share the same cores. Then the targets of issue 18, met or missed:
  a. >= 0.7x bindfs; daemon <= 0.4 CPU-s/GiB; emulator <= 0.25 CPU-s/GiB;
  b. >= 0.6x bindfs;
  c. >= 0.7x bindfs; daemon <= 0.08 ms of CPU per file; emulator <= 0.06 ms per file;
  d. >= 0.7x bindfs;
  e. p50 <= 100 us.
Writes target/bench-results/read_path.json (machine, exact configuration, every pass's raw
seconds and CPU, per-run figures, medians). Data (6.7 GiB, quick 0.6 GiB; about 30 s to
generate) is generated once under target/bench-data[-quick] and reused while its manifest
matches; the emulator preloads it all into memory.

The benchmark and everything it starts run at nice -10 (`--nice`) because the machine is
shared. Needs root (drop_caches, mounts), fuse3 and bindfs (installed with apt-get when
missing, as tests/setup.sh does). Talks to nothing but 127.0.0.1. Unmounts everything and
stops the emulator on any exit, including failures and SIGINT/SIGTERM.
"""

import argparse
import json
import math
import mmap
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from benchlib import (back_free_memory, binary_version, cell, columns, context_switches, cpu_seconds, ensure_packages, find_pid, fmt, fresh_memory_line, git_head, is_mounted, log, machine, stop_process, summary, switches_between)

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
PAGE = 4096
BUCKET = "bench"
READERS = 4
BIGS = 4  # big0..big3.bin: the sequential read uses big0, workload b one reader per file
MODEL = "model.safetensors"
# Small files: lognormal sizes around a median of 110 KiB, clipped to [16 KiB, 1 MiB].
SMALL = dict(median=110 * KiB, sigma=0.8, min=16 * KiB, max=MiB)
# The data does not depend on --seed (which picks offsets and orders): changing it must not
# regenerate gigabytes.
DATA_SEED = 18

FULL = dict(big_bytes=GiB, model_bytes=2 * GiB, model_hidden=2048, files=5_000,
            random_reads=4_000, runs=3)
QUICK = dict(big_bytes=64 * MiB, model_bytes=256 * MiB, model_hidden=1024, files=500,
             random_reads=500, runs=1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Data: big files, a safetensors model, small files.


def big_name(i):
    return f"big{i}.bin"


def small_name(i):
    return f"f{i:05d}.bin"


def small_sizes(n):
    """Sizes of the first n small files; the same for every run, seed and mode."""
    rng = random.Random(DATA_SEED)
    return [min(max(int(rng.lognormvariate(math.log(SMALL["median"]), SMALL["sigma"])),
                    SMALL["min"]), SMALL["max"]) for _ in range(n)]


DTYPE_BYTES = {"F16": 2, "F32": 4}


def model_tensors(hidden, total):
    """(name, dtype, shape) of a Llama-like model of about `total` bytes: embeddings and head of
    16,384 x hidden, then as many decoder layers as fit. F16 rather than BF16 because numpy,
    the framework the safetensors loader uses here, has no bfloat16."""
    vocab, inter = 16_384, hidden * 11 // 4
    layer = [("self_attn.q_proj.weight", "F16", [hidden, hidden]),
             ("self_attn.k_proj.weight", "F16", [hidden // 4, hidden]),
             ("self_attn.v_proj.weight", "F16", [hidden // 4, hidden]),
             ("self_attn.o_proj.weight", "F16", [hidden, hidden]),
             ("mlp.gate_proj.weight", "F16", [inter, hidden]),
             ("mlp.up_proj.weight", "F16", [inter, hidden]),
             ("mlp.down_proj.weight", "F16", [hidden, inter]),
             ("input_layernorm.weight", "F32", [hidden]),
             ("post_attention_layernorm.weight", "F32", [hidden])]
    first = [("model.embed_tokens.weight", "F16", [vocab, hidden])]
    last = [("model.norm.weight", "F32", [hidden]), ("lm_head.weight", "F16", [vocab, hidden])]

    def size(ts):
        return sum(math.prod(shape) * DTYPE_BYTES[dtype] for _, dtype, shape in ts)

    layers = (total - size(first + last)) // size(layer)
    return first + [(f"model.layers.{i}.{name}", dtype, shape)
                    for i in range(layers) for name, dtype, shape in layer] + last


def write_random(f, n):
    while n:
        chunk = min(n, 16 * MiB)
        f.write(os.urandom(chunk))
        n -= chunk


def write_safetensors(path, tensors):
    """The format: 8-byte little-endian header length, a JSON header of every tensor's dtype,
    shape and data offsets (from the end of the header), then the tensors' bytes in order."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)  # spaces are allowed; torch's writer aligns the data to 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        write_random(f, offset)


def make_data(root, cfg):
    """ROOT/bench/{big0..3.bin, model.safetensors, small/f*.bin} of random bytes; reused while
    the manifest matches the configuration."""
    manifest = os.path.join(root, ".manifest.json")
    want = {"bigs": BIGS, "small": SMALL, "data_seed": DATA_SEED,
            **{k: cfg[k] for k in ("big_bytes", "model_bytes", "model_hidden", "files")}}
    try:
        with open(manifest) as f:
            if json.load(f) == want:
                return
    except (OSError, ValueError):
        pass
    log(f"generating data under {root}")
    shutil.rmtree(root, ignore_errors=True)
    bucket = os.path.join(root, BUCKET)
    os.makedirs(os.path.join(bucket, "small"))
    for i in range(BIGS):
        with open(os.path.join(bucket, big_name(i)), "wb") as f:
            write_random(f, cfg["big_bytes"])
    write_safetensors(os.path.join(bucket, MODEL),
                      model_tensors(cfg["model_hidden"], cfg["model_bytes"]))
    for i, size in enumerate(small_sizes(cfg["files"])):
        with open(os.path.join(bucket, "small", small_name(i)), "wb") as f:
            write_random(f, size)
    subprocess.run(["sync"], check=True)
    with open(manifest, "w") as f:
        json.dump(want, f)


# ---------------------------------------------------------------------------------------------
# Environment: packages, processes, mounts, caches, CPU accounting.


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def running(pid):
    """Whether the process exists and has not exited: an exited daemon stays a zombie until
    init, its parent, reaps it, which can take seconds here."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def cpu_jiffies():
    """(idle + iowait, total) jiffies of all CPUs since boot (guest time is already in user)."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return idle + iowait, user + nice + system + idle + iowait + irq + softirq + steal


class Meter:
    """CPU seconds of some processes, and the machine's idle share, from construction to
    `stop()`."""

    def __init__(self, pids):
        self.pids = pids
        self.cpu = {role: cpu_seconds(pid) for role, pid in pids.items()}
        self.switches = {role: context_switches(pid) for role, pid in pids.items()}
        self.jiffies = cpu_jiffies()

    def stop(self):
        idle, total = (b - a for a, b in zip(self.jiffies, cpu_jiffies()))
        cpu = {}
        for role, pid in self.pids.items():
            end = cpu_seconds(pid)
            if end is None:
                raise RuntimeError(f"the {role} (pid {pid}) exited during the pass")
            cpu[role] = end - self.cpu[role]
        switches = {role: switches_between(self.switches[role] or {},
                                           context_switches(pid) or {})
                    for role, pid in self.pids.items()}
        return {"cpu": cpu, "switches": switches, "idle": idle / total if total else None}


def bdi_read_ahead_kb(path):
    st = os.stat(path)
    try:
        with open(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb") as f:
            return int(f.read())
    except OSError:
        return None


class Bench:
    """Owns the emulator process and every mount, and undoes them all in `close()`."""

    def __init__(self, binaries, root, work, back_memory_mib):
        """`binaries`: {system name: rapidfs binary}; the first one also runs the emulator.
        `back_memory_mib`: MiB of free memory the host backs again before each pass
        (benchlib's back_free_memory; 0: none)."""
        self.binaries = binaries
        self.root = root
        self.local = os.path.join(root, BUCKET)
        self.work = work
        self.back_memory_mib = back_memory_mib
        self.emulator = None
        self.endpoint = None
        self.mounts = {}  # mountpoint -> daemon pid (or None)
        self.n_mount = 0

    def start_emulator(self):
        log_path = os.path.join(self.work, "emulator.log")
        binary = next(iter(self.binaries.values()))
        self.emulator = subprocess.Popen(
            [binary, "emulator", "--memory", "--root", self.root, "--listen", "127.0.0.1:0"],
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

    def _register(self, mnt, words):
        """Records the mount's daemon; fails when it cannot be found, since its CPU time is
        one of the figures."""
        self.mounts[mnt] = find_pid(words)
        if self.mounts[mnt] is None:
            raise RuntimeError(f"no daemon process found for {mnt}")

    def mount_rapidfs(self, system):
        binary = self.binaries[system]
        mnt = self._mountpoint(system)
        # The first mount may wait for the emulator's preload: retry a few times.
        for attempt in range(5):
            r = subprocess.run(
                [binary, "mount", BUCKET, mnt, "--endpoint", self.endpoint,
                 "--log-file", os.path.join(self.work, f"{system}.log"),
                 *(["--read-only"] if system.endswith("-ro") else [])],
                capture_output=True, text=True, timeout=120)
            if r.returncode == 0:
                break
            if attempt == 4 or self.emulator.poll() is not None:
                raise RuntimeError(f"{system} mount failed: {r.stderr.strip()}")
            time.sleep(2)
        self._register(mnt, [os.path.basename(binary), "mount", mnt])
        return mnt

    def mount_bindfs(self):
        mnt = self._mountpoint("bindfs")
        subprocess.run(["bindfs", self.local, mnt], check=True, timeout=60)
        self._register(mnt, ["bindfs", mnt])
        return mnt

    def mount_all(self):
        """Fresh mounts of every system: [(system, directory, {role: pid to meter})]; "local"
        is the backing directory itself."""
        systems = []
        for name in self.binaries:
            mnt = self.mount_rapidfs(name)
            systems.append((name, mnt, {"daemon": self.mounts[mnt], "emulator": self.emulator.pid}))
        mnt = self.mount_bindfs()
        systems.append(("bindfs", mnt, {"daemon": self.mounts[mnt]}))
        systems.append(("local", self.local, {}))
        return systems

    def unmount(self, mnt):
        pid = self.mounts.pop(mnt, None)
        for cmd in (["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not is_mounted(mnt):
                break
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        if pid is not None:
            deadline = time.time() + 10
            while running(pid) and time.time() < deadline:
                time.sleep(0.01)
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        try:
            os.rmdir(mnt)
        except OSError:
            pass

    def close(self):
        try:
            for mnt in list(self.mounts):
                self.unmount(mnt)
        finally:
            stop_process(self.emulator)


# ---------------------------------------------------------------------------------------------
# Reads. Each measuring function returns the raw record of one pass and fails on wrong bytes.


def read_whole(path, buf):
    """Reads a file to the end with reads of len(buf); returns the byte count."""
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


def warm_local(paths):
    """Reads the local backing files once (the MEASURING.md cold procedure)."""
    buf = bytearray(MiB)
    for p in paths:
        read_whole(p, buf)


def seq_read(path, expect):
    buf = bytearray(MiB)
    t0 = time.perf_counter()
    n = read_whole(path, buf)
    dt = time.perf_counter() - t0
    if n != expect:
        raise RuntimeError(f"{path}: read {n} bytes, expected {expect}")
    return {"seconds": dt, "bytes": n}


def _reader(jobs, barrier, out):
    buf = bytearray(MiB)
    barrier.wait()
    bad = [path for path, size in jobs if read_whole(path, buf) != size]
    out.send((time.perf_counter(), bad[:3], len(bad)))
    out.close()


def parallel_read(jobs):
    """One process per list of (path, expected size) in `jobs`, each reading its files whole
    with 1 MiB reads; the seconds run from the common start to the last reader's end."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(len(jobs) + 1)
    procs, pipes = [], []
    for mine in jobs:
        rd, wr = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_reader, args=(mine, barrier, wr))
        p.start()
        procs.append(p)
        pipes.append(rd)
    try:
        barrier.wait(timeout=60)
        t0 = time.perf_counter()
        ends, bad, n_bad = [], [], 0
        for rd in pipes:
            if not rd.poll(600):
                raise RuntimeError("a reader process did not finish within 600 s")
            end, some, n = rd.recv()
            ends.append(end)
            bad += some
            n_bad += n
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join()
    if n_bad:
        raise RuntimeError(f"{n_bad} files read short or long, e.g. {bad}")
    return {"seconds": max(ends) - t0, "bytes": sum(s for mine in jobs for _, s in mine),
            "files": sum(len(mine) for mine in jobs)}


def random_reads(path, offsets, want):
    """4 KiB preads at `offsets`, one at a time; checks the bytes against `want`."""
    lat, got = [], []
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in offsets:
            t0 = time.perf_counter_ns()
            got.append(os.pread(fd, PAGE, off))
            lat.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        os.close(fd)
    if got != want:
        raise RuntimeError(f"{path}: random reads returned wrong bytes")
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {"p50_us": q[49], "p99_us": q[98], "reads": len(offsets)}


def safetensors_header(path):
    """(offset of the data, [(begin, end) of every tensor, relative to the data])."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, [tuple(t["data_offsets"]) for t in header.values()]


def load_mmap(path):
    """Maps the file as safetensors does and touches one byte per 4 KiB of every tensor;
    returns (tensor bytes, sum of the bytes touched)."""
    start, tensors = safetensors_header(path)
    n = total = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        for begin, end in tensors:
            total += sum(mm[start + begin:start + end:PAGE])
            n += end - begin
    return n, total


def safetensors_loader():
    """(description, load function) of the way a user loads the model: the safetensors
    library with numpy when both import here (nothing is installed for it), else mmap."""
    try:
        import numpy as np
        from safetensors import safe_open
    except ImportError:
        return "mmap, one byte per 4 KiB page of every tensor (no safetensors+numpy)", load_mmap

    def load(path):
        """Same result as load_mmap, through safetensors' own reader."""
        n = total = 0
        with safe_open(path, framework="np") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                n += t.nbytes
                total += int(t.reshape(-1).view(np.uint8)[::PAGE].sum())
        return n, total

    return "safetensors.safe_open(framework='np'), get_tensor of every tensor", load


def load_model(path, load, expect):
    t0 = time.perf_counter()
    got = load(path)
    dt = time.perf_counter() - t0
    if got != expect:
        raise RuntimeError(f"{path}: loaded (bytes, sum) {got}, expected {expect}")
    return {"seconds": dt, "bytes": os.path.getsize(path)}


# ---------------------------------------------------------------------------------------------
# Runs.


def cold_pass(b, run, local_files, measure):
    """Fresh mounts, caches dropped, `local_files` read once; then `measure(directory)` on each
    system in turn, each unmounted after its pass. Returns {system: raw record}."""
    systems = b.mount_all()
    drop_caches()
    warm_local(local_files)
    # Rotate the order so that no system is always the first after the drop.
    k = run % len(systems)
    out = {}
    for name, d, pids in systems[k:] + systems[:k]:
        ra = bdi_read_ahead_kb(d)
        back_free_memory(b.root, b.back_memory_mib)
        meter = Meter(pids)
        rec = measure(d)
        out[name] = {**rec, **meter.stop(), "read_ahead_kb": ra}
        if d != b.local:
            b.unmount(d)
    return out


def one_run(b, cfg, run, rng, model, only):
    """Every workload in `only` once; returns {workload: {system: raw record}}."""
    big, local = cfg["big_bytes"], b.local
    bigs = [big_name(i) for i in range(BIGS)]
    big0 = os.path.join(local, bigs[0])
    res = {}

    if "seq" in only:
        log(f"run {run}: a. sequential read of {big >> 20} MiB")
        res["seq"] = cold_pass(b, run, [big0], lambda d: seq_read(os.path.join(d, bigs[0]), big))

    if "par4" in only:
        log(f"run {run}: b. {BIGS} readers of {BIGS} x {big >> 20} MiB")
        res["par4"] = cold_pass(
            b, run, [os.path.join(local, n) for n in bigs],
            lambda d: parallel_read([[(os.path.join(d, n), big)] for n in bigs]))

    # The shuffles draw from `rng` whether or not their workload runs, so that a workload
    # reads the same order and offsets alone as in a full run.
    files = [(os.path.join("small", small_name(i)), size)
             for i, size in enumerate(small_sizes(cfg["files"]))]
    rng.shuffle(files)
    if "small" in only:
        log(f"run {run}: c. {cfg['files']} small files by {READERS} readers")
        res["small"] = cold_pass(
            b, run, [os.path.join(local, n) for n, _ in files],
            lambda d: parallel_read([[(os.path.join(d, n), s) for n, s in files[i::READERS]]
                                     for i in range(READERS)]))

    if "safetensors" in only:
        log(f"run {run}: d. safetensors load of {cfg['model_bytes'] >> 20} MiB")
        load, expect = model
        res["safetensors"] = cold_pass(b, run, [os.path.join(local, MODEL)],
                                       lambda d: load_model(os.path.join(d, MODEL), load, expect))

    offsets = [rng.randrange(big // PAGE) * PAGE for _ in range(cfg["random_reads"])]
    if "rand" in only:
        log(f"run {run}: e. {cfg['random_reads']} random 4 KiB preads")
        with open(big0, "rb") as f:
            want = [os.pread(f.fileno(), PAGE, off) for off in offsets]
        res["rand"] = cold_pass(b, run, [big0],
                                lambda d: random_reads(os.path.join(d, bigs[0]), offsets, want))
    return res


# ---------------------------------------------------------------------------------------------
# Figures, ratios, targets, table.

# workload: (label, rate unit, cost unit). Costs are CPU time per GiB, per file or per read.
WORKLOADS = {
    "seq": ("a seq read, 1 reader", "GB/s", "CPU-s/GiB"),
    "par4": ("b 4 readers, 4 files", "GB/s", "CPU-s/GiB"),
    "small": ("c small files, 4 readers", "files/s", "CPU-ms/file"),
    "safetensors": ("d safetensors load", "GB/s", "CPU-s/GiB"),
    "rand": ("e 4K random pread p50", "us", "CPU-us/read"),
}
SYSTEMS = ("rapidfs", "rapidfs-ro", "rapidfs-before", "bindfs", "local")
ROLES = ("daemon", "emulator")


def figures(workload, rec):
    """One pass's raw record -> {"rate", ["p99",] role costs, role switches, "idle_pct"}."""
    if workload == "rand":
        f = {"rate": rec["p50_us"], "p99": rec["p99_us"]}
        per = rec["reads"] / 1e6  # CPU seconds / millions of reads = us per read
    elif workload == "small":
        f = {"rate": rec["files"] / rec["seconds"]}
        per = rec["files"] / 1e3  # CPU seconds / thousands of files = ms per file
    else:
        f = {"rate": rec["bytes"] / rec["seconds"] / 1e9}
        per = rec["bytes"] / GiB
    f.update({role: s / per for role, s in rec["cpu"].items()})
    # Context switches per read, per file or per MiB: how often the work changes threads.
    count = {"rand": rec.get("reads"), "small": rec.get("files")}.get(workload) or rec["bytes"] / MiB
    f.update({f"{role} switches": n / count for role, n in rec.get("switches", {}).items()})
    if rec["idle"] is not None:
        f["idle_pct"] = 100 * rec["idle"]
    return f


def summarize(per_run):
    """{workload: {system: {figure: summary}, "ratios": {"A/B": summary of per-run rate
    ratios}}} over the runs."""
    out = {}
    for w in (w for w in WORKLOADS if w in per_run[0]):
        runs = [r[w] for r in per_run]
        # A pass shorter than a jiffy has no idle share: summarize the runs that have it.
        entry = {s: {k: summary([r[s][k] for r in runs if k in r[s]])
                     for k in dict.fromkeys(k for r in runs for k in r[s])}
                 for s in SYSTEMS if s in runs[0]}
        pairs = [(s, "bindfs") for s in SYSTEMS if s != "bindfs"] + [
            ("rapidfs", "rapidfs-before"), ("rapidfs-ro", "rapidfs")]
        entry["ratios"] = {f"{a}/{c}": summary([r[a]["rate"] / r[c]["rate"] for r in runs])
                           for a, c in pairs if a in entry and c in entry}
        out[w] = entry
    return out


# (what, workload, figure: a ratio "A/B" or a rapidfs figure, "<=" or ">=", bound)
TARGETS = [
    ("a seq read >= 0.7x bindfs", "seq", "rapidfs/bindfs", ">=", 0.7),
    ("a daemon <= 0.4 CPU-s/GiB", "seq", "daemon", "<=", 0.4),
    ("a emulator <= 0.25 CPU-s/GiB", "seq", "emulator", "<=", 0.25),
    ("b 4 readers >= 0.6x bindfs", "par4", "rapidfs/bindfs", ">=", 0.6),
    ("c files/s >= 0.7x bindfs", "small", "rapidfs/bindfs", ">=", 0.7),
    ("c daemon <= 0.08 CPU-ms/file", "small", "daemon", "<=", 0.08),
    ("c emulator <= 0.06 CPU-ms/file", "small", "emulator", "<=", 0.06),
    ("d safetensors load >= 0.7x bindfs", "safetensors", "rapidfs/bindfs", ">=", 0.7),
    ("e 4K random p50 <= 100 us", "rand", "rate", "<=", 100),
]


def target_value(s, system, workload, fig):
    """The median of a ratio "rapidfs/B" (read as "SYSTEM/B") or of a SYSTEM figure, or None."""
    if "/" in fig:
        e = s[workload]["ratios"].get(fig.replace("rapidfs", system, 1))
    else:
        e = s[workload].get(system, {}).get(fig)
    return e and e["median"]


def targets(s):
    """Each target with the median of every rapidfs system measured, and whether rapidfs
    (`met`) and the read-only mount (`met_ro`) meet it."""
    out = []
    for what, w, fig, op, bound in (t for t in TARGETS if t[1] in s):
        t = {"target": what}
        for system in ("rapidfs", "rapidfs-ro", "rapidfs-before"):
            t[system] = target_value(s, system, w, fig)
        for key, system in (("met", "rapidfs"), ("met_ro", "rapidfs-ro")):
            v = t[system]
            t[key] = v is not None and (v <= bound if op == "<=" else v >= bound)
        out.append(t)
    return out


def table_rows(s):
    """One row per workload and system (the workload named on its first row only), and the
    random reads' p99 as rows of their own."""
    rows = []
    for w, (label, unit, cost_unit) in ((w, d) for w, d in WORKLOADS.items() if w in s):
        present = [system for system in SYSTEMS if system in s[w]]
        for i, system in enumerate(present):
            e = s[w][system]
            med = {k: v["median"] for k, v in e.items()}
            ratios = s[w]["ratios"]
            rows.append([label if i == 0 else "", system, cell(e["rate"]), unit,
                         cell(ratios.get(f"{system}/bindfs")),
                         cell(ratios.get("rapidfs/rapidfs-before")) if system == "rapidfs" else "",
                         cell(ratios.get("rapidfs-ro/rapidfs")) if system == "rapidfs-ro" else "",
                         *(fmt(med.get(role)) for role in ROLES),
                         cost_unit if "daemon" in med else "",
                         fmt(med.get("daemon switches")),
                         f"{med['idle_pct']:.0f}" if "idle_pct" in med else "-"])
        if w == "rand":
            rows += [["e 4K random pread p99" if i == 0 else "", system,
                      cell(s[w][system]["p99"]), "us"] for i, system in enumerate(present)]
    return rows


def table(s, tg, cfg, model_desc, loads):
    lines = [f"read-path benchmark (issue 18): median [min-max] of {cfg['runs']} run(s), "
             f"every pass cold on fresh mounts; big files {cfg['big_bytes'] >> 20} MiB, "
             f"{model_desc}, "
             f"{cfg['files']} small files, {cfg['random_reads']} random reads; "
             f"{os.cpu_count()} cores shared by the emulator, the daemons and the readers; "
             f"load average {min(loads):.1f}-{max(loads):.1f}",
             *columns(["workload", "system", "rate", "unit", "x bindfs", "x before", "x rw",
                       "daemon", "emulator", "CPU per", "daemon switches", "idle %"],
                      table_rows(s)), ""]
    for t in tg:
        ro = (f"; rapidfs-ro {fmt(t['rapidfs-ro'])} {'met' if t['met_ro'] else 'missed'}"
              if t["rapidfs-ro"] is not None else "")
        before = (f" (rapidfs-before {fmt(t['rapidfs-before'])})"
                  if t["rapidfs-before"] is not None else "")
        lines.append(f"{'MET   ' if t['met'] else 'MISSED'} {t['target']}: "
                     f"{fmt(t['rapidfs'])}{ro}{before}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one run (smoke test)")
    ap.add_argument("--runs", type=int, help="runs to take the median of (default 3, quick 1)")
    ap.add_argument("--binary", default=os.path.join(REPO, "target", "release", "rapidfs"))
    ap.add_argument("--baseline-binary",
                    help="an older rapidfs build, mounted as rapidfs-before over the same emulator")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    ap.add_argument("--data", help="where the generated data lives (default target/bench-data[-quick])")
    ap.add_argument("--out", default=os.path.join(REPO, "target", "bench-results", "read_path.json"))
    ap.add_argument("--seed", type=int, default=4, help="picks the random offsets and file orders")
    ap.add_argument("--back-memory-mib", type=int, default=0,
                    help="MiB of free memory the host backs again before each pass, after the "
                         "caches are dropped (benchlib's back_free_memory; default 0: none)")
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness of the benchmark and everything it starts (default -10: "
                         "other work on the machine disturbs the figures less; 0 to keep)")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help=f"workloads to run, comma-separated (default all: {','.join(WORKLOADS)})")
    args = ap.parse_args()
    only = args.only.split(",")
    if not only or any(w not in WORKLOADS for w in only):
        sys.exit(f"read_path.py: --only takes some of {','.join(WORKLOADS)}, not {args.only!r}")

    if os.geteuid() != 0:
        sys.exit("read_path.py: needs root (drop_caches, FUSE mounts)")
    cfg = dict(QUICK if args.quick else FULL)
    if args.runs:
        cfg["runs"] = args.runs
    data = os.path.abspath(args.data or os.path.join(
        REPO, "target", "bench-data-quick" if args.quick else "bench-data"))

    ensure_packages()
    if args.nice:
        os.nice(args.nice)
    if not args.no_build:
        log("cargo build --release")
        subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=REPO, check=True)
    binaries = {"rapidfs": os.path.abspath(args.binary), "rapidfs-ro": os.path.abspath(args.binary)}
    if args.baseline_binary:
        binaries["rapidfs-before"] = os.path.abspath(args.baseline_binary)
    for binary in binaries.values():
        if not os.access(binary, os.X_OK):
            sys.exit(f"read_path.py: no rapidfs binary at {binary}")
    make_data(data, cfg)
    loader, load = safetensors_loader()
    model_path = os.path.join(data, BUCKET, MODEL)
    model = (load, load_mmap(model_path))  # the reference comes from the local copy
    n_tensors = len(safetensors_header(model_path)[1])
    model_desc = f"safetensors {os.path.getsize(model_path) >> 20} MiB / {n_tensors} tensors"
    log(f"safetensors loader: {loader}")

    work = tempfile.mkdtemp(prefix="rapidfs-bench-")
    b = Bench(binaries, data, work, args.back_memory_mib)

    def on_signal(signum, _frame):
        # Further signals must not interrupt the cleanup this one starts.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    rng = random.Random(args.seed)
    raw_runs, loads = [], []
    started = time.time()
    try:
        b.start_emulator()
        for run in range(cfg["runs"]):
            loads.append(os.getloadavg()[0])
            raw_runs.append(one_run(b, cfg, run + 1, rng, model, only))
            loads.append(os.getloadavg()[0])
    finally:
        b.close()
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.time() - started

    per_run = [{w: {s: figures(w, rec) for s, rec in raw[w].items()} for w in only}
               for raw in raw_runs]
    s = summarize(per_run)
    tg = targets(s)
    mach = machine()
    print(table(s, tg, cfg, model_desc, loads))
    print(fresh_memory_line(mach["fresh_memory"]))
    sizes = small_sizes(cfg["files"])
    result = {
        "benchmark": "read_path (issue 18)",
        "command": " ".join(["python3", "benches/read_path.py", *sys.argv[1:]]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 1),
        "machine": mach,
        "config": {
            **cfg,
            "big_files": BIGS,
            "model_file_bytes": os.path.getsize(model_path),
            "model_tensors": n_tensors,
            "safetensors_loader": loader,
            "small_files": {**SMALL, "total_bytes": sum(sizes),
                            "median_bytes": statistics.median(sizes)},
            "readers": READERS,
            "read_size": MiB,
            "seed": args.seed,
            "data_seed": DATA_SEED,
            "units": {w: {"rate": u, "cost": c} for w, (_, u, c) in WORKLOADS.items()},
            "repo_commit": git_head(REPO),
            "binaries": {s: {"path": p, "version": binary_version(p)} for s, p in binaries.items()},
            "emulator": "rapidfs emulator --memory --root DATA --listen 127.0.0.1:0 (same "
                        "machine, --binary's build, shared by every rapidfs system)",
            "rapidfs_mount": "BINARY mount bench MNT --endpoint http://127.0.0.1:PORT (defaults)",
            "bindfs": "bindfs DATA/bench MNT (defaults)",
            "nice": args.nice,
            "back_memory_mib": args.back_memory_mib,
            "load_average_1min": loads,
            "cold": "fresh mounts; sync; echo 3 > /proc/sys/vm/drop_caches; the workload's "
                    "local files read once; systems in an order rotated per run, each "
                    "unmounted after its pass",
            "idle": "(idle + iowait) / all jiffies of all CPUs in /proc/stat during the pass",
            "shared_cores": "the emulator, the mount daemons and the readers share all cores",
        },
        "summary": s,
        "targets": tg,
        "runs": per_run,
        "raw": raw_runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwritten {args.out} ({seconds:.0f} s of runs)")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"read_path.py: interrupted ({e or 'SIGINT'}); mounts and emulator cleaned up")
