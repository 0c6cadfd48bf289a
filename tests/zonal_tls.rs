//! The real-GCS connection path on loopback: the emulator in TLS mode with a certificate from
//! a test CA and a bearer-token check, rapidfs given the CA and `authorized_user`
//! credentials whose token endpoint is a fake on loopback. Every call carries a valid token;
//! tokens that expire during a long read are refreshed without an error.

mod zonal_support;

use rapidfs::config::GcsConfig;
use rapidfs::emulator::{Emulator, Faults};
use rapidfs::gcs::{Client, Error, ListRequest};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zonal_support::{authorized_user_file, FakeGoogle, TestPki};

const BUCKET: &str = "tls";

struct Setup {
    rt: tokio::runtime::Runtime,
    emu: Arc<Emulator>,
    fake: FakeGoogle,
    pki: TestPki,
    dir: tempfile::TempDir,
}

/// A TLS emulator that accepts exactly the tokens the fake token endpoint hands out, each
/// for `ttl`.
fn setup(ttl: Duration) -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let pki = TestPki::new();
    let emu = pki.start_emulator(&rt, BUCKET);
    // The emulator learns each token as it is issued, valid for exactly its lifetime.
    let learner = emu.clone();
    let fake = FakeGoogle::start(
        &rt,
        None,
        ttl,
        Arc::new(move |t, ttl| learner.allow_token(t, Some(ttl))),
    );
    // Nothing is accepted before the first token: enforcement starts now.
    emu.allow_token("never-issued", Some(Duration::ZERO));
    let dir = tempfile::tempdir().expect("tempdir");
    Setup {
        rt,
        emu,
        fake,
        pki,
        dir,
    }
}

impl Setup {
    fn config(&self) -> GcsConfig {
        GcsConfig {
            endpoint: self.emu.endpoint(),
            ca_file: Some(self.pki.write_ca(self.dir.path())),
            credentials_file: Some(authorized_user_file(
                self.dir.path(),
                &self.fake.token_uri(),
            )),
            initial_backoff_ms: 1,
            max_backoff_ms: 50,
            retry_deadline_ms: 20_000,
            ..GcsConfig::default()
        }
    }
}

