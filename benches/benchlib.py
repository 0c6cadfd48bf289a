"""Helpers the benchmark scripts share: progress lines, process CPU from /proc, mount checks,
and the median [min-max] summaries and plain-text tables their reports are made of."""
import mmap
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time


def log(msg):
    """A progress line on stderr with the time."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def binary_version(binary):
    """What `BINARY --version` says, or None."""
    r = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return r.stdout.strip() or None


def cpu_seconds(pid):
    """User + system CPU time of a process (all its threads), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def context_switches(pid):
    """{thread id: voluntary + involuntary context switches so far} of a process's live
    threads (a thread that vanishes while they are read is left out), or None once the
    process is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    counts = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                counts[tid] = sum(int(line.split()[1]) for line in f
                                  if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
        except (OSError, IndexError, ValueError):
            pass
    return counts


def switches_between(start, end):
    """Context switches between two `context_switches` readings: each thread alive at the
    end counts from its start reading, or from zero if it started since (a thread that
    exited in between takes its switches with it)."""
    return sum(n - start.get(tid, 0) for tid, n in end.items())


def is_mounted(path):
    """Whether `path` is a mountpoint now."""
    real = os.path.realpath(path)
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == real for line in f)


def summary(values):
    """Median, min and max of one figure over the runs, with every run's value."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": values}


def fmt(x):
    """A figure for a table: whole numbers from 100 on, three significant digits below."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def cell(e):
    """A table cell: the median, and [min-max] when there were several runs."""
    if e is None:
        return "-"
    if len(e["runs"]) == 1:
        return fmt(e["median"])
    return f"{fmt(e['median'])} [{fmt(e['min'])}-{fmt(e['max'])}]"


def columns(head, rows):
    """Rows of cells as left-aligned columns under a header and a rule."""
    rows = [r + [""] * (len(head) - len(r)) for r in rows]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [head, ["-" * w for w in widths], *rows]]


def find_pid(words):
    """The pid of the live process whose argv contains every one of `words` (as pgrep -f on
    the mountpoint would find it, but exact)."""
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


def machine():
    """Cores, kernel, Python, CPU model and memory of this machine (and what fresh memory
    costs on it), for the report."""
    info = {"cores": os.cpu_count(), "kernel": platform.release(),
            "python": f"{sys.executable} {platform.python_version()}"}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
            info["cpu"] = m.group(1) if m else None
        with open("/proc/meminfo") as f:
            info["mem_total_kb"] = int(f.readline().split()[1])
    except OSError:
        pass
    info["fresh_memory"] = fresh_memory()
    return info


def fresh_memory(mib=256):
    """What memory taken fresh costs on this machine: {"first_touch_gb_s": the rate of a first
    write to `mib` MiB of new anonymous memory, "free_page_reporting": whether the kernel
    hands freed memory back to a virtual machine's host}.

    With free page reporting the host takes back what the guest frees and backs it again only
    when it is next touched: on our 2-core Firecracker machines such a first touch ran at
    0.39-0.50 GB/s against 6.6-8 GB/s for memory touched moments before. Every pass that takes
    fresh pages pays it as its own CPU: the memory emulator, which keeps every object written
    in new memory, 0.13-0.15 ms of CPU per 64 KiB file when its pages were still backed and
    0.31-0.42 ms when they were not. Its figures are the machine's, not rapidfs's."""
    size = mib << 20
    chunk = 16 << 20
    zeros = bytes(chunk)
    t0 = time.perf_counter()
    with mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) as m:
        for off in range(0, size, chunk):
            m[off:off + chunk] = zeros
    secs = time.perf_counter() - t0
    order = "/sys/module/page_reporting/parameters/page_reporting_order"
    return {"first_touch_gb_s": round(size / secs / 1e9, 2),
            "free_page_reporting": os.path.exists(order)}


def back_free_memory(directory, mib):
    """Has the host back `mib` MiB of this machine's free memory again, so that the pass that
    follows takes memory the way it would on a machine that keeps its memory: writes that
    many MiB into a file under `directory` (page cache, never synced) and deletes it. The
    freed pages are the first the kernel hands out next, before the host takes them back.

    Without it, a plain loop of 2 MiB pwrites into a local file ran at 0.35-0.84 GiB/s (1.2 s
    of CPU for 512 MiB, nearly all in the copy into fresh page-cache pages) as often as at
    2.3 GiB/s (0.1 s), whichever process took the fresh pages: the local writer, or the
    directory emulator behind a mount. With it, six passes in a row all ran at 1.8-2.3 GiB/s.
    Memory touched without a page cache (anonymous memory, then freed) did not do it.

    Off by default in the benchmarks: in whole runs it did not make the figures steadier, and
    1,000 small files through the memory emulator ran 5-12% slower after it (2,491-2,727
    against 2,841-2,871 files/s, two runs of three passes each way), for a reason not found;
    the figures of earlier notes were taken without it."""
    if mib <= 0:
        return
    path = os.path.join(directory, f".back-free-memory-{os.getpid()}")
    chunk = bytes(4 << 20)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(max(1, mib // 4)):
            os.write(fd, chunk)
    finally:
        os.close(fd)
        os.unlink(path)


def fresh_memory_line(m):
    """One line of a report's header on `fresh_memory`'s figures."""
    reporting = ("the kernel hands freed memory back to the host, so new pages cost a host "
                 "fault (the memory emulator's objects pay it)" if m["free_page_reporting"]
                 else "no free page reporting")
    return f"fresh memory: first touch {m['first_touch_gb_s']} GB/s; {reporting}"


def git_head(repo):
    """The commit checked out in `repo` and its subject, or None."""
    r = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%H %s"],
                       capture_output=True, text=True)
    return r.stdout.strip() or None


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


def stop_process(proc, grace=10):
    """Terminates a child process if it still runs, and kills it after `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
