//! `rapidfs emulator` as a command: bad input gives one clear line and a non-zero exit; a good
//! start prints the endpoint; SIGTERM stops it cleanly.

mod emulator_support;

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `rapidfs emulator ARGS` to completion (at most 20 s): (exit code, stderr).
fn run(args: &[&str]) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .arg("emulator")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("rapidfs emulator {args:?} hung instead of failing");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(args: &[&str], mentions: &str) {
    let (code, stderr) = run(args);
    assert_ne!(code, 0, "{args:?} must fail");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "one line for {args:?}: {stderr:?}"
    );
    assert!(
        stderr.contains(mentions),
        "{args:?}: {stderr:?} should mention {mentions:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bad_input_gets_one_clear_line_and_a_non_zero_exit() {
    assert_one_line_error(&[], "--root");
    assert_one_line_error(&["--root", "/definitely/not/here"], "/definitely/not/here");
    assert_one_line_error(&["--root", "/tmp", "--bogus"], "--bogus");
    assert_one_line_error(&["--root", "/tmp", "--listen", "nonsense"], "nonsense");
    let file = tempfile::NamedTempFile::new().unwrap();
    assert_one_line_error(
        &["--root", file.path().to_str().unwrap()],
        "not a directory",
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().to_string();
    assert_one_line_error(&["--memory", "--listen", &port], &port);
    let cfg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cfg.path(), "[emulator.faults]\nlatency_ms = 5\n").unwrap();
    assert_one_line_error(
        &["--memory", "--config", cfg.path().to_str().unwrap()],
        "latency_ms",
    );
    assert_one_line_error(&["--memory", "--redirect-every", "0"], "redirect_every");
    assert_one_line_error(&["--memory", "--flow-window-kib", "0"], "flow_window_kib");
    assert_one_line_error(
        &["--memory", "--flow-window-kib", "4294967295"],
        "flow_window_kib",
    );
}

#[tokio::test]
async fn serves_prints_the_endpoint_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    std::fs::write(dir.path().join("b/hello.txt"), b"hello").unwrap();
    let cfg = dir.path().join("emu.toml");
    std::fs::write(
        &cfg,
        "[emulator]\nzone = \"europe-west4-b\"\n[emulator.faults]\nlatency_us = 1000\n",
    )
    .unwrap();
    let mut emu = emulator_support::spawn_emulator(&[
        "--root",
        dir.path().to_str().unwrap(),
        "--listen",
        "127.0.0.1:0",
        "--config",
        cfg.to_str().unwrap(),
    ]);
    let mut ctl = rapidfs::proto::control::storage_control_client::StorageControlClient::connect(
        emu.endpoint.clone(),
    )
    .await
    .unwrap();
    let layout = ctl
        .get_storage_layout(emulator_support::routed(
            "b",
            rapidfs::proto::control::GetStorageLayoutRequest {
                name: "projects/_/buckets/b/storageLayout".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(layout.location_type, "zone");
    assert_eq!(
        layout.custom_placement_config.unwrap().data_locations,
        ["europe-west4-b"]
    );
    let mut c =
        rapidfs::proto::storage::storage_client::StorageClient::connect(emu.endpoint.clone())
            .await
            .unwrap();
    assert_eq!(
        emulator_support::read_all(&mut c, "b", "hello.txt").await,
        b"hello"
    );
    drop(c);
    drop(ctl);
    let pid = emu.child.id() as libc::pid_t;
    // SAFETY: sending a signal to the child we spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = emu.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM did not stop the emulator"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "clean exit on SIGTERM: {status}");
}
