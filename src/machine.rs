//! What the machine (or the container) gives the daemon: its memory limit and its cores, for
//! the defaults that scale with them. A container's limits count, not the host's: a sidecar
//! limited to 512 MiB on a 1 TiB node must size its budget from the 512 MiB.

use std::path::{Path, PathBuf};

/// The memory the daemon may use: the smallest of the machine's total memory and every
/// cgroup limit above this process (v1 or v2), in bytes; `None` when nothing can be read.
pub fn memory_limit_bytes() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| meminfo_total(&m));
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limits = cgroup_limit_files(&cgroup, Path::new("/sys/fs/cgroup"))
        .into_iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|text| text.trim().parse::<u64>().ok());
    total.into_iter().chain(limits).min()
}

/// Most worker threads of a serving runtime.
const MAX_WORKERS: usize = 8;

/// What a serving runtime serves, which sets its fewest workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serving {
    /// One mount's daemon. Below 4 cores it has no workers: its FUSE thread drives a
    /// current-thread runtime (`fuse::Driver::FuseThread`), so that a request that waits on
    /// the network crosses no threads. From 4 cores at least 2 workers, because a worker
    /// copies each reply into the page cache, and with one, a safetensors load was 6-15%
    /// slower and four readers of big files slower still (the server on other cores, as a
    /// real one is, only widens that).
    Mount,
    /// The GKE sidecar, which serves several mounts from one runtime: their FUSE threads
    /// cannot all drive it, so it has workers on every machine, one below 4 cores. On 2
    /// cores, one worker against two in the same runs (2026-11-27): a 4 KiB random read's
    /// p50 89-96 against 101-117 us with 3.2 against 7.6 context switches, 8-16% less CPU
    /// per small file read and 10-16% less per GiB read, one reader of a big file 2-8%
    /// slower.
    Volumes,
    /// The emulator, which copies nothing into the kernel: one worker serves it on a small
    /// machine. Measured on 2 cores against two: 15-20% less emulator CPU per small file
    /// read, a third less per 4 KiB random read, the same speed on a 1 GiB read.
    Emulator,
}

/// Cores from which the daemon has workers (2 of them at least) rather than its FUSE thread
/// driving the runtime.
const MOUNT_TWO_WORKERS_FROM: usize = 4;

/// Worker threads of a multi-threaded serving runtime on `cores` cores: a quarter of them,
/// up to 8, from 2 for a daemon on 4 cores or more and from 1 otherwise. Tokio's default of
/// one per core costs CPU on every request: each hand-off between tasks (the FUSE thread to
/// a worker, a worker to the connection task and back) wakes parked workers to look for
/// work, and the more workers, the more of them wake for nothing (a worker woken from
/// outside the runtime wakes a second one to go on searching, which finds nothing: about
/// one futile wake-up per small file read or 4 KiB random read). On 16 cores, 4 workers
/// against 16 spent 8-17% less of the daemon's CPU on every read workload at the same speed
/// (small files: 0.19 against 0.21 ms and 8.9 against 9.5 context switches per file).
pub fn runtime_workers(cores: usize, serving: Serving) -> usize {
    let fewest = match serving {
        Serving::Mount | Serving::Volumes if cores >= MOUNT_TWO_WORKERS_FROM => 2,
        Serving::Mount | Serving::Volumes | Serving::Emulator => 1,
    };
    (cores / 4).clamp(fewest, MAX_WORKERS)
}

/// Whether a runtime serving `serving` on `cores` cores is a current-thread one, driven by
/// the mount's FUSE thread.
pub fn fuse_thread_drives(cores: usize, serving: Serving) -> bool {
    serving == Serving::Mount && cores < MOUNT_TWO_WORKERS_FROM
}

