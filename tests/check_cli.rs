//! `rapidfs check` as users run it: against the plaintext emulator it prints every line
//! (credentials, endpoint, bucket type and zone, compute zone, placement, first byte,
//! throughput, verdict) and the same as JSON; over TLS it finds Application Default
//! Credentials (a GOOGLE_APPLICATION_CREDENTIALS authorized_user file, or the metadata
//! server's tokens); against a dead endpoint it fails fast with one clear line.

mod mount_support;
mod zonal_support;

use mount_support::Env;
use rapidfs::emulator::Emulator;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal_support::{authorized_user_file, FakeGoogle, TestPki};

const BUCKET: &str = "doctor";

/// `rapidfs check` with a clean credentials environment: HOME is a fresh directory, so no
/// gcloud file of the machine is found.
fn check(home: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rapidfs"));
    cmd.arg("check")
        .args(args)
        .env("HOME", home)
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env_remove("GCE_METADATA_HOST")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("rapidfs runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

#[test]
fn prints_every_line_and_json_against_the_emulator() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "small.txt", b"tiny object");
    env.put(BUCKET, "big.bin", &vec![7u8; 64 * 1024 * 1024]);
    // The smallest object, but an upload's aside object: never timed.
    env.put(BUCKET, "logs/.rapidfs-upload-0123456789abcdef", b"x");
    let fake = FakeGoogle::start(
        &env.rt,
        Some("us-central1-b"),
        Duration::from_secs(3600),
        Arc::new(|_, _| {}),
    );
    let home = tempfile::tempdir().expect("home");
    let ep = env.emu().endpoint();
    let out = check(
        home.path(),
        &[BUCKET, "--endpoint", &ep],
        &[("GCE_METADATA_HOST", &fake.host)],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for (label, expect) in [
        ("credentials:", "plaintext"),
        ("endpoint:", "reachable"),
        ("bucket type:", "zonal (Rapid), zone us-central1-a"),
        ("compute zone:", "us-central1-b"),
        ("placement:", "zone-mismatch"),
        ("first byte:", "p50 "),
        ("throughput:", "MiB/s single stream over 64 MiB of big.bin"),
        ("verdict:", "WARNING"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in:\n{stdout}"));
        assert!(line.contains(expect), "{line:?} should say {expect:?}");
    }
    assert!(
        stdout.contains("small.txt"),
        "TTFB on the smallest object that is not an upload's: {stdout}"
    );
    let config = stdout
        .split_once("effective configuration (profile: none):")
        .unwrap_or_else(|| panic!("no effective configuration in:\n{stdout}"))
        .1;
    assert!(config.contains("stat_ttl_ms = 60000"), "{config}");
    assert!(
        !config.contains("memory_mb = 0"),
        "the automatic budget is shown as the number it is: {config}"
    );

    let out = check(
        home.path(),
        &[
            BUCKET,
            "--endpoint",
            &ep,
            "--json",
            "--profile",
            "aiml-training",
        ],
        &[("GCE_METADATA_HOST", &fake.host)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["reachable"], true);
    assert_eq!(v["bucket_placement"]["zone"], "us-central1-a");
    assert_eq!(v["compute"]["zone"], "us-central1-b");
    assert_eq!(v["placement"]["result"], "zone-mismatch");
    assert_eq!(v["ttfb"]["reads"], 20);
    assert!(
        v["ttfb"]["p99_ms"].as_f64().expect("p99") >= v["ttfb"]["p50_ms"].as_f64().expect("p50")
    );
    assert_eq!(v["throughput"]["bytes"], 64 * 1024 * 1024);
    assert_eq!(v["verdict"]["status"], "WARNING");
    let cfg = &v["configuration"];
    assert_eq!(cfg["profile"], "aiml-training");
    assert_eq!(cfg["fs"]["prefetch_metadata"], true);
    assert_eq!(cfg["fs"]["stat_ttl_ms"], rapidfs::profiles::FOREVER_MS);
    assert_eq!(
        cfg["gcs"]["connect_timeout_ms"], 5000,
        "the mount's, not the check's"
    );

    // --require-same-zone turns the mismatch into a hard failure.
    let out = check(
        home.path(),
        &[BUCKET, "--endpoint", &ep, "--require-same-zone"],
        &[("GCE_METADATA_HOST", &fake.host)],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("verdict:       FAILED"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn dead_endpoint_and_missing_bucket_fail_fast_in_one_line() {
    let env = Env::new(BUCKET);
    let home = tempfile::tempdir().expect("home");
    let closed = format!("http://127.0.0.1:{}", zonal_support::closed_port());
    let start = Instant::now();
    let out = check(home.path(), &[BUCKET, "--endpoint", &closed], &[]);
    let took = start.elapsed();
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.starts_with("rapidfs: error: ") && stderr.contains(&closed[7..]),
        "{stderr}"
    );
    assert!(text(&out.stdout).contains("verdict:       FAILED"));

    let out = check(
        home.path(),
        &["nope", "--endpoint", &env.emu().endpoint()],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
}

/// `rapidfs ARGS` with stdout a pipe whose reader has already gone, as in `rapidfs ... | head`
/// once `head` has its lines: how it ended (the status a shell shows: 128 + the signal that
/// killed it) and its stderr.
fn into_a_closed_pipe(home: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(args)
        .env("HOME", home)
        .env_remove("GCE_METADATA_HOST")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("rapidfs runs");
    let status = out.status.signal().map(|s| 128 + s).or(out.status.code());
    (status, text(&out.stderr))
}

/// Help piped into `head` dies of SIGPIPE as coreutils do; `check`, which keeps SIGPIPE
/// ignored for its sockets, ends with the same status, and neither panics nor says a word.
#[test]
fn output_piped_into_a_reader_that_went_away_ends_quietly() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "small.txt", b"tiny object");
    let home = tempfile::tempdir().expect("home");
    let ep = env.emu().endpoint();
    for args in [
        vec!["--help"],
        vec!["mount", "--help"],
        vec!["--version"],
        vec!["check", BUCKET, "--endpoint", &ep],
    ] {
        let (status, stderr) = into_a_closed_pipe(home.path(), &args);
        assert_eq!(status, Some(128 + libc::SIGPIPE), "{args:?}: {stderr}");
        assert_eq!(stderr, "", "{args:?}");
    }
}

/// A TLS emulator that accepts exactly the tokens the fake hands out.
fn tls_setup(zone: Option<&str>) -> (tokio::runtime::Runtime, Arc<Emulator>, FakeGoogle, TestPki) {
    let (rt, emu, fake, pki) = tls_counting(zone);
    emu.allow_token("never-issued", Some(Duration::ZERO));
    (rt, emu, fake, pki)
}

/// A TLS emulator that counts bearer tokens but refuses none (the fake's are known to it).
fn tls_counting(
    zone: Option<&str>,
) -> (tokio::runtime::Runtime, Arc<Emulator>, FakeGoogle, TestPki) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pki = TestPki::new();
    let emu = pki.start_emulator(&rt, BUCKET);
    emu.put_object(BUCKET, "f", bytes::Bytes::from_static(b"data"))
        .expect("put");
    let learner = emu.clone();
    let fake = FakeGoogle::start(
        &rt,
        zone,
        Duration::from_secs(3600),
        Arc::new(move |t, ttl| learner.allow_token(t, Some(ttl))),
    );
    (rt, emu, fake, pki)
}

#[test]
fn over_tls_with_a_google_application_credentials_file() {
    let (_rt, emu, fake, pki) = tls_setup(None);
    let home = tempfile::tempdir().expect("home");
    let ca = pki.write_ca(home.path());
    let adc = authorized_user_file(home.path(), &fake.token_uri());
    let ep = emu.endpoint();
    let out = check(
        home.path(),
        &[
            BUCKET,
            "--endpoint",
            &ep,
            "--ca-file",
            ca.to_str().expect("utf8"),
            "--log-level",
            "trace",
        ],
        &[
            (
                "GOOGLE_APPLICATION_CREDENTIALS",
                adc.to_str().expect("utf8"),
            ),
            // A closed port: "not on GCE", and the test never reaches a real metadata server.
            (
                "GCE_METADATA_HOST",
                &format!("127.0.0.1:{}", zonal_support::closed_port()),
            ),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("GOOGLE_APPLICATION_CREDENTIALS=") && stdout.contains("authorized_user"),
        "{stdout}"
    );
    assert!(stdout.contains("not on GCE"), "{stdout}");
    // Neither the report nor a trace-level log shows a token or the key material.
    let stderr = text(&out.stderr);
    assert!(stderr.lines().count() > 10, "trace logging is on: {stderr}");
    for secret in ["user-token-", "test-secret", "test-refresh-token"] {
        assert!(!stdout.contains(secret), "{secret} in {stdout}");
        assert!(!stderr.contains(secret), "{secret} in the log");
    }
    let st = emu.stats();
    assert!(st.calls > 0 && st.bearer_valid == st.calls, "{st:?}");
    assert_eq!(st.bearer_missing + st.bearer_invalid, 0, "{st:?}");
}

#[test]
fn over_tls_with_metadata_server_tokens() {
    let (_rt, emu, fake, pki) = tls_setup(Some("us-central1-a"));
    let home = tempfile::tempdir().expect("home");
    let ca = pki.write_ca(home.path());
    let ep = emu.endpoint();
    let out = check(
        home.path(),
        &[
            BUCKET,
            "--endpoint",
            &ep,
            "--ca-file",
            ca.to_str().expect("utf8"),
        ],
        &[("GCE_METADATA_HOST", &fake.host)],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("GCE metadata server at 127.0.0.1:"),
        "{stdout}"
    );
    assert!(stdout.contains("same-zone"), "{stdout}");
    assert!(stdout.contains("verdict:       OK"), "{stdout}");
    let st = emu.stats();
    assert!(st.calls > 0 && st.bearer_valid == st.calls, "{st:?}");
    assert!(
        fake.requests
            .lock()
            .expect("requests")
            .iter()
            .any(|r| r.contains("/service-accounts/") && r.contains("/token")),
        "the token came from the metadata server"
    );

    // Missing credentials: the metadata server is a closed port and there is no file.
    let closed = format!("127.0.0.1:{}", zonal_support::closed_port());
    let out = check(
        home.path(),
        &[
            BUCKET,
            "--endpoint",
            &ep,
            "--ca-file",
            ca.to_str().expect("utf8"),
        ],
        &[("GCE_METADATA_HOST", &closed)],
    );
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr:?}");
    assert!(
        stderr.contains("no usable credentials")
            && stderr.contains("GOOGLE_APPLICATION_CREDENTIALS unset")
            && stderr.contains(&closed),
        "names what was tried: {stderr}"
    );
}

#[test]
fn over_tls_with_a_service_account_key_file() {
    // The key is made by openssl (tests/setup.sh installs it): a service account signs its
    // own JWT bearer tokens locally, with no token endpoint.
    let (_rt, emu, _fake, pki) = tls_counting(None);
    let home = tempfile::tempdir().expect("home");
    let key = home.path().join("rsa.pem");
    let made = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .expect("openssl runs");
    assert!(made.status.success(), "{}", text(&made.stderr));
    let pem = std::fs::read_to_string(&key).expect("key");
    let sa = home.path().join("sa.json");
    let json = serde_json::json!({
        "type": "service_account",
        "project_id": "test-project",
        "private_key_id": "test-key-id",
        "private_key": pem,
        "client_email": "rapidfs-test@test-project.iam.gserviceaccount.com",
        "client_id": "1234",
        "token_uri": "http://127.0.0.1:1/token",
    });
    std::fs::write(&sa, json.to_string()).expect("write key file");
    let ca = pki.write_ca(home.path());
    let out = check(
        home.path(),
        &[
            BUCKET,
            "--endpoint",
            &emu.endpoint(),
            "--ca-file",
            ca.to_str().expect("utf8"),
            "--key-file",
            sa.to_str().expect("utf8"),
            "--log-level",
            "trace",
        ],
        &[(
            "GCE_METADATA_HOST",
            &format!("127.0.0.1:{}", zonal_support::closed_port()),
        )],
    );
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("credentials file") && stdout.contains("(service_account)"),
        "{stdout}"
    );
    let body: String = pem.lines().nth(1).expect("key body").to_string();
    assert!(
        !stdout.contains(&body) && !stderr.contains(&body),
        "key material leaked"
    );
    let st = emu.stats();
    assert!(st.calls > 0, "{st:?}");
    assert_eq!(st.bearer_missing, 0, "a bearer token on every call: {st:?}");
}
