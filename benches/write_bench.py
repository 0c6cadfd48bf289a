#!/usr/bin/env python3
"""rapidfs write benchmark (issues 5 and 6): one command, a table for people, JSON for machines.

    sudo python3 benches/write_bench.py                 # full run: 3 runs, 512 MiB state dict
    sudo python3 benches/write_bench.py --runs 1 --state-mib 64 --small-files 200 --append-mib 64
                                                        # smoke run, under a minute
    sudo python3 benches/write_bench.py --only torch,dcp --state-mib 1024

Writers (--only picks some; each one writes into a new name on every system, but overwrite):
  torch        torch.save of a state dict (--state-mib MiB of float32 tensors in --tensors
               tensors, 512 MiB in 64 by default) into a file object opened by the benchmark,
               then flush, os.fsync and close: GB/s;
  overwrite    torch.save of the same state dict over the file a first torch.save (untimed)
               left at that name, then flush, os.fsync and close: saving `last.pt` every
               epoch. GB/s;
  dcp          torch.distributed.checkpoint.save of the same state dict with a FileSystemWriter
               (one rank, no process group; sync_files=True, its default) into a new directory:
               GB/s;
  safetensors  safetensors.torch.save_file of the same state dict, then os.fsync of the file:
               GB/s;
  small        --small-files files of --small-kib KiB (1,000 of 64 KiB by default), each
               created, written and closed in a new directory, without fsync (as tools write
               them; rapidfs's close persists the file, the local directory's does not):
               files/s;
  append       --append-mib MiB in 1 MiB writes with fsync every 8 MiB (a log or shard
               writer): GB/s, and the latency of each fsync (p50/p99, ms);
  stream       --state-mib MiB in 1 MiB writes, fsync, close: the raw write path without any
               serializer, to read the torch/dcp/safetensors figures against.
The byte count is that of the files the writer produced (stat after the pass).

Systems, all in every run (the order rotates from run to run; each is set up fresh for the run
and torn down after it):
  local        a directory under --work (on the disk of the directory emulator's root);
  bindfs       `bindfs SRC MNT` (defaults) over a directory under --work: the cost of FUSE;
  rapidfs-mem  `rapidfs mount` over `rapidfs emulator --memory` (bytes in the emulator's memory);
  rapidfs-dir  `rapidfs mount` over `rapidfs emulator --root DIR` (the directory backend: the
               bytes land in files under --work, on the same disk as local's).
Each emulator is a separate process on loopback, started per system and run. The mounts use
the default configuration but write.staging_dir (under --work).

CPU: utime + stime (from /proc/PID/stat, around each pass) of the rapidfs daemon and of its
emulator, or of the bindfs process, per GiB written (CPU-s/GiB) or per file (CPU-ms/file). The
emulator, the daemons and the writer share the machine's cores (see the header's load average:
other work on the machine disturbs the figures).

With --back-memory-mib N (off by default; see benchlib's back_free_memory), before each pass,
after a sync, the host backs N MiB of free memory again (a file written under --work and
deleted). On a virtual machine whose kernel hands freed memory back to its host, the first
touch of a page the host took back costs a fault on the host; a pass that took such pages for
its page cache (the local writer's, or the directory emulator's) ran 3-6 times slower,
whichever system it was.

Every figure is the median of --runs runs with min and max; the ratios to local are taken per
run (a system's rate over local's in the same run) and their median given. After each pass the
bytes are checked cheaply, untimed, so that a broken write cannot pass for a fast one: file
sizes (torch: the bytes torch.save wrote; safetensors: its header's layout; small files: every
size and the contents of three), and one tensor loaded back and compared (torch.load with
mmap, safe_open, dcp.load of one key). Then the output is deleted, except small files: those,
and each system's files when it is torn down, are set aside and deleted at the end (a freed
inode slows the creates of the next minute on an ext4 without a journal).

Then the acceptance targets of the issue, met or missed: small files on rapidfs-mem >= 3,000
files/s with the daemon <= 0.15 CPU-ms/file; small files on rapidfs-dir >= 1,500 files/s;
torch.save + fsync >= 0.9x local and DCP save >= 0.8x local, both on rapidfs-dir.

The torch, dcp and safetensors writers need torch and safetensors: when this Python lacks torch
the script re-executes itself with $RAPIDFS_PYTHON or ~/.cache/rapidfs/venv/bin/python (the
venv `source tests/setup.sh` creates) when that has it, and otherwise skips those writers with
a line saying so. Needs root (mounts) and bindfs (installed with apt-get when missing, as
tests/setup.sh does). RAPIDFS_BIN (or --binary) picks the binary; without either the script
runs `cargo build --release` first (--no-build skips it). Writes
target/bench-results/write_bench.json (configuration, every pass's raw record, per-run
figures, medians, targets). Unmounts everything and stops the emulators on any exit.
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
from benchlib import (back_free_memory, binary_version, cell, columns, cpu_seconds, ensure_packages, find_pid, fmt, fresh_memory_line, git_head, is_mounted, log, machine, stop_process, summary)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
BUCKET = "bench"
SYSTEMS = ("local", "bindfs", "rapidfs-mem", "rapidfs-dir")
ROLES = ("daemon", "emulator")
# case: (label, rate unit, cost unit)
CASES = {
    "torch": ("torch.save + fsync", "GB/s", "CPU-s/GiB"),
    "overwrite": ("torch.save + fsync over a file", "GB/s", "CPU-s/GiB"),
    "dcp": ("DCP save, 1 rank", "GB/s", "CPU-s/GiB"),
    "safetensors": ("safetensors save_file + fsync", "GB/s", "CPU-s/GiB"),
    "small": ("small files, create/write/close", "files/s", "CPU-ms/file"),
    "append": ("appends, fsync every 8 MiB", "GB/s", "CPU-s/GiB"),
    "stream": ("1 MiB writes + fsync + close", "GB/s", "CPU-s/GiB"),
}
TORCH_CASES = ("torch", "overwrite", "dcp", "safetensors")
SYNC_EVERY_MIB = 8


def venv_python():
    return os.environ.get("RAPIDFS_PYTHON") or os.path.expanduser("~/.cache/rapidfs/venv/bin/python")


def reexec_with_torch():
    """Runs the script again with the venv's Python when this one lacks torch and that one has
    it; returns only when it does not."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    py = venv_python()
    # (a venv's python is a link to the system's: compare the paths, not what they point to)
    if os.environ.get("RAPIDFS_WRITE_BENCH_REEXEC") or not os.access(py, os.X_OK) \
            or os.path.abspath(py) == os.path.abspath(sys.executable):
        return
    if subprocess.run([py, "-c", "import torch"], capture_output=True).returncode != 0:
        return
    os.environ["RAPIDFS_WRITE_BENCH_REEXEC"] = "1"
    os.execv(py, [py, os.path.abspath(__file__), *sys.argv[1:]])