#[test]
fn every_call_over_tls_carries_a_valid_token() {
    let s = setup(Duration::from_secs(3600));
    assert!(s.emu.endpoint().starts_with("https://127.0.0.1:"));
    s.emu
        .put_object(BUCKET, "a.txt", bytes::Bytes::from_static(b"over tls"))
        .expect("put");
    let cfg = s.config();
    s.rt.block_on(async {
        let client = Client::connect(&cfg)
            .await
            .expect("connects with the CA and credentials");
        assert!(
            client.credentials_source().contains("authorized_user"),
            "{}",
            client.credentials_source()
        );
        let meta = client
            .get_object(BUCKET, "a.txt")
            .await
            .expect("get_object");
        assert_eq!(meta.size, 8);
        let page = client
            .list_page(BUCKET, &ListRequest::default())
            .await
            .expect("list");
        assert_eq!(page.objects.len(), 1);
        let layout = client.get_storage_layout(BUCKET).await.expect("layout");
        assert_eq!(layout.data_locations, vec!["us-central1-a".to_string()]);
        let r = client
            .open_reader(BUCKET, "a.txt", None)
            .await
            .expect("reader");
        assert_eq!(&r.read(0, 8).await.expect("read")[..], b"over tls");
        let mut w = client
            .create_appendable(BUCKET, "new.log", Some(0))
            .await
            .expect("writer");
        w.append(bytes::Bytes::from_static(b"appended"))
            .await
            .expect("append");
        w.finalize().await.expect("finalize");
    });
    let st = s.emu.stats();
    assert!(st.calls >= 5, "{st:?}");
    assert_eq!(st.bearer_missing, 0, "{st:?}");
    assert_eq!(st.bearer_invalid, 0, "{st:?}");
    assert_eq!(
        st.bearer_valid, st.calls,
        "every call had a valid token: {st:?}"
    );
    assert_eq!(s.fake.issued.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn without_the_ca_or_the_credentials_nothing_gets_through() {
    let s = setup(Duration::from_secs(3600));
    let mut no_ca = s.config();
    no_ca.ca_file = None;
    let mut anonymous = s.config();
    anonymous.anonymous = true;
    let mut broken = s.config();
    broken.credentials_file = Some(s.dir.path().join("missing.json"));
    s.rt.block_on(async {
        let e = Client::connect(&no_ca)
            .await
            .err()
            .expect("untrusted certificate refused");
        assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
        let e = Client::connect(&broken)
            .await
            .err()
            .expect("missing file refused");
        assert!(matches!(e, Error::PermissionDenied(_)), "{e}");
        assert!(e.to_string().contains("missing.json"), "{e}");
        let client = Client::connect(&anonymous)
            .await
            .expect("anonymous connects");
        let e = client.get_object(BUCKET, "x").await.expect_err("refused");
        assert!(matches!(e, Error::PermissionDenied(_)), "{e}");
        assert!(!e.to_string().contains("token-"), "no token in errors: {e}");
    });
    assert!(s.emu.stats().bearer_missing >= 1);
}

#[test]
fn tokens_expiring_during_a_long_read_are_refreshed_without_an_error() {
    // google-cloud-auth refreshes a short-lived token every 10 s, so 12 s tokens are always
    // replaced before they expire; the read lasts long enough to need three of them.
    let ttl = Duration::from_secs(12);
    let s = setup(ttl);
    let size = 8 * 1024 * 1024;
    let data: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    s.emu
        .put_object(BUCKET, "big", bytes::Bytes::from(data.clone()))
        .expect("put");
    // Every stream is cut after 256 KiB, so the read keeps reopening streams (each a new
    // call that must carry a then-valid token).
    s.emu.set_faults(Faults {
        cut_read_after_bytes: Some(256 * 1024),
        ..Faults::default()
    });
    let cfg = s.config();
    let started = Instant::now();
    s.rt.block_on(async {
        let client = Client::connect(&cfg).await.expect("connects");
        let reader = client
            .open_reader(BUCKET, "big", None)
            .await
            .expect("reader");
        let chunk = 128 * 1024;
        let mut offset = 0usize;
        while offset < size {
            let got = reader
                .read(offset as u64, chunk as u64)
                .await
                .unwrap_or_else(|e| panic!("read at {offset} after {:?}: {e}", started.elapsed()));
            assert_eq!(&got[..], &data[offset..offset + chunk]);
            offset += chunk;
            // 64 reads over ~26 s.
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
    });
    let st = s.emu.stats();
    let issued = s.fake.issued.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        issued >= 3,
        "tokens were refreshed during the read: {issued}"
    );
    assert!(st.read_streams >= 20, "{st:?}");
    assert_eq!(
        st.bearer_invalid, 0,
        "no call with an expired token: {st:?}"
    );
    assert_eq!(st.bearer_missing, 0, "{st:?}");
    assert_eq!(st.bearer_valid, st.calls, "{st:?}");
}

#[test]
fn the_emulator_command_serves_tls_and_requires_its_token() {
    use std::io::BufRead;
    let pki = TestPki::new();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join(BUCKET)).expect("bucket dir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, &pki.cert_pem).expect("cert");
    std::fs::write(&key, &pki.key_pem).expect("key");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args([
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--require-token",
            "t0ken",
        ])
        .arg("--root")
        .arg(dir.path())
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("emulator runs");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("banner");
    let endpoint = first
        .split_whitespace()
        .find(|w| w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no https endpoint in {first:?}"))
        .to_string();
    let cfg = GcsConfig {
        endpoint,
        ca_file: Some(pki.write_ca(dir.path())),
        anonymous: true,
        retry_deadline_ms: 2_000,
        ..GcsConfig::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let result = rt.block_on(async {
        let client = Client::connect(&cfg)
            .await
            .expect("TLS handshake with the test CA");
        client.list_page(BUCKET, &ListRequest::default()).await
    });
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let e = result.expect_err("no token, no listing");
    assert!(matches!(e, Error::PermissionDenied(_)), "{e}");
    assert!(e.to_string().contains("bearer token"), "{e}");
}
