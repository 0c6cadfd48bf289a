//! Google's own client accepts the emulator: runs tests/python/google_client_check.py (the
//! official google-cloud-storage async appendable writer and multi-range downloader) against
//! a `rapidfs emulator` subprocess serving a temporary directory, plainly and under faults.

mod emulator_support;

use std::time::{Duration, Instant};

/// Runs the Python check against an emulator started with `flags`; panics with its output
/// if it fails.
fn run_check(flags: &[&str], faulty: bool) {
    let python = std::env::var("RAPIDFS_PYTHON").unwrap_or_else(|_| {
        panic!(
            "RAPIDFS_PYTHON is not set: run the suite with tests/run.sh (it installs the pinned \
             google-cloud-storage into a venv and exports RAPIDFS_PYTHON)"
        )
    });
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let mut args = vec![
        "--root",
        dir.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(flags);
    let emu = emulator_support::spawn_emulator(&args);
    let hostport = emu.endpoint.trim_start_matches("http://").to_string();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/python/google_client_check.py"
    );
    let mut cmd = std::process::Command::new(&python);
    cmd.args([script, &hostport, "b"]);
    if faulty {
        cmd.arg("--faulty");
    }
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e} (run tests/run.sh)"));
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("google_client_check.py did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("google_client_check: OK"),
        "google_client_check.py {flags:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // The object is really on disk, whole.
    let on_disk = std::fs::metadata(dir.path().join("b/google-client/appendable.bin")).unwrap();
    assert_eq!(on_disk.len(), 10_486_781);
}

#[test]
fn google_python_client_writes_takes_over_finalizes_and_reads_back() {
    run_check(&[], false);
}

#[test]
fn google_python_client_survives_redirects_chaos_and_unavailable() {
    run_check(
        &[
            "--redirect-every",
            "2",
            "--chaos",
            "--unavailable-every",
            "5",
        ],
        true,
    );
}
