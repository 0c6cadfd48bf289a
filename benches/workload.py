#!/usr/bin/env python3
"""Training-data workload benchmark of issue 9: a PyTorch DataLoader reading an
image-folder-like dataset by plain paths, shuffled, decoding nothing, against what users would
use instead.

    python3 benches/workload.py            # full run: 3 runs of every row (about 20 min)
    python3 benches/workload.py --quick    # smoke run: small sample, 1 run (a few minutes)
    python3 benches/workload.py --rows local,rapidfs,google --latencies 0 --workers 4
                                           # only some rows, latencies (ms) and worker counts

Dataset: 20,000 files in 100 class directories (train/cNNN/NNNNN.jpg), sizes 16 KiB..1 MiB,
log-normal with a median of about 110 KiB, random bytes; generated once under
target/workload-data and reused. Each pass reads the same fixed shuffled sample of N of them
(`--sample`, default 5,000, printed in the table) with batch size 32 and reports samples/s,
MB/s and time to first batch (from creating the iterator, so worker start-up counts). The pass
is that long because start-up weighs on a short one: at 1,000 files the first batch took 40% of
a local-cold pass, and the ratios between rows moved by a third from run to run. "after 1st/s"
is the rate after the first batch, to show how much start-up still weighs.

Rows, each with DataLoader workers 0, 2 and 4 unless said:
  local cold       the dataset directory after `drop_caches` (read from the disk);
  local warm       the same with the sample in the page cache;
  fuse passthrough bindfs (defaults) over the dataset directory, caches dropped: what any FUSE
                   filesystem costs on this machine with no network and no server behind it
                   (the ceiling of a FUSE design here, to read the local-cold ratio against);
  rapidfs          a fresh `rapidfs mount` (caches dropped) of a separate `rapidfs emulator
                   --memory` process preloaded with the dataset, at 0, 1 and 5 ms latency;
  rapidfs read-only the same mounted `--read-only`, as a training job mounts its dataset (the
                   kernel then reads files without sending opens and releases);
  rapidfs+helper   the same with python/rapidfs_sampler.py's RapidfsSampler sending the order
                   (0 ms with 4 workers; 5 ms with 2 and 4 workers);
  google client    google-cloud-storage's AsyncMultiRangeDownloader (the engine of gcsfs on
                   Rapid) against the same emulator: each worker process (or the main process
                   with 0 workers) fetches its whole batch at once through `__getitems__`, one
                   pooled bidi stream per object in flight, every object one range, all
                   concurrently; same number of processes as the DataLoader;
  raw rust         benches/workload_raw.rs: this crate's client, one process, 32 objects in
                   flight, no FUSE (the ceiling), at 0, 1 and 5 ms;
  4x budget        rapidfs+helper, 5 ms, 2 workers, with `cache.memory_mb` a quarter of the
                   sample's bytes: emulator bytes sent / bytes read (emulator stats via
                   `--stats-file` + SIGUSR1) and the daemon's peak RSS against budget + 64 MiB.

Three more columns say where the time goes: "idle %", the share of the machine's CPU time left
idle during the pass (from creating the iterator to the last batch); "svc cpu ms", the CPU
time per sample of what serves the bytes besides the DataLoader: the daemon plus the emulator
for rapidfs rows, bindfs for the passthrough, the emulator for the Google client (whose own
CPU is in its workers); and "busy cpu ms", the whole machine's busy CPU time per sample during
the pass. From these the report works out what the 0.8x-local-cold target leaves the daemon:
at that rate the machine has at most cores / rate of CPU per sample, of which the DataLoader
side (busy minus serving) and the emulator take their measured shares first.

With `--train MODEL` (a torchvision model name, e.g. resnet50) every pass also trains MODEL on
each batch, on the GPU when there is one: the worker processes turn each sample's first
3 x 128 x 128 bytes into an image (a copy, standing in for decoding), the main process takes
one SGD step in bf16 autocast per batch (after warm-up steps outside the timing), and the row
"train, no reading" takes the same steps on one batch held in memory: the model's ceiling,
which the other rows are read against.

Every figure is the median of the runs (min and max in the JSON); ratios are against rows of
the same run. The emulator, the daemon and the DataLoader share the machine's cores.
Writes target/bench-results/workload.json. Needs root (drop_caches, mounts), fuse3, bindfs, and a
Python with torch and google-cloud-storage[grpc] (tests/setup.sh's venv; the script re-runs
itself under $RAPIDFS_PYTHON or ~/.cache/rapidfs/venv when its own Python lacks them).
Talks to nothing but 127.0.0.1. Unmounts everything and stops the emulator on any exit.
"""