# ---------------------------------------------------------------------------------------------
# Environment: packages, processes, mounts, CPU accounting.


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Meter:
    """CPU seconds of some processes from construction to `stop()`."""

    def __init__(self, pids):
        self.pids = pids
        self.start = {role: cpu_seconds(pid) for role, pid in pids.items()}

    def stop(self):
        cpu = {}
        for role, pid in self.pids.items():
            end = cpu_seconds(pid)
            if end is None:
                raise RuntimeError(f"the {role} (pid {pid}) exited during the pass")
            cpu[role] = end - self.start[role]
        return cpu


class System:
    """One system of one run: where to write, the pids to meter, and its teardown."""

    def __init__(self, name, binary, work, bindfs_options=()):
        self.name = name
        self.bindfs_options = list(bindfs_options)
        self.binary = binary
        self.base = os.path.join(work, name)
        self.emulator = None
        self.mnt = None
        self.pids = {}
        shutil.rmtree(self.base, ignore_errors=True)
        os.makedirs(self.base)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self):
        if self.name == "local":
            self.dir = os.path.join(self.base, "dir")
            os.makedirs(self.dir)
            return
        self.mnt = os.path.join(self.base, "mnt")
        os.makedirs(self.mnt)
        if self.name == "bindfs":
            src = os.path.join(self.base, "src")
            os.makedirs(src)
            subprocess.run(["bindfs", *self.bindfs_options, src, self.mnt], check=True, timeout=60)
            self.pids["daemon"] = find_pid(["bindfs", self.mnt])
        else:
            root = os.path.join(self.base, "emulator-root")
            os.makedirs(os.path.join(root, BUCKET))
            memory = ["--memory"] if self.name == "rapidfs-mem" else []
            self.emulator = subprocess.Popen(
                [self.binary, "emulator", *memory, "--root", root, "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE, stderr=open(os.path.join(self.base, "emulator.log"), "w"),
                text=True)
            line = self.emulator.stdout.readline()
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if not m:
                raise RuntimeError(f"{self.name}: the emulator did not start: {line.strip()!r}")
            conf = os.path.join(self.base, "rapidfs.toml")
            with open(conf, "w") as f:
                f.write(f'[write]\nstaging_dir = "{self.base}/staging"\n')
            r = subprocess.run(
                [self.binary, "mount", BUCKET, self.mnt, "--endpoint", m.group(1), "--config", conf,
                 "--log-file", os.path.join(self.base, "daemon.log")],
                capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"{self.name}: mount failed: {r.stderr.strip()}")
            self.pids["daemon"] = find_pid([os.path.basename(self.binary), "mount", self.mnt])
            self.pids["emulator"] = self.emulator.pid
        if self.pids["daemon"] is None:
            raise RuntimeError(f"{self.name}: no daemon process found for {self.mnt}")
        self.dir = self.mnt

    def close(self):
        try:
            if self.mnt and is_mounted(self.mnt):
                for cmd in (["umount", self.mnt], ["umount", "-l", self.mnt]):
                    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   timeout=120)
                    if not is_mounted(self.mnt):
                        break
            pid = self.pids.get("daemon")
            if pid is not None:
                deadline = time.time() + 10
                while running(pid) and time.time() < deadline:
                    time.sleep(0.01)
                if running(pid):
                    os.kill(pid, signal.SIGKILL)
        finally:
            stop_process(self.emulator)
            if not (self.mnt and is_mounted(self.mnt)):
                # Set aside, deleted at the end (see `run_case`): one rename, no inode freed.
                aside = os.path.join(trash_dir(os.path.dirname(self.base)),
                                     f"{self.name}-{time.time_ns()}")
                os.makedirs(os.path.dirname(aside), exist_ok=True)
                os.rename(self.base, aside)


