//! Metadata at scale (`cargo bench --bench metadata_scale`): a bucket of 1,000,000 objects in
//! 1,000 directories of the in-process memory emulator, walked through a real mount of the
//! `rapidfs` daemon (its own process, so its memory is its own) with `find` and Python's
//! `os.walk`. Reports, in one run:
//! - the walk time cold (fresh mount), warm (the same mount again), and on a fresh mount
//!   after its metadata warm-up (`--prefetch-metadata`) finished (one mount per walk), with
//!   the CPU the daemon and the emulator (this process) spent in each walk, per object;
//! - the daemon's resident memory after mounting, at its peak, after the walks, after a
//!   `find` that stats every file (the kernel then holds an inode per file), and after the
//!   kernel dropped its dentry and inode caches (`echo 2 > /proc/sys/vm/drop_caches`, which
//!   makes it forget every inode), and the growth per object.
//!
//! Targets (issue 21): growth at most 200 bytes per object or stopping at the metadata cap;
//! resident memory below the cap after the kernel drops its caches; the walk after the
//! warm-up at least 3x faster than cold.
//!
//! Every emulator call answers after `--latency-us` (5000: a real ListObjects takes 5-30 ms;
//! on loopback listing would cost nothing and hide what the warm-up saves).
//!
//! Needs root (mount, drop_caches) and `find` and `python3`. Flags (after `--`):
//! `--objects N` (1000000), `--dirs N` (1000), `--latency-us N` (5000), `--binary PATH` (the daemon; default the one
//! cargo built), `--extra "ARGS"` (more mount flags, split on spaces, for every mount), `--skip-warmup`
//! (for a daemon without `--prefetch-metadata`), `--cap-mib N` (256: the `fs.metadata_cache_mb`
//! the daemon runs with, for the targets).
//! Prints a table, a MET or MISSED line per target, and writes
//! target/bench-results/metadata_scale.json.

use anyhow::{bail, Context};
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BUCKET: &str = "scale";

struct Args {
    objects: usize,
    dirs: usize,
    binary: PathBuf,
    extra: Vec<String>,
    warmup: bool,
    latency_us: u64,
    cap_mib: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        objects: 1_000_000,
        dirs: 1000,
        binary: PathBuf::from(env!("CARGO_BIN_EXE_rapidfs")),
        extra: Vec::new(),
        warmup: true,
        latency_us: 5_000,
        cap_mib: 256,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().with_context(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--objects" => a.objects = value("--objects")?.parse()?,
            "--dirs" => a.dirs = value("--dirs")?.parse::<usize>()?.max(1),
            "--binary" => a.binary = value("--binary")?.into(),
            "--skip-warmup" => a.warmup = false,
            "--latency-us" => a.latency_us = value("--latency-us")?.parse()?,
            "--cap-mib" => a.cap_mib = value("--cap-mib")?.parse()?,
            "--extra" => {
                a.extra = value("--extra")?
                    .split_whitespace()
                    .map(str::to_string)
                    .collect()
            }
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => {
                bail!("unknown flag {other:?} (see the doc comment of benches/metadata_scale.rs)")
            }
        }
    }
    Ok(a)
}

/// A mounted daemon, its log file, and its mountpoint.
struct Mount {
    child: Child,
    mnt: PathBuf,
    log: PathBuf,
}