import argparse
import glob
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from benchlib import find_pid, is_mounted, stop_process

KiB = 1 << 10
MiB = 1 << 20
FILES = 20_000
CLASSES = 100
# Files read per pass unless --sample says otherwise.
DEFAULT_SAMPLE = 5000
BATCH = 32
# Side of the square three-channel image a sample becomes with --train.
IMAGE = 128
# Training steps taken before a pass's clock starts (cuDNN's autotuning, allocations).
WARMUP_STEPS = 15
ROWS = ("local", "passthrough", "rapidfs", "readonly", "helper", "google", "raw", "budget")
# The name of each kind of rapidfs row in the table.
RAPIDFS_ROWS = {"rapidfs": "rapidfs", "readonly": "rapidfs read-only", "helper": "rapidfs+helper"}
BUCKET = "bench"
SEED = 9
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(REPO, "target", "workload-data")


def log(msg):
    print(f"[workload {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# One pass, run in a fresh child process (`--pass SPEC`) so that torch, gRPC and the
# DataLoader's worker processes start clean every time.


class FileDataset:
    """Reads whole files by path with 1 MiB unbuffered reads; returns the bytes."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        out = bytearray()
        with open(self.paths[i], "rb", buffering=0) as f:
            while True:
                b = f.read(MiB)
                if not b:
                    return bytes(out)
                out += b


class GcsDataset:
    """The same samples through Google's async bidi client, as gcsfs reads Rapid objects:
    a batch is fetched at once, one multi-range downloader (bidi stream) per object."""

    def __init__(self, endpoint, names):
        self.endpoint = endpoint
        self.names = names
        self._pid = None

    def __len__(self):
        return len(self.names)

    def _start(self):
        import asyncio
        import threading

        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.storage.asyncio.async_grpc_client import AsyncGrpcClient

        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

        async def make():
            return AsyncGrpcClient(credentials=AnonymousCredentials(),
                                   client_options=ClientOptions(api_endpoint=self.endpoint))

        self._client = asyncio.run_coroutine_threadsafe(make(), self._loop).result()
        self._pid = os.getpid()

    async def _one(self, name):
        from io import BytesIO

        from google.cloud.storage.asyncio.async_multi_range_downloader import (
            AsyncMultiRangeDownloader,
        )
        mrd = await AsyncMultiRangeDownloader.create_mrd(self._client, BUCKET, name)
        try:
            buf = BytesIO()
            await mrd.download_ranges([(0, 0, buf)])
            return buf.getvalue()
        finally:
            await mrd.close()

    async def _many(self, names):
        import asyncio
        return await asyncio.gather(*(self._one(n) for n in names))

    def __getitems__(self, indices):
        import asyncio
        if self._pid != os.getpid():
            self._start()
        fut = asyncio.run_coroutine_threadsafe(self._many([self.names[i] for i in indices]),
                                               self._loop)
        return fut.result()

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


def collate(batch):
    return batch


def to_images(batch):
    """Collate for --train: each sample's first 3 x IMAGE x IMAGE bytes (zero-padded) as a
    uint8 image, its size modulo CLASSES as its label; and the bytes the batch read."""
    import torch

    n = 3 * IMAGE * IMAGE
    images = torch.zeros((len(batch), 3, IMAGE, IMAGE), dtype=torch.uint8)
    flat = images.view(len(batch), -1)
    for i, b in enumerate(batch):
        m = min(n, len(b))
        flat[i, :m] = torch.frombuffer(bytearray(b[:m]), dtype=torch.uint8)
    labels = torch.tensor([len(b) % CLASSES for b in batch])
    return images, labels, sum(len(b) for b in batch)


class Trainer:
    """One SGD step of torchvision's `model` per batch, bf16 autocast, channels-last, on CUDA
    when there is a GPU (else the CPU, for a smoke run); warmed up when made."""

    def __init__(self, model):
        import torch
        import torchvision

        self.torch = torch
        self.dev = "cuda" if torch.cuda.is_available() else "cpu"
        torch.backends.cudnn.benchmark = True
        self.model = getattr(torchvision.models, model)(num_classes=CLASSES).to(
            self.dev, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()
        images, labels = self.held_batch()
        for _ in range(WARMUP_STEPS):
            self.step(images, labels)
        self.sync()

    def held_batch(self):
        """A batch of random images and labels, as `to_images` makes them."""
        torch = self.torch
        return (torch.randint(0, 256, (BATCH, 3, IMAGE, IMAGE), dtype=torch.uint8),
                torch.randint(0, CLASSES, (BATCH,)))

    def step(self, images, labels):
        torch = self.torch
        x = images.to(self.dev, non_blocking=True).float().div_(255).contiguous(
            memory_format=torch.channels_last)
        y = labels.to(self.dev, non_blocking=True)
        with torch.autocast(self.dev, dtype=torch.bfloat16):
            loss = self.loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self):
        """Waits for the steps queued on the GPU, so that the clock covers them."""
        if self.dev == "cuda":
            self.torch.cuda.synchronize()


def held_pass(spec, trainer):
    """The training steps of a pass over `spec`'s sample on one batch held in memory."""
    images, labels = trainer.held_batch()
    n = len(spec["order"])
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        k = min(BATCH, n - start)
        trainer.step(images[:k], labels[:k])
    trainer.sync()
    secs = time.perf_counter() - t0
    return {"seconds": secs, "samples": n, "bytes": 0, "first_batch_seconds": 0.0,
            "first_batch_samples": 0}


def run_pass(spec):
    from torch.utils.data import DataLoader

    order = spec["order"]
    trainer = Trainer(spec["train"]) if spec.get("train") else None
    if spec["kind"] == "held":
        return held_pass(spec, trainer)
    if spec["kind"] == "gcs":
        ds = GcsDataset(spec["endpoint"], spec["names"])
    else:
        ds = FileDataset(spec["paths"])
    sampler = order
    if spec.get("helper"):
        sys.path.insert(0, os.path.join(REPO, "python"))
        from rapidfs_sampler import RapidfsSampler
        sampler = RapidfsSampler(order, spec["paths"], spec["mountpoint"])
    workers = spec["workers"]
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers,
                        collate_fn=to_images if trainer else collate,
                        pin_memory=bool(trainer and trainer.dev == "cuda"),
                        prefetch_factor=2 if workers else None)
    stat0 = cpu_ticks()
    t0 = time.perf_counter()
    first, first_samples, samples, nbytes = None, 0, 0, 0
    for batch in loader:
        if trainer:
            images, labels, size = batch
            n = len(labels)
        else:
            n, size = len(batch), sum(len(b) for b in batch)
        if first is None:
            first = time.perf_counter() - t0
            first_samples = n
        samples += n
        nbytes += size
        if trainer:
            trainer.step(images, labels)
    if trainer:
        trainer.sync()
    secs = time.perf_counter() - t0
    idle, total = (b - a for a, b in zip(stat0, cpu_ticks()))
    return {"seconds": secs, "samples": samples, "bytes": nbytes, "first_batch_seconds": first,
            "first_batch_samples": first_samples,
            "idle_pct": 100 * idle / max(total, 1),
            "busy_cpu_s": (total - idle) / os.sysconf("SC_CLK_TCK")}