def trash_dir(work):
    """Where the systems' files wait for the end of the benchmark, under `work`."""
    return os.path.join(work, ".set-aside")


# ---------------------------------------------------------------------------------------------
# Writers. Each returns the raw record of one timed pass; `check_*` verify it afterwards.


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def w_torch(t, path, sd):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        t.torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
        written = f.tell()
    secs = time.perf_counter() - t0
    return {"seconds": secs, "bytes": os.path.getsize(path), "files": 1, "written": written}


def c_torch(t, path, sd, rec):
    if rec["bytes"] != rec["written"]:
        raise RuntimeError(f"{path}: {rec['bytes']} bytes, torch.save wrote {rec['written']}")
    key = t.check_key
    got = t.torch.load(path, mmap=True, weights_only=True)[key]
    if not t.torch.equal(got, sd[key]):
        raise RuntimeError(f"{path}: tensor {key} differs")


def w_dcp(t, path, sd):
    t0 = time.perf_counter()
    t.dcp.save(sd, storage_writer=t.FileSystemWriter(path))
    secs = time.perf_counter() - t0
    names = os.listdir(path)
    return {"seconds": secs, "files": len(names),
            "bytes": sum(os.path.getsize(os.path.join(path, n)) for n in names)}


def c_dcp(t, path, sd, rec):
    if ".metadata" not in os.listdir(path):
        raise RuntimeError(f"{path}: no .metadata")
    if rec["bytes"] < t.state_bytes:
        raise RuntimeError(f"{path}: {rec['bytes']} bytes < the state dict's {t.state_bytes}")
    key = t.check_key
    got = {key: t.torch.empty_like(sd[key])}
    t.dcp.load(got, storage_reader=t.FileSystemReader(path))
    if not t.torch.equal(got[key], sd[key]):
        raise RuntimeError(f"{path}: tensor {key} differs")