impl Mount {
    fn start(
        a: &Args,
        endpoint: &str,
        dir: &Path,
        name: &str,
        more: &[&str],
    ) -> anyhow::Result<Mount> {
        let mnt = dir.join(name);
        std::fs::create_dir_all(&mnt)?;
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(&a.binary)
            .args(["mount", BUCKET, "--foreground", "--endpoint", endpoint])
            .arg(&mnt)
            .args(&a.extra)
            .args(more)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("running {}", a.binary.display()))?;
        let m = Mount { child, mnt, log };
        let start = Instant::now();
        while !is_mounted(&m.mnt)? {
            if start.elapsed() > Duration::from_secs(30) {
                bail!("{} did not mount; log: {}", name, m.log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }

    fn status(&self, field: &str) -> anyhow::Result<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let line = s
            .lines()
            .find(|l| l.starts_with(field))
            .with_context(|| format!("{field} in /proc/PID/status"))?;
        let kb: u64 = line
            .split_whitespace()
            .nth(1)
            .context("a number")?
            .parse()?;
        Ok(kb * 1024)
    }

    /// CPU seconds the daemon has used so far.
    fn cpu(&self) -> anyhow::Result<f64> {
        cpu_secs(&format!("/proc/{}/stat", self.child.id()))
    }

    fn rss(&self) -> anyhow::Result<u64> {
        self.status("VmRSS:")
    }

    fn peak_rss(&self) -> anyhow::Result<u64> {
        self.status("VmHWM:")
    }

    /// Waits for the log line of a finished warm-up.
    fn wait_log(&self, needle: &str, limit: Duration) -> anyhow::Result<f64> {
        let t0 = Instant::now();
        loop {
            let mut text = String::new();
            std::fs::File::open(&self.log)?.read_to_string(&mut text)?;
            if text.contains(needle) {
                return Ok(t0.elapsed().as_secs_f64());
            }
            if t0.elapsed() > limit {
                bail!("no {needle:?} in {} after {limit:?}", self.log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(mut self) -> anyhow::Result<()> {
        let st = Command::new("umount").arg(&self.mnt).status()?;
        if !st.success() {
            Command::new("umount").arg("-l").arg(&self.mnt).status()?;
        }
        self.child.wait()?;
        Ok(())
    }
}

fn is_mounted(path: &Path) -> anyhow::Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let p = path.to_string_lossy();
    Ok(info
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref())))
}

/// utime + stime of a `/proc/.../stat` file, in seconds.
fn cpu_secs(stat: &str) -> anyhow::Result<f64> {
    let s = std::fs::read_to_string(stat)?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let after = s.rsplit_once(')').context("a stat line")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Ok(ticks as f64 / hz as f64)
}

/// One walk: its seconds, the lines it printed, and the CPU seconds the daemon and the
/// emulator (this process, which otherwise waits) spent meanwhile.
#[derive(Clone, Copy)]
struct Walk {
    secs: f64,
    lines: usize,
    daemon_cpu: f64,
    server_cpu: f64,
}

impl Walk {
    const NONE: Walk = Walk {
        secs: f64::NAN,
        lines: 0,
        daemon_cpu: f64::NAN,
        server_cpu: f64::NAN,
    };
}

/// Runs a walk command through mount `m`.
fn walk(m: &Mount, cmd: &mut Command) -> anyhow::Result<Walk> {
    let (daemon0, server0) = (m.cpu()?, cpu_secs("/proc/self/stat")?);
    let t0 = Instant::now();
    let out = cmd.stderr(Stdio::inherit()).output()?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    let lines = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    Ok(Walk {
        secs,
        lines,
        daemon_cpu: m.cpu()? - daemon0,
        server_cpu: cpu_secs("/proc/self/stat")? - server0,
    })
}

/// `find MNT | wc -l`: lines are the root, the directories and the files.
fn find(m: &Mount) -> anyhow::Result<Walk> {
    let script = format!("find '{}' | wc -l", m.mnt.display());
    walk(m, Command::new("sh").args(["-c", &script]))
}

/// `find MNT -printf '%s'`: a walk that stats every entry, as `ls -l`, `du` or a first
/// epoch that opens every file, so the kernel holds an inode per file.
fn find_stat(m: &Mount) -> anyhow::Result<Walk> {
    let script = format!("find '{}' -printf '%s\\n' | wc -l", m.mnt.display());
    walk(m, Command::new("sh").args(["-c", &script]))
}

/// `os.walk` counting directories and files the way `find` does.
fn os_walk(m: &Mount) -> anyhow::Result<Walk> {
    let script =
        "import os,sys\nn=0\nfor _,ds,fs in os.walk(sys.argv[1]): n+=len(ds)+len(fs)\nprint(n+1)";
    walk(m, Command::new("python3").args(["-c", script]).arg(&m.mnt))
}

fn drop_kernel_caches() -> anyhow::Result<()> {
    std::fs::write("/proc/sys/vm/drop_caches", "2").context("drop_caches (needs root)")
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() -> anyhow::Result<()> {
    let a = parse_args()?;
    let rt = tokio::runtime::Runtime::new()?;
    let opts = EmulatorOptions {
        memory: true,
        zone: "us-central1-a".to_string(),
        ..Default::default()
    };
    let emu = rt.block_on(Emulator::start(opts, "127.0.0.1:0".parse()?))?;
    emu.create_bucket(BUCKET)?;
    let t0 = Instant::now();
    let per_dir = a.objects.div_ceil(a.dirs);
    let empty = bytes::Bytes::new();
    for i in 0..a.objects {
        let name = format!("dir{:05}/sample_{:08}.jpg", i / per_dir, i);
        emu.put_object(BUCKET, &name, empty.clone())?;
    }
    emu.set_faults(Faults {
        latency_us: a.latency_us,
        ..Faults::default()
    });
    let dirs = a.objects.div_ceil(per_dir);
    let expect = 1 + dirs + a.objects;
    eprintln!(
        "[metadata_scale] {} objects in {dirs} directories put in {:.1} s",
        a.objects,
        t0.elapsed().as_secs_f64()
    );
    let tmp = tempfile::tempdir()?;
    let endpoint = emu.endpoint();
    let check = |what: &str, n: usize| -> anyhow::Result<()> {
        if n != expect {
            bail!("{what} saw {n} entries, expected {expect}");
        }
        Ok(())
    };

    let m = Mount::start(&a, &endpoint, tmp.path(), "cold", &[])?;
    let rss_mounted = m.rss()?;
    let find_cold = find(&m)?;
    check("cold find", find_cold.lines)?;
    let find_warm = find(&m)?;
    check("warm find", find_warm.lines)?;
    let walk_warm = os_walk(&m)?;
    check("warm os.walk", walk_warm.lines)?;
    let rss_walked = m.rss()?;
    let peak = m.peak_rss()?;
    let find_stated = find_stat(&m)?;
    check("find -printf %s", find_stated.lines)?;
    let rss_stated = m.rss()?;
    drop_kernel_caches()?;
    std::thread::sleep(Duration::from_secs(3));
    let rss_dropped = m.rss()?;
    m.stop()?;

    let m = Mount::start(&a, &endpoint, tmp.path(), "walk", &[])?;
    let walk_cold = os_walk(&m)?;
    check("cold os.walk", walk_cold.lines)?;
    m.stop()?;

    let (mut warmup_secs, mut rss_warmed, mut peak_warmup) = (f64::NAN, 0, 0);
    let (mut find_after, mut walk_after) = (Walk::NONE, Walk::NONE);
    if a.warmup {
        // Each walk on a mount of its own: a walk after another finds the kernel's caches warm.
        let warmed = |name: &str| -> anyhow::Result<(Mount, f64)> {
            let m = Mount::start(&a, &endpoint, tmp.path(), name, &["--prefetch-metadata"])?;
            let secs = m.wait_log("metadata warm-up done", Duration::from_secs(600))?;
            Ok((m, secs))
        };
        let (m, secs) = warmed("warmup-find")?;
        warmup_secs = secs;
        rss_warmed = m.rss()?;
        find_after = find(&m)?;
        check("find after warm-up", find_after.lines)?;
        peak_warmup = m.peak_rss()?;
        m.stop()?;
        let (m, _) = warmed("warmup-walk")?;
        walk_after = os_walk(&m)?;
        check("os.walk after warm-up", walk_after.lines)?;
        m.stop()?;
    }

    let per_object = |b: u64| b.saturating_sub(rss_mounted) as f64 / a.objects as f64;
    println!(
        "objects {} in {dirs} directories; daemon {}",
        a.objects,
        a.binary.display()
    );
    let us_per_object = |cpu: f64| cpu * 1e6 / a.objects as f64;
    println!("| walk | seconds | vs cold | daemon CPU us/object | emulator CPU us/object |");
    println!("|---|---|---|---|---|");
    for (what, w, cold) in [
        ("find, cold", find_cold, find_cold),
        ("find, warm", find_warm, find_cold),
        ("find, after warm-up", find_after, find_cold),
        ("find stating every file, warm", find_stated, find_cold),
        ("os.walk, cold", walk_cold, walk_cold),
        ("os.walk, warm", walk_warm, walk_cold),
        ("os.walk, after warm-up", walk_after, walk_cold),
    ] {
        println!(
            "| {what} | {:.2} | {:.1}x faster | {:.2} | {:.2} |",
            w.secs,
            cold.secs / w.secs,
            us_per_object(w.daemon_cpu),
            us_per_object(w.server_cpu)
        );
    }
    println!("warm-up itself: {warmup_secs:.2} s");
    println!("| daemon memory | MiB | bytes per object over mounted |");
    println!("|---|---|---|");
    for (what, b) in [
        ("mounted", rss_mounted),
        ("after the walks", rss_walked),
        ("peak of the walks", peak),
        ("after a find that stats every file", rss_stated),
        ("after drop_caches", rss_dropped),
        ("after warm-up", rss_warmed),
        ("peak with warm-up", peak_warmup),
    ] {
        println!("| {what} | {:.1} | {:.0} |", mib(b), per_object(b));
    }
    let cap = a.cap_mib << 20;
    let verdict = |ok: bool| if ok { "MET   " } else { "MISSED" };
    let peak_growth = peak.max(rss_stated).saturating_sub(rss_mounted);
    println!(
        "{} growth <= 200 bytes per object, or within the cap ({} MiB): {:.0} bytes per object",
        verdict(per_object(peak.max(rss_stated)) <= 200.0 || peak_growth <= cap),
        a.cap_mib,
        per_object(peak.max(rss_stated))
    );
    println!(
        "{} below the cap after drop_caches: {:.1} MiB",
        verdict(rss_dropped < cap),
        mib(rss_dropped)
    );
    for (what, after, cold) in [
        ("find", find_after, find_cold),
        ("os.walk", walk_after, walk_cold),
    ] {
        let times = cold.secs / after.secs;
        match a.warmup {
            true => println!(
                "{} {what} after the warm-up >= 3x faster than cold: {times:.1}x",
                verdict(times >= 3.0)
            ),
            false => println!("n/a    {what} after the warm-up: --skip-warmup"),
        }
    }
    let json = serde_json::json!({
        "objects": a.objects,
        "dirs": dirs,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "binary": a.binary,
        "extra": a.extra,
        "latency_us": a.latency_us,
        "seconds": {
            "find_cold": find_cold.secs, "find_warm": find_warm.secs,
            "find_after_warmup": find_after.secs,
            "walk_cold": walk_cold.secs, "walk_warm": walk_warm.secs,
            "walk_after_warmup": walk_after.secs,
            "warmup": warmup_secs, "find_stat_warm": find_stated.secs,
        },
        "daemon_cpu_seconds": {
            "find_cold": find_cold.daemon_cpu, "find_warm": find_warm.daemon_cpu,
            "find_after_warmup": find_after.daemon_cpu,
            "walk_cold": walk_cold.daemon_cpu, "walk_warm": walk_warm.daemon_cpu,
            "walk_after_warmup": walk_after.daemon_cpu, "find_stat_warm": find_stated.daemon_cpu,
        },
        "emulator_cpu_seconds": {
            "find_cold": find_cold.server_cpu, "find_warm": find_warm.server_cpu,
            "find_after_warmup": find_after.server_cpu,
            "walk_cold": walk_cold.server_cpu, "walk_warm": walk_warm.server_cpu,
            "walk_after_warmup": walk_after.server_cpu, "find_stat_warm": find_stated.server_cpu,
        },
        "rss_bytes": {
            "mounted": rss_mounted, "after_walks": rss_walked, "peak": peak,
            "after_find_stat": rss_stated,
            "after_drop_caches": rss_dropped, "after_warmup": rss_warmed,
            "peak_with_warmup": peak_warmup,
        },
        "bytes_per_object_peak": per_object(peak),
        "bytes_per_object_stated": per_object(rss_stated),
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&out)?;
    std::fs::write(
        out.join("metadata_scale.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    rt.block_on(emu.shutdown());
    Ok(())
}