def cpu_ticks():
    """(idle, total) CPU ticks of the whole machine so far (/proc/stat)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:8]]
    return ticks[3] + ticks[4], sum(ticks)


# ---------------------------------------------------------------------------------------------
# Environment: data, caches, processes, mounts.


def sizes_of_dataset():
    rng = random.Random(SEED)
    out = []
    for _ in range(FILES):
        s = int(rng.lognormvariate(math.log(110 * KiB), 0.75))
        out.append(min(max(s, 16 * KiB), MiB))
    return out


def rel_name(i):
    return f"train/c{i % CLASSES:03d}/{i:05d}.jpg"


def make_data(sizes):
    manifest = os.path.join(DATA, ".manifest.json")
    want = {"files": FILES, "classes": CLASSES, "seed": SEED, "bytes": sum(sizes)}
    try:
        with open(manifest) as f:
            if json.load(f) == want:
                return
    except (OSError, ValueError):
        pass
    log(f"generating {FILES} files ({sum(sizes) / MiB:.0f} MiB) under {DATA}")
    shutil.rmtree(DATA, ignore_errors=True)
    for c in range(CLASSES):
        os.makedirs(os.path.join(DATA, BUCKET, "train", f"c{c:03d}"))
    for i, s in enumerate(sizes):
        with open(os.path.join(DATA, BUCKET, rel_name(i)), "wb") as f:
            f.write(os.urandom(s))
    subprocess.run(["sync"], check=True)
    with open(manifest, "w") as f:
        json.dump(want, f)


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def cpu_seconds(*pids):
    """User plus system CPU time of the processes `pids` so far (all their threads)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class Env:
    """Owns the emulator process and the mounts; `close()` undoes them all."""

    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        self.emulator = None
        self.endpoint = None
        self.stats_path = os.path.join(work, "emulator-stats.json")
        self.mounts = {}
        self.n = 0

    def start_emulator(self, latency_us):
        self.stop_emulator()
        log_path = os.path.join(self.work, f"emulator-{latency_us}.log")
        self.emulator = subprocess.Popen(
            [self.binary, "emulator", "--memory", "--root", DATA, "--listen", "127.0.0.1:0",
             "--latency-us", str(latency_us), "--stats-file", self.stats_path],
            stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True)
        line = self.emulator.stdout.readline()
        m = re.search(r"listening on http://(127\.0\.0\.1:\d+)", line)
        if not m:
            raise RuntimeError(f"emulator did not start: {line.strip()!r} (see {log_path})")
        self.endpoint = m.group(1)
        log(f"emulator {self.endpoint} ({latency_us} us latency, dataset preloaded)")

    def stats(self):
        """The emulator's counters now (SIGUSR1, then wait for the file to change)."""
        before = os.stat(self.stats_path).st_mtime_ns if os.path.exists(self.stats_path) else 0
        os.kill(self.emulator.pid, signal.SIGUSR1)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if os.stat(self.stats_path).st_mtime_ns != before:
                    with open(self.stats_path) as f:
                        return json.load(f)
            except (OSError, ValueError):
                pass
            time.sleep(0.01)
        raise RuntimeError("the emulator did not write its stats")

    def stop_emulator(self):
        stop_process(self.emulator, grace=15)
        self.emulator = None

    def mount_passthrough(self, root):
        """bindfs with its defaults over `root`: the FUSE baseline without a network."""
        if shutil.which("bindfs") is None:
            raise RuntimeError("bindfs is missing (tests/setup.sh installs it)")
        mnt = self._mountpoint()
        r = subprocess.run(["bindfs", root, mnt], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"bindfs failed: {r.stderr.strip()}")
        self.mounts[mnt] = find_pid(["bindfs", mnt])
        return mnt

    def _mountpoint(self):
        self.n += 1
        mnt = os.path.join(self.work, f"mnt{self.n}")
        os.makedirs(mnt)
        return mnt

    def mount(self, memory_mb=None, read_only=False):
        mnt = self._mountpoint()
        cmd = [self.binary, "mount", BUCKET, mnt, "--endpoint", f"http://{self.endpoint}",
               "--log-file", os.path.join(self.work, "mount.log")]
        if read_only:
            cmd.append("--read-only")
        if memory_mb is not None:
            cfg = os.path.join(self.work, f"mount{self.n}.toml")
            with open(cfg, "w") as f:
                f.write(f"[cache]\nmemory_mb = {memory_mb}\n")
            cmd += ["--config", cfg]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"rapidfs mount failed: {r.stderr.strip()}")
        self.mounts[mnt] = find_pid(["rapidfs", "mount", mnt])
        return mnt

    def unmount(self, mnt):
        pid = self.mounts.pop(mnt, None)
        for cmd in (["fusermount3", "-u", mnt], ["umount", mnt], ["umount", "-l", mnt]):
            if not is_mounted(mnt):
                break
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        if pid is not None:
            deadline = time.time() + 10
            while os.path.exists(f"/proc/{pid}") and time.time() < deadline:
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}"):
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
            self.stop_emulator()