def w_safetensors(t, path, sd):
    t0 = time.perf_counter()
    t.save_file(sd, path)
    fsync_path(path)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "bytes": os.path.getsize(path), "files": 1}


def c_safetensors(t, path, sd, rec):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    if rec["bytes"] != 8 + n + end or end != t.state_bytes:
        raise RuntimeError(f"{path}: {rec['bytes']} bytes, the header says {8 + n + end}")
    key = t.check_key
    with t.safe_open(path, framework="pt") as f:
        if not t.torch.equal(f.get_tensor(key), sd[key]):
            raise RuntimeError(f"{path}: tensor {key} differs")


def small_name(dirpath, i):
    return os.path.join(dirpath, f"f{i:05d}.bin")


def small_data(data, i):
    return i.to_bytes(8, "little") + data[8:]


def w_small(cfg, path, data):
    os.makedirs(path)
    n = cfg["small_files"]
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(small_name(path, i), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, small_data(data, i))
        finally:
            os.close(fd)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "files": n, "bytes": n * len(data)}


def c_small(cfg, path, data, rec):
    n = cfg["small_files"]
    names = sorted(os.listdir(path))
    if names != sorted(os.path.basename(small_name(path, i)) for i in range(n)):
        raise RuntimeError(f"{path}: {len(names)} names, wanted {n}")
    for name in names:
        if os.path.getsize(os.path.join(path, name)) != len(data):
            raise RuntimeError(f"{path}/{name}: wrong size")
    for i in sorted({0, n // 2, n - 1}):
        with open(small_name(path, i), "rb") as f:
            if f.read() != small_data(data, i):
                raise RuntimeError(f"{small_name(path, i)}: wrong bytes")


def w_append(cfg, path, block):
    total = cfg["append_mib"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    lat = []
    t0 = time.perf_counter()
    try:
        for i in range(total):
            os.write(fd, block)
            if (i + 1) % SYNC_EVERY_MIB == 0:
                t = time.perf_counter()
                os.fsync(fd)
                lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "bytes": os.path.getsize(path), "files": 1, "fsync_s": lat}


def w_stream(cfg, path, block):
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(cfg["state_mib"]):
            os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    secs = time.perf_counter() - t0
    return {"seconds": secs, "bytes": os.path.getsize(path), "files": 1}


def c_blocks(mib, path, block, rec):
    if rec["bytes"] != mib * MiB:
        raise RuntimeError(f"{path}: {rec['bytes']} bytes, wanted {mib * MiB}")
    with open(path, "rb") as f:
        f.seek((mib - 1) * MiB)
        if f.read() != block:
            raise RuntimeError(f"{path}: the last MiB differs")


class Torch:
    """torch, DCP and safetensors, and the state dict, when they import."""

    def __init__(self, cfg):
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
        from safetensors import __version__ as st_version
        from safetensors.torch import safe_open, save_file
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        self.torch, self.dcp = torch, dcp
        self.FileSystemReader, self.FileSystemWriter = FileSystemReader, FileSystemWriter
        self.safe_open, self.save_file = safe_open, save_file
        self.versions = {"torch": torch.__version__, "safetensors": st_version}
        n = cfg["tensors"]
        numel = cfg["state_mib"] * MiB // 4 // n
        g = torch.Generator().manual_seed(5)
        self.sd = {f"layer{i:03d}.weight": torch.randn(numel, generator=g) for i in range(n)}
        self.state_bytes = 4 * numel * n
        self.check_key = f"layer{n - 1:03d}.weight"  # the last one written


def run_case(case, sysm, run, cfg, t, data, block):
    """One timed pass of a writer on a system, metered, checked, then deleted."""
    path = os.path.join(sysm.dir, f"{case}-{run}" + (".pt" if case in ("torch", "overwrite") else ""))
    if case == "overwrite":
        w_torch(t, path, t.sd)
    os.sync()  # earlier passes' dirty pages are not this pass's work
    back_free_memory(cfg["work"], cfg["back_memory_mib"])
    meter = Meter(sysm.pids)
    if case in ("torch", "overwrite"):
        rec = w_torch(t, path, t.sd)
    elif case == "dcp":
        rec = w_dcp(t, path, t.sd)
    elif case == "safetensors":
        rec = w_safetensors(t, path, t.sd)
    elif case == "small":
        rec = w_small(cfg, path, data)
    elif case == "append":
        rec = w_append(cfg, path, block)
    else:
        rec = w_stream(cfg, path, block)
    rec["cpu"] = meter.stop()
    if case in ("torch", "overwrite"):
        c_torch(t, path, t.sd, rec)
    elif case == "dcp":
        c_dcp(t, path, t.sd, rec)
    elif case == "safetensors":
        c_safetensors(t, path, t.sd, rec)
    elif case == "small":
        c_small(cfg, path, data, rec)
    else:
        c_blocks(cfg["append_mib"] if case == "append" else cfg["state_mib"], path, block, rec)
    if case == "small":
        # Left for the end of the benchmark (`System.close` sets the system's files aside):
        # on an ext4 without a journal, each inode freed in the last minute slows every file
        # created after it, and a thousand deletions here would slow the next pass's creates,
        # whichever system made them (six back-to-back passes of 2,000 files through the
        # directory emulator went from 1,004 to 519 files/s).
        return rec
    if os.path.isdir(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return rec


# ---------------------------------------------------------------------------------------------
# Figures, ratios, targets, table.


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def figures(case, rec):
    if case == "small":
        f = {"rate": rec["files"] / rec["seconds"]}
        per = rec["files"] / 1e3  # CPU seconds / thousands of files = ms per file
    else:
        f = {"rate": rec["bytes"] / rec["seconds"] / 1e9}
        per = rec["bytes"] / GiB
    f.update({role: s / per for role, s in rec["cpu"].items()})
    if case == "append" and rec["fsync_s"]:
        f["fsync_p50_ms"] = pct(rec["fsync_s"], 0.5) * 1e3
        f["fsync_p99_ms"] = pct(rec["fsync_s"], 0.99) * 1e3
    return f


def summarize(per_run, cases):
    out = {}
    for c in cases:
        runs = [r[c] for r in per_run]
        entry = {s: {k: summary([r[s][k] for r in runs if k in r[s]])
                     for k in dict.fromkeys(k for r in runs for k in r[s])}
                 for s in SYSTEMS if s in runs[0]}
        entry["ratios"] = {f"{s}/local": summary([r[s]["rate"] / r["local"]["rate"] for r in runs])
                           for s in SYSTEMS if s != "local" and s in entry and "local" in entry}
        out[c] = entry
    return out


# (what, case, system, figure: "rate", a role, or "x local", "<=" or ">=", bound)
TARGETS = [
    ("small files, memory emulator >= 3000 files/s", "small", "rapidfs-mem", "rate", ">=", 3000),
    ("small files, memory emulator: daemon <= 0.15 CPU-ms/file", "small", "rapidfs-mem",
     "daemon", "<=", 0.15),
    ("small files, directory emulator >= 1500 files/s", "small", "rapidfs-dir", "rate", ">=", 1500),
    ("torch.save + fsync >= 0.9x local (directory emulator)", "torch", "rapidfs-dir", "x local",
     ">=", 0.9),
    ("DCP save >= 0.8x local (directory emulator)", "dcp", "rapidfs-dir", "x local", ">=", 0.8),
]


def targets(s):
    out = []
    for what, case, system, fig, op, bound in TARGETS:
        if case not in s or system not in s[case]:
            out.append({"target": what, "value": None, "met": None})
            continue
        e = s[case]["ratios"].get(f"{system}/local") if fig == "x local" else s[case][system].get(fig)
        v = e and e["median"]
        out.append({"target": what, "value": v,
                    "met": None if v is None else (v <= bound if op == "<=" else v >= bound)})
    return out


def table_rows(s, cfg):
    rows = []
    for c in s:
        label, unit, cost_unit = CASES[c]
        if c == "small":
            label = f"{cfg['small_files']} x {cfg['small_kib']} KiB files"
        present = [x for x in SYSTEMS if x in s[c]]
        for i, system in enumerate(present):
            e = s[c][system]
            med = {k: v["median"] for k, v in e.items()}
            rows.append([label if i == 0 else "", system, cell(e["rate"]), unit,
                         cell(s[c]["ratios"].get(f"{system}/local")) if system != "local" else "1",
                         *(cell(e.get(role)) for role in ROLES),
                         cost_unit if "daemon" in med else ""])
        if c == "append":
            for q in ("p50", "p99"):
                rows += [[f"append fsync {q}" if i == 0 else "", system,
                          cell(s[c][system].get(f"fsync_{q}_ms")), "ms"]
                         for i, system in enumerate(present)]
    return rows


def table(s, tg, cfg, loads):
    lines = [f"write benchmark: median [min-max] of {cfg['runs']} run(s); state dict "
             f"{cfg['state_mib']} MiB in {cfg['tensors']} float32 tensors; "
             f"{os.cpu_count()} cores shared by the emulator, the daemon and the writer; "
             f"load average {min(loads):.1f}-{max(loads):.1f}",
             *columns(["writer", "system", "rate", "unit", "x local", "daemon CPU",
                       "emulator CPU", "CPU per"], table_rows(s, cfg)), ""]
    for t in tg:
        mark = {True: "MET   ", False: "MISSED", None: "n/a   "}[t["met"]]
        lines.append(f"{mark} {t['target']}: {fmt(t['value'])}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default=",".join(CASES),
                    help=f"comma-separated writers (default all: {','.join(CASES)})")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help="comma-separated systems (default all; local is needed for ratios)")
    ap.add_argument("--state-mib", type=int, default=512, help="state dict size (and stream's)")
    ap.add_argument("--tensors", type=int, default=64, help="tensors in the state dict")
    ap.add_argument("--small-files", type=int, default=1000)
    ap.add_argument("--small-kib", type=int, default=64)
    ap.add_argument("--append-mib", type=int, default=512)
    ap.add_argument("--binary", default=os.environ.get("RAPIDFS_BIN"),
                    help="rapidfs binary (default $RAPIDFS_BIN, else target/release/rapidfs "
                         "after cargo build --release)")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build --release")
    ap.add_argument("--work", default="/var/tmp/rapidfs-write-bench",
                    help="local directory, bindfs source, emulator roots, staging (one disk)")
    ap.add_argument("--bindfs-options", default="",
                    help="extra bindfs arguments, e.g. '-o big_writes' (default none: bindfs "
                         "built on libfuse 2 then writes in 4 KiB requests)")
    ap.add_argument("--back-memory-mib", type=int, default=0,
                    help="MiB of free memory the host backs again before each pass (benchlib's "
                         "back_free_memory; default 0: none)")
    ap.add_argument("--nice", type=int, default=-10,
                    help="niceness of the benchmark and everything it starts (0 to keep)")
    ap.add_argument("--out", default=os.path.join(ROOT, "target", "bench-results", "write_bench.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("write_bench.py: run as root: mounting needs it")
    cases = [c for c in args.only.split(",") if c]
    systems = [x for x in args.systems.split(",") if x]
    for c in cases:
        if c not in CASES:
            sys.exit(f"write_bench.py: unknown writer {c!r} (known: {', '.join(CASES)})")
    for x in systems:
        if x not in SYSTEMS:
            sys.exit(f"write_bench.py: unknown system {x!r} (known: {', '.join(SYSTEMS)})")
    cfg = {"runs": args.runs, "state_mib": args.state_mib, "tensors": args.tensors,
           "small_files": args.small_files, "small_kib": args.small_kib,
           "append_mib": args.append_mib, "back_memory_mib": args.back_memory_mib,
           "work": args.work}

    t = None
    if any(c in TORCH_CASES for c in cases):
        try:
            t = Torch(cfg)
        except ImportError as e:
            skipped = [c for c in cases if c in TORCH_CASES]
            print(f"write_bench.py: {e} in {sys.executable} (source tests/setup.sh for the venv): "
                  f"skipping {', '.join(skipped)}", file=sys.stderr)
            cases = [c for c in cases if c not in TORCH_CASES]
    if not cases:
        sys.exit("write_bench.py: no writer left to run")

    if any(x != "local" for x in systems):
        ensure_packages()
    if args.nice:
        os.nice(args.nice)
    binary = args.binary
    if binary is None:
        binary = os.path.join(ROOT, "target", "release", "rapidfs")
        if not args.no_build:
            log("cargo build --release")
            subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    binary = os.path.abspath(binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"write_bench.py: no rapidfs binary at {binary}")

    def on_signal(signum, _frame):
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    data = os.urandom(args.small_kib * KiB)
    block = os.urandom(MiB)
    os.makedirs(args.work, exist_ok=True)
    raw_runs, loads = [], []
    started = time.time()
    shutil.rmtree(trash_dir(args.work), ignore_errors=True)
    try:
        for run in range(args.runs):
            loads.append(os.getloadavg()[0])
            order = systems[run % len(systems):] + systems[:run % len(systems)]
            raw = {c: {} for c in cases}
            for name in order:
                sysm = System(name, binary, args.work, args.bindfs_options.split())
                try:
                    for c in cases:
                        rec = run_case(c, sysm, run, cfg, t, data, block)
                        raw[c][name] = rec
                        log(f"run {run + 1} {name:<11} {c:<11} {rec['seconds']:7.2f} s "
                            f"{fmt(figures(c, rec)['rate'])} {CASES[c][1]}")
                finally:
                    sysm.close()
            raw_runs.append(raw)
            loads.append(os.getloadavg()[0])
    finally:
        shutil.rmtree(trash_dir(args.work), ignore_errors=True)
    seconds = time.time() - started

    per_run = [{c: {x: figures(c, rec) for x, rec in raw[c].items()} for c in cases}
               for raw in raw_runs]
    s = summarize(per_run, cases)
    tg = targets(s)
    mach = machine()
    print(table(s, tg, cfg, loads))
    print(fresh_memory_line(mach["fresh_memory"]))
    for raw in raw_runs:  # keep the JSON small: fsync latencies as percentiles only
        for rec in raw.get("append", {}).values():
            rec["fsync_count"] = len(rec.pop("fsync_s"))
    result = {
        "benchmark": "write_bench (issues 5 and 6)",
        "command": " ".join([os.path.basename(sys.executable), "benches/write_bench.py", *sys.argv[1:]]),
        "when_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 1),
        "machine": mach,
        "config": {
            **cfg,
            "writers": cases,
            "systems": systems,
            "state_dict_bytes": t.state_bytes if t else None,
            "versions": t.versions if t else None,
            "small_file_bytes": args.small_kib * KiB,
            "write_size": MiB,
            "fsync_every_mib": SYNC_EVERY_MIB,
            "units": {c: {"rate": u, "cost": k} for c, (_, u, k) in CASES.items() if c in cases},
            "repo_commit": git_head(ROOT),
            "binary": {"path": binary, "version": binary_version(binary)},
            "work": args.work,
            "local": f"{args.work}/local/dir",
            "bindfs": f"bindfs {args.bindfs_options + ' ' if args.bindfs_options else ''}"
                      f"{args.work}/bindfs/src MNT",
            "bindfs_version": shutil.which("bindfs") and subprocess.run(
                ["bindfs", "--version"], capture_output=True, text=True).stdout.strip(),
            "emulators": "rapidfs emulator [--memory] --root WORK/SYSTEM/emulator-root "
                         "--listen 127.0.0.1:0, one per rapidfs system and run",
            "rapidfs_mount": "rapidfs mount bench MNT --endpoint http://127.0.0.1:PORT, config: "
                             "write.staging_dir = WORK/SYSTEM/staging, else defaults",
            "nice": args.nice,
            "load_average_1min": loads,
            "ratios": "per run, system rate / local rate in the same run; median over runs",
            "shared_cores": "the emulator, the mount daemons and the writer share all cores",
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
    reexec_with_torch()
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"write_bench.py: interrupted ({e or 'SIGINT'}); mounts and emulators cleaned up")