/// The runtime for `serving` on this process's cores (as its CPU affinity and cgroup quota
/// allow), named `name`: a current-thread one where `fuse_thread_drives`, else
/// multi-threaded with `runtime_workers` workers. `TOKIO_WORKER_THREADS`, when set, always
/// gives a multi-threaded runtime of that many workers, as it does for any tokio program.
pub fn serving_runtime(name: &str, serving: Serving) -> std::io::Result<tokio::runtime::Runtime> {
    let workers_given = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !workers_given && fuse_thread_drives(cores, serving) {
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if !workers_given {
        builder.worker_threads(runtime_workers(cores, serving));
    }
    builder.enable_all().thread_name(name).build()
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn meminfo_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The files that may hold a memory limit of this process under `root`: the mounted
/// hierarchy's own (a container sees its cgroup as the root) and those of the process's
/// cgroup path and every parent (a host sees the whole tree). "max" or an absent file is
/// no limit.
fn cgroup_limit_files(proc_cgroup: &str, root: &Path) -> Vec<PathBuf> {
    let mut files = vec![
        root.join("memory.max"),
        root.join("memory/memory.limit_in_bytes"),
    ];
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (base, file) = match (id, controllers) {
            ("0", "") => (root.to_path_buf(), "memory.max"),
            (_, c) if c.split(',').any(|c| c == "memory") => {
                (root.join("memory"), "memory.limit_in_bytes")
            }
            _ => continue,
        };
        let mut dir = Path::new(path.trim_start_matches('/'));
        loop {
            files.push(base.join(dir).join(file));
            match dir.parent() {
                Some(p) => dir = p,
                None => break,
            }
        }
    }
    files
}

/// The memory budget when `cache.memory_mb` is 0 (automatic): an eighth of the memory the
/// daemon may use, at least 64 MiB and at most 2 GiB; 1 GiB when nothing can be read.
pub fn default_budget_mb(limit_bytes: Option<u64>) -> u64 {
    match limit_bytes {
        Some(b) => ((b / 8) >> 20).clamp(64, 2048),
        None => 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemon_has_a_quarter_of_the_cores_from_2_to_8_workers_from_4_cores() {
        for serving in [Serving::Mount, Serving::Volumes] {
            assert_eq!(runtime_workers(4, serving), 2);
            assert_eq!(runtime_workers(8, serving), 2);
            assert_eq!(runtime_workers(16, serving), 4);
            assert_eq!(runtime_workers(24, serving), 6);
            assert_eq!(runtime_workers(224, serving), 8);
        }
        assert_eq!(runtime_workers(2, Serving::Volumes), 1);
    }

    #[test]
    fn below_4_cores_a_mount_s_fuse_thread_drives_its_runtime() {
        assert!(fuse_thread_drives(1, Serving::Mount));
        assert!(fuse_thread_drives(3, Serving::Mount));
        assert!(!fuse_thread_drives(4, Serving::Mount));
        assert!(!fuse_thread_drives(2, Serving::Volumes));
        assert!(!fuse_thread_drives(2, Serving::Emulator));
    }

    #[test]
    fn the_emulator_runs_on_one_worker_up_to_7_cores() {
        assert_eq!(runtime_workers(1, Serving::Emulator), 1);
        assert_eq!(runtime_workers(2, Serving::Emulator), 1);
        assert_eq!(runtime_workers(7, Serving::Emulator), 1);
        assert_eq!(runtime_workers(8, Serving::Emulator), 2);
        assert_eq!(runtime_workers(16, Serving::Emulator), 4);
    }

    #[test]
    fn the_budget_is_an_eighth_of_the_limit_within_bounds() {
        assert_eq!(default_budget_mb(Some(512 << 20)), 64);
        assert_eq!(default_budget_mb(Some(8 << 30)), 1024);
        assert_eq!(default_budget_mb(Some(1 << 40)), 2048);
        assert_eq!(default_budget_mb(None), 1024);
    }

    #[test]
    fn limit_files_cover_v1_and_v2_and_every_parent() {
        let cg = "4:memory:/kubepods/pod1/c2\n0::/kubepods/pod1/c2\n1:cpu:/x\n";
        let files = cgroup_limit_files(cg, Path::new("/cg"));
        for want in [
            "/cg/memory.max",
            "/cg/memory/memory.limit_in_bytes",
            "/cg/memory/kubepods/pod1/c2/memory.limit_in_bytes",
            "/cg/memory/kubepods/memory.limit_in_bytes",
            "/cg/kubepods/pod1/c2/memory.max",
            "/cg/kubepods/pod1/memory.max",
        ] {
            assert!(files.contains(&PathBuf::from(want)), "{want} in {files:?}");
        }
        assert!(
            !files.iter().any(|f| f.starts_with("/cg/x")),
            "cpu is not memory"
        );
    }

    #[test]
    fn meminfo_total_is_in_bytes() {
        let m = "MemTotal:       24683656 kB\nMemFree: 1 kB\n";
        assert_eq!(meminfo_total(m), Some(24683656 * 1024));
    }

    #[test]
    fn this_machine_has_a_limit() {
        let limit = memory_limit_bytes().expect("/proc/meminfo is readable");
        assert!(limit > 64 << 20);
    }
}