# ---------------------------------------------------------------------------------------------
# The rows.


def child_pass(python, spec, work, train=None):
    path = os.path.join(work, "pass.json")
    with open(path, "w") as f:
        json.dump({**spec, "train": train}, f)
    r = subprocess.run([python, os.path.abspath(__file__), "--pass", path],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"pass {spec['kind']} failed: {r.stderr.strip()[-2000:]}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    if result["samples"] != len(spec["order"]):
        raise RuntimeError(f"pass read {result['samples']} of {len(spec['order'])} samples")
    return result


def raw_pass(raw_binary, env, names, sizes, order, work):
    path = os.path.join(work, "raw-names.txt")
    with open(path, "w") as f:
        for i in order:
            f.write(f"{sizes[i]} {names[i]}\n")
    r = subprocess.run([raw_binary, "--endpoint", f"http://{env.endpoint}", "--bucket", BUCKET,
                        "--names", path, "--concurrency", "32", "--batch", str(BATCH)],
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"workload_raw failed: {r.stderr.strip()}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    return {"seconds": out["seconds"], "samples": out["files"], "bytes": out["bytes"],
            "first_batch_seconds": out["first_batch_seconds"],
            "first_batch_samples": min(BATCH, out["files"])}


def find_raw_binary():
    subprocess.run(["cargo", "bench", "--bench", "workload_raw", "--no-run"], cwd=REPO,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    found = [p for p in glob.glob(os.path.join(REPO, "target/release/deps/workload_raw-*"))
             if os.access(p, os.X_OK) and not p.endswith(".d")]
    if not found:
        raise RuntimeError("benches/workload_raw.rs did not build")
    return max(found, key=os.path.getmtime)


def per_sample_ms(results, field):
    """Median over the passes of CPU seconds `field` per sample, in ms; None if unmeasured."""
    if not all(field in r for r in results):
        return None
    return statistics.median(1000 * r[field] / r["samples"] for r in results)


def median_row(results):
    secs = [r["seconds"] for r in results]
    med = sorted(results, key=lambda r: r["seconds"])[len(results) // 2]
    return {
        "samples_per_s": med["samples"] / med["seconds"],
        "mb_per_s": med["bytes"] / 1e6 / med["seconds"],
        "first_batch_s": statistics.median(r["first_batch_seconds"] for r in results),
        "after_first_samples_per_s": statistics.median(
            (r["samples"] - r["first_batch_samples"])
            / max(r["seconds"] - r["first_batch_seconds"], 1e-9) for r in results),
        "idle_pct": statistics.median(r["idle_pct"] for r in results)
        if all("idle_pct" in r for r in results) else None,
        "service_cpu_ms_per_sample": per_sample_ms(results, "service_cpu_s"),
        "daemon_cpu_ms_per_sample": per_sample_ms(results, "daemon_cpu_s"),
        "busy_cpu_ms_per_sample": per_sample_ms(results, "busy_cpu_s"),
        "seconds": secs,
        "min_seconds": min(secs),
        "max_seconds": max(secs),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sample, one run")
    ap.add_argument("--sample", type=int, help="files read per pass (default 5000, quick 200)")
    ap.add_argument("--runs", type=int, help="runs of every row (default 3, quick 1)")
    ap.add_argument("--rows", type=lambda v: set(v.split(",")), default=set(ROWS),
                    help=f"rows to run, comma-separated, of {','.join(ROWS)} (default all)")
    ap.add_argument("--latencies", type=lambda v: [int(x) * 1000 for x in v.split(",")],
                    default=[0, 1000, 5000], help="emulator latencies in ms (default 0,1,5)")
    ap.add_argument("--binary", help="a built rapidfs to use instead of building one "
                    "(the raw row still needs cargo)")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")],
                    default=[0, 2, 4], help="DataLoader worker counts (default 0,2,4)")
    ap.add_argument("--train", metavar="MODEL",
                    help="also train torchvision's MODEL (e.g. resnet50) on every batch, on the "
                    "GPU when there is one, and add the row 'train, no reading'")
    ap.add_argument("--pass", dest="pass_spec", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pass_spec:
        with open(args.pass_spec) as f:
            print(json.dumps(run_pass(json.load(f))))
        return

    python = sys.executable
    try:
        import torch  # noqa: F401
        if "google" in args.rows:  # only its row needs Google's client
            import google.cloud.storage  # noqa: F401
    except ImportError:
        python = os.environ.get("RAPIDFS_PYTHON") or os.path.expanduser(
            "~/.cache/rapidfs/venv/bin/python")
        if not os.path.exists(python) or os.environ.get("RAPIDFS_WORKLOAD_REEXEC"):
            sys.exit("workload: needs a Python with torch and google-cloud-storage[grpc] "
                     "(run tests/setup.sh, or set RAPIDFS_PYTHON)")
        os.environ["RAPIDFS_WORKLOAD_REEXEC"] = "1"
        os.execv(python, [python, os.path.abspath(__file__), *sys.argv[1:]])
    if os.geteuid() != 0:
        sys.exit("workload: needs root (drop_caches, mounts)")
    sample = args.sample or (200 if args.quick else DEFAULT_SAMPLE)
    runs = args.runs or (1 if args.quick else 3)
    if not 0 < sample <= FILES:
        sys.exit(f"workload: --sample must be 1..{FILES}")
    if not args.rows <= set(ROWS):
        sys.exit(f"workload: --rows takes some of {','.join(ROWS)}")
    rows, lats, workers = args.rows, args.latencies, args.workers

    if args.binary:
        binary = os.path.abspath(args.binary)
        if not os.access(binary, os.X_OK):
            sys.exit(f"workload: no rapidfs binary at {binary}")
    else:
        log("building rapidfs (release)")
        subprocess.run(["cargo", "build", "--release", "--bin", "rapidfs"], cwd=REPO,
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        binary = os.path.join(REPO, "target/release/rapidfs")
    raw_binary = find_raw_binary() if "raw" in rows else None
    sizes = sizes_of_dataset()
    make_data(sizes)
    names = [rel_name(i) for i in range(FILES)]
    order = random.Random(SEED + 1).sample(range(FILES), sample)
    sample_bytes = sum(sizes[i] for i in order)
    local_root = os.path.join(DATA, BUCKET)
    budget_mb = max(16, sample_bytes // MiB // 4)

    work = tempfile.mkdtemp(prefix="rapidfs-workload-")
    env = Env(binary, work)
    results = {}  # row key -> [pass results]
    extra = {}

    def add(key, res):
        results.setdefault(key, []).append(res)
        log(f"{key}: {res['samples'] / res['seconds']:.0f} samples/s, first batch "
            f"{res['first_batch_seconds']:.3f} s")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for run in range(runs):
            log(f"run {run + 1} of {runs}")
            if args.train:
                add(("train, no reading", 0, 0), child_pass(python, {
                    "kind": "held", "order": order, "workers": 0}, work, args.train))
            for w in workers if "local" in rows else ():
                paths = [os.path.join(local_root, n) for n in names]
                drop_caches()
                add(("local cold", 0, w), child_pass(python, {
                    "kind": "files", "paths": paths, "order": order, "workers": w}, work, args.train))
                add(("local warm", 0, w), child_pass(python, {
                    "kind": "files", "paths": paths, "order": order, "workers": w}, work, args.train))
            for w in workers if "passthrough" in rows else ():
                mnt = env.mount_passthrough(local_root)
                drop_caches()
                pid = env.mounts[mnt]
                cpu0 = cpu_seconds(pid)
                res = child_pass(python, {
                    "kind": "files", "paths": [os.path.join(mnt, n) for n in names],
                    "order": order, "workers": w}, work, args.train)
                res["service_cpu_s"] = cpu_seconds(pid) - cpu0
                add(("fuse passthrough cold", 0, w), res)
                env.unmount(mnt)
            for lat in lats:
                env.start_emulator(lat)
                for w in workers:
                    for kind, name in RAPIDFS_ROWS.items():
                        helper = kind == "helper"
                        if helper and not ((lat == 0 and w == 4) or (lat == 5000 and w >= 2)):
                            continue
                        if kind not in rows:
                            continue
                        mnt = env.mount(read_only=kind == "readonly")
                        drop_caches()
                        paths = [os.path.join(mnt, n) for n in names]
                        key = (name, lat, w)
                        pids = (env.mounts[mnt], env.emulator.pid)
                        cpu0, daemon0 = cpu_seconds(*pids), cpu_seconds(pids[0])
                        res = child_pass(python, {
                            "kind": "files", "paths": paths, "order": order, "workers": w,
                            "helper": helper, "mountpoint": mnt}, work, args.train)
                        res["service_cpu_s"] = cpu_seconds(*pids) - cpu0
                        res["daemon_cpu_s"] = cpu_seconds(pids[0]) - daemon0
                        add(key, res)
                        env.unmount(mnt)
                    if "google" in rows:
                        cpu0 = cpu_seconds(env.emulator.pid)
                        res = child_pass(python, {
                            "kind": "gcs", "endpoint": env.endpoint, "names": names,
                            "order": order, "workers": w}, work, args.train)
                        res["service_cpu_s"] = cpu_seconds(env.emulator.pid) - cpu0
                        add(("google client", lat, w), res)
                if "raw" in rows:
                    add(("raw rust", lat, 1),
                        raw_pass(raw_binary, env, names, sizes, order, work))
                if lat == 5000 and "budget" in rows:
                    mnt = env.mount(memory_mb=budget_mb)
                    drop_caches()
                    before = env.stats()
                    paths = [os.path.join(mnt, n) for n in names]
                    res = child_pass(python, {
                        "kind": "files", "paths": paths, "order": order, "workers": 2,
                        "helper": True, "mountpoint": mnt}, work, args.train)
                    after = env.stats()
                    prefetch = daemon_stats(mnt)
                    pid = env.mounts.get(mnt)
                    rss = peak_rss_mib(pid) if pid else None
                    env.unmount(mnt)
                    fetched = after["bytes_sent"] - before["bytes_sent"]
                    add(("4x budget, rapidfs+helper", lat, 2), res)
                    extra.setdefault("four_x", []).append({
                        "budget_mb": budget_mb, "sample_bytes": sample_bytes,
                        "bytes_fetched": fetched, "fetched_ratio": fetched / sample_bytes,
                        "peak_rss_mib": rss, "daemon_stats": prefetch})
            env.stop_emulator()
    finally:
        env.close()
        shutil.rmtree(work, ignore_errors=True)

    report(results, extra, sample, sample_bytes, runs, budget_mb, binary, args.train)


def daemon_stats(mnt):
    """The mount's control-socket `stats` (what prefetch did), to explain bytes fetched twice."""
    sys.path.insert(0, os.path.join(REPO, "python"))
    from rapidfs_sampler import socket_path
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(socket_path(mnt))
        s.sendall(b'{"op":"stats"}\n')
        return json.loads(s.makefile("rb").readline())


def daemon_budget(rows, cores):
    """What the 0.8x-local-cold target leaves the daemon: at that rate the machine has at most
    `cores / rate` CPU per sample; the DataLoader side (busy CPU minus what serves the bytes) and
    the emulator take their measured shares of it first. None when a needed row is missing."""
    local, fs = rows.get(("local cold", 0, 4)), rows.get(("rapidfs", 0, 4))
    if not local or not fs or fs["busy_cpu_ms_per_sample"] is None \
            or fs["daemon_cpu_ms_per_sample"] is None:
        return None
    machine = 1000 * cores / (0.8 * local["samples_per_s"])
    loader = fs["busy_cpu_ms_per_sample"] - fs["service_cpu_ms_per_sample"]
    emulator = fs["service_cpu_ms_per_sample"] - fs["daemon_cpu_ms_per_sample"]
    bindfs = rows.get(("fuse passthrough cold", 0, 4))
    at_idle = machine * (1 - fs["idle_pct"] / 100)
    return {"machine": machine, "loader": loader, "emulator": emulator,
            "daemon_allowed": machine - loader - emulator,
            "rapidfs_idle_pct": fs["idle_pct"],
            "daemon_allowed_at_rapidfs_idle": at_idle - loader - emulator,
            "daemon": fs["daemon_cpu_ms_per_sample"],
            "passthrough": bindfs["service_cpu_ms_per_sample"] if bindfs else None}


def train_device():
    """The device --train runs on, in words."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU, no GPU"


def report(results, extra, sample, sample_bytes, runs, budget_mb, binary, train):
    rows = {k: median_row(v) for k, v in results.items()}
    cores = os.cpu_count()
    kernel = platform.release()
    print(f"\nworkload benchmark: DataLoader, batch {BATCH}, {FILES} files "
          f"(16 KiB..1 MiB, median ~110 KiB), each pass reads the same shuffled sample of "
          f"{sample} files ({sample_bytes / MiB:.0f} MiB); median of {runs} run(s); "
          f"{cores} cores shared by emulator, daemon and DataLoader; kernel {kernel}"
          + (f"; every batch trains {train} ({train_device()})" if train else ""))
    print(f"{'row':<28} {'latency':>8} {'workers':>7} {'samples/s':>10} {'MB/s':>8} "
          f"{'1st batch s':>11} {'after 1st/s':>11} {'idle %':>6} {'svc cpu ms':>10} {'busy cpu ms':>11}")
    for (name, lat, w), r in rows.items():
        lat_s = "-" if name.startswith(("local", "fuse", "train")) else f"{lat / 1000:g} ms"
        w_s = "1 proc" if name == "raw rust" else str(w)
        svc = r["service_cpu_ms_per_sample"]
        svc_s = "-" if svc is None else f"{svc:.2f}"
        idle_s = "-" if r["idle_pct"] is None else f"{r['idle_pct']:.0f}"
        busy = r["busy_cpu_ms_per_sample"]
        busy_s = "-" if busy is None else f"{busy:.2f}"
        print(f"{name:<28} {lat_s:>8} {w_s:>7} {r['samples_per_s']:>10.0f} "
              f"{r['mb_per_s']:>8.0f} {r['first_batch_s']:>11.3f} "
              f"{r['after_first_samples_per_s']:>11.0f} {idle_s:>6} {svc_s:>10} "
              f"{busy_s:>11}")

    def sps(name, lat, w):
        r = rows.get((name, lat, w))
        return r["samples_per_s"] if r else None

    def ratio(a, b):
        return a / b if a and b else None

    targets = [
        ("rapidfs 4w 0 ms / local cold 4w", ratio(sps("rapidfs", 0, 4), sps("local cold", 0, 4)), 0.8),
        ("rapidfs read-only 4w 0 ms / local cold 4w",
         ratio(sps("rapidfs read-only", 0, 4), sps("local cold", 0, 4)), 0.8),
        ("rapidfs 4w 0 ms / google client 4w 0 ms",
         ratio(sps("rapidfs", 0, 4), sps("google client", 0, 4)), 3.0),
        ("rapidfs+helper 4w: 5 ms / 0 ms",
         ratio(sps("rapidfs+helper", 5000, 4), sps("rapidfs+helper", 0, 4)), 0.7),
        ("5 ms 2w: rapidfs+helper / rapidfs",
         ratio(sps("rapidfs+helper", 5000, 2), sps("rapidfs", 5000, 2)), 3.0),
    ]
    print("\ntargets (ratios within this run):")
    for what, val, target in targets:
        shown = "not available" if val is None else f"{val:.2f}"
        verdict = "" if val is None else ("met" if val >= target else "NOT met")
        print(f"  {what:<44} {shown:>13}  (target >= {target:g}) {verdict}")
    others = [
        ("rapidfs 4w 0 ms / raw rust 0 ms", ratio(sps("rapidfs", 0, 4), sps("raw rust", 0, 1))),
        ("rapidfs 4w 0 ms / local warm 4w", ratio(sps("rapidfs", 0, 4), sps("local warm", 0, 4))),
        ("fuse passthrough cold 4w / local cold 4w",
         ratio(sps("fuse passthrough cold", 0, 4), sps("local cold", 0, 4))),
        ("rapidfs 4w 0 ms / fuse passthrough cold 4w",
         ratio(sps("rapidfs", 0, 4), sps("fuse passthrough cold", 0, 4))),
        ("rapidfs 4w 0 ms / train, no reading",
         ratio(sps("rapidfs", 0, 4), sps("train, no reading", 0, 0))),
        ("local cold 4w / train, no reading",
         ratio(sps("local cold", 0, 4), sps("train, no reading", 0, 0))),
    ]
    for what, val in others:
        shown = "not available" if val is None else f"{val:.2f}"
        print(f"  {what:<44} {shown:>13}")
    budget = daemon_budget(rows, cores)
    if budget:
        print("  CPU per sample at 0.8x local cold, 4w 0 ms (ms; the whole machine busy, no idle):"
              f"\n    machine {budget['machine']:.2f} - DataLoader side {budget['loader']:.2f}"
              f" - emulator {budget['emulator']:.2f} = {budget['daemon_allowed']:.2f} left for"
              f" the daemon ({budget['daemon_allowed_at_rapidfs_idle']:.2f} if the machine stays"
              f" {budget['rapidfs_idle_pct']:.0f}% idle as in the rapidfs pass), which spent"
              f" {budget['daemon']:.2f}"
              + ("" if budget["passthrough"] is None
                 else f"; bindfs spent {budget['passthrough']:.2f} with no network behind it"))
    four = extra.get("four_x", [])
    if four:
        fr = statistics.median(x["fetched_ratio"] for x in four)
        rss = [x["peak_rss_mib"] for x in four if x["peak_rss_mib"] is not None]
        peak = max(rss) if rss else None
        print(f"  4x budget: bytes fetched / bytes read       {fr:>13.3f}  (target <= 1.1) "
              f"{'met' if fr <= 1.1 else 'NOT met'}")
        if peak is not None:
            print(f"  4x budget: daemon peak RSS {peak:.0f} MiB vs budget {budget_mb} + 64 MiB"
                  f"  {'met' if peak <= budget_mb + 64 else 'NOT met'}")
    out = {
        "bench": "workload",
        "cores": cores,
        "kernel": kernel,
        "loadavg": os.getloadavg(),
        "binary": binary,
        "config": {"files": FILES, "classes": CLASSES, "batch": BATCH, "sample": sample,
                   "train": train, "image": IMAGE if train else None,
                   "sample_bytes": sample_bytes, "runs": runs, "budget_4x_mb": budget_mb},
        "rows": [{"row": k[0], "latency_us": k[1], "workers": k[2], **v, "passes": results[k]}
                 for k, v in rows.items()],
        "targets": [{"what": w, "value": v, "target": t} for w, v, t in targets],
        "four_x_budget": four,
        "daemon_cpu_budget_at_target": budget,
    }
    d = os.path.join(REPO, "target", "bench-results")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "workload.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {os.path.join(d, 'workload.json')}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:
        sys.exit(f"workload: interrupted ({e})")
    except RuntimeError as e:
        sys.exit(f"workload: {e}")
