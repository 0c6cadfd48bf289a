//! The zonal check as users meet it, through `rapidfs mount` (a real FUSE mount of the
//! in-process emulator, which reports zone us-central1-a): a fake metadata server on
//! loopback, found through GCE_METADATA_HOST, puts "this machine" in another zone, the same
//! zone, or nowhere (a closed port).

mod mount_support;
mod zonal_support;

use mount_support::Env;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal_support::{closed_port, FakeGoogle};

const BUCKET: &str = "zonal";

fn is_mounted(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let p = path.to_string_lossy();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_ref()))
}

fn unmount(path: &Path) {
    let st = Command::new("umount")
        .arg(path)
        .status()
        .expect("umount runs");
    assert!(st.success(), "umount {}", path.display());
}

/// `rapidfs mount` in the background against `env`'s emulator with GCE_METADATA_HOST set.
fn mount(env: &Env, mnt: &Path, metadata_host: &str, extra: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(mnt)
        .args(["--endpoint", &env.emu().endpoint()])
        .args(extra)
        .env("GCE_METADATA_HOST", metadata_host)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("rapidfs runs");
    (out, start.elapsed())
}

/// The mount's stderr without the line saying where its control socket is (every mount
/// prints it).
fn diagnostics(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with("rapidfs: control socket: "))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn fake_in_zone(env: &Env, zone: &str) -> FakeGoogle {
    FakeGoogle::start(
        &env.rt,
        Some(zone),
        Duration::from_secs(3600),
        Arc::new(|_, _| {}),
    )
}

fn env() -> Env {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "hello.txt", b"hello");
    env
}

#[test]
fn zone_mismatch_warns_with_both_zones_and_require_same_zone_refuses() {
    let env = env();
    let fake = fake_in_zone(&env, "us-central1-b");
    let mnt = tempfile::tempdir().expect("tempdir");

    let (out, _) = mount(&env, mnt.path(), &fake.host, &[]);
    let stderr = diagnostics(&out);
    assert!(
        out.status.success(),
        "mounts despite the mismatch: {stderr}"
    );
    assert!(is_mounted(mnt.path()));
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one warning: {stderr:?}"
    );
    assert!(stderr.starts_with("rapidfs: warning: "), "{stderr}");
    assert!(
        stderr.contains("us-central1-b") && stderr.contains("us-central1-a"),
        "names both zones: {stderr}"
    );
    assert!(stderr.contains("egress"), "says what it costs: {stderr}");
    assert_eq!(
        std::fs::read(mnt.path().join("hello.txt")).expect("read"),
        b"hello"
    );
    unmount(mnt.path());
    assert!(
        fake.requests
            .lock()
            .expect("requests")
            .iter()
            .any(|r| r.starts_with("GET /computeMetadata/v1/instance/zone")),
        "the metadata server was asked"
    );

    let (out, _) = mount(&env, mnt.path(), &fake.host, &["--require-same-zone"]);
    let stderr = diagnostics(&out);
    assert!(!out.status.success(), "refuses: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.starts_with("rapidfs: error: "), "{stderr}");
    assert!(
        stderr.contains("us-central1-b") && stderr.contains("us-central1-a"),
        "{stderr}"
    );
    assert!(!is_mounted(mnt.path()), "nothing mounted");
}

#[test]
fn matching_zones_are_silent_and_a_closed_metadata_port_mounts_quickly() {
    let env = env();
    let fake = fake_in_zone(&env, "us-central1-a");
    let mnt = tempfile::tempdir().expect("tempdir");

    let (out, same_zone_time) = mount(&env, mnt.path(), &fake.host, &["--require-same-zone"]);
    let stderr = diagnostics(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "", "silent when the zones match");
    assert!(is_mounted(mnt.path()));
    unmount(mnt.path());

    let closed = format!("127.0.0.1:{}", closed_port());
    let (out, closed_time) = mount(&env, mnt.path(), &closed, &[]);
    let stderr = diagnostics(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(is_mounted(mnt.path()));
    assert!(
        stderr.contains("not on Google Compute Engine") && stderr.contains(&closed),
        "says it is not on GCE and where it looked: {stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    unmount(mnt.path());
    // The same mount with an answering metadata server is the baseline: a dead one may not
    // add more than a second to it.
    assert!(
        closed_time < same_zone_time + Duration::from_secs(1),
        "closed metadata port: {closed_time:?} vs {same_zone_time:?} with a live one"
    );
}

#[test]
fn mounts_a_tls_endpoint_with_a_key_file_and_a_ca_file() {
    use zonal_support::{authorized_user_file, TestPki};
    let env = env();
    let pki = TestPki::new();
    let emu = pki.start_emulator(&env.rt, BUCKET);
    emu.put_object(BUCKET, "secure.txt", bytes::Bytes::from_static(b"over tls"))
        .expect("put");
    emu.allow_token("never-issued", Some(Duration::ZERO));
    let learner = emu.clone();
    let fake = FakeGoogle::start(
        &env.rt,
        Some("us-central1-a"),
        Duration::from_secs(3600),
        Arc::new(move |t, ttl| learner.allow_token(t, Some(ttl))),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = pki.write_ca(dir.path());
    let key = authorized_user_file(dir.path(), &fake.token_uri());
    let mnt = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(mnt.path())
        .args(["--endpoint", &emu.endpoint(), "--ca-file"])
        .arg(&ca)
        .arg("--key-file")
        .arg(&key)
        .env("GCE_METADATA_HOST", &fake.host)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("rapidfs runs");
    let stderr = diagnostics(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr, "", "same zone: silent");
    let got = std::fs::read(mnt.path().join("secure.txt"));
    unmount(mnt.path());
    assert_eq!(got.expect("read through the mount"), b"over tls");
    let st = emu.stats();
    assert!(st.calls >= 3, "{st:?}");
    assert_eq!(
        st.bearer_valid, st.calls,
        "every call had a valid token: {st:?}"
    );
    assert_eq!(st.bearer_missing + st.bearer_invalid, 0, "{st:?}");
}
