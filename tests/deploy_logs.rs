//! The daemon's log at the default level: one line per mount event and per error, none per
//! read. A background mount logs to `--log-file`; hundreds of reads must add no line; a read
//! that fails (every call answered UNAVAILABLE, retries capped at 300 ms) adds its error.

mod mount_support;

use mount_support::{data, Env};
use rapidfs::emulator::Faults;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};

const BUCKET: &str = "logs";

fn read_uncached(path: &Path) -> std::io::Result<usize> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    let n = f.read_to_end(&mut buf)?;
    // SAFETY: advice on a descriptor we own; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(n)
}

fn lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .expect("log file")
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn default_level_logs_mount_events_and_errors_but_no_reads() {
    let env = Env::new(BUCKET);
    for i in 0..50 {
        env.put(BUCKET, &format!("f/{i:02}"), &data(i, 300_000));
    }
    env.put(BUCKET, "big", &data(77, 16 * 1024 * 1024));
    env.put(BUCKET, "later", b"not read before the faults");
    let mnt = tempfile::tempdir().expect("tempdir");
    let work = tempfile::tempdir().expect("tempdir");
    let log = work.path().join("rapidfs.log");
    let cfg = work.path().join("rapidfs.toml");
    std::fs::write(
        &cfg,
        "[gcs]\nretry_deadline_ms = 300\ncall_timeout_ms = 300\n[fs]\nstat_ttl_ms = 0\nnegative_ttl_ms = 0\nlist_ttl_ms = 0\nkernel_entry_ttl_ms = 0\nkernel_attr_ttl_ms = 0\n",
    )
    .expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(mnt.path())
        .args(["--endpoint", &env.emu().endpoint(), "--config"])
        .arg(&cfg)
        .arg("--log-file")
        .arg(&log)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("rapidfs runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let at_mount = lines(&log);
    let mut bytes = 0;
    for round in 0..3 {
        for i in 0..50 {
            bytes += read_uncached(&mnt.path().join(format!("f/{i:02}"))).expect("read");
        }
        bytes += read_uncached(&mnt.path().join("big")).expect("read big");
        eprintln!("round {round}: {bytes} bytes read");
    }
    let after_reads = lines(&log);
    assert_eq!(
        after_reads, at_mount,
        "reads added log lines at the default level"
    );
    assert_eq!(
        at_mount.iter().filter(|l| l.contains("mounted")).count(),
        1,
        "one line says the mount is live: {at_mount:#?}"
    );

    env.emu().set_faults(Faults {
        unavailable_every: Some(1),
        ..Faults::default()
    });
    assert!(
        read_uncached(&mnt.path().join("later")).is_err(),
        "reads fail"
    );
    env.emu().set_faults(Faults::default());
    let after_error = lines(&log);
    let new: Vec<&String> = after_error[after_reads.len()..].iter().collect();
    assert!(
        !new.is_empty()
            && new
                .iter()
                .all(|l| l.contains("WARN") || l.contains("ERROR")),
        "the failure is logged, and only it: {new:#?}"
    );
    assert!(new.len() <= 3, "one line per failed request: {new:#?}");

    let st = Command::new("umount")
        .arg(mnt.path())
        .status()
        .expect("umount");
    assert!(st.success());
    let start = std::time::Instant::now();
    while !lines(&log).iter().any(|l| l.contains("stopped")) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "no line says the daemon stopped: {:#?}",
            lines(&log)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let all = lines(&log);
    let stop = &all[after_error.len()..];
    assert!(stop.len() <= 3, "{all:#?}");
    assert!(
        stop.iter().all(|l| l.contains("INFO")),
        "an ordinary umount is no error: {stop:#?}"
    );
    eprintln!("{}", all.join("\n"));
}
