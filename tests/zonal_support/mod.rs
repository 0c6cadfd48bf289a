//! Shared setup of the zonal, TLS and check tests, all on loopback: a fake GCE metadata
//! server (zone and service-account tokens, found through `GCE_METADATA_HOST`) that is also
//! a fake OAuth token endpoint (`POST /token`, for `authorized_user` credentials), and a
//! test CA with a server certificate for 127.0.0.1 made with rcgen.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Called with every token the fake hands out and how long it is valid.
pub type OnToken = Arc<dyn Fn(&str, Duration) + Send + Sync>;

/// A fake metadata server / token endpoint on 127.0.0.1.
pub struct FakeGoogle {
    /// `127.0.0.1:PORT`, the form GCE_METADATA_HOST takes.
    pub host: String,
    /// Tokens handed out so far.
    pub issued: Arc<AtomicU64>,
    /// Requests that reached the fake, as `METHOD PATH` lines.
    pub requests: Arc<Mutex<Vec<String>>>,
}

impl FakeGoogle {
    /// Serves on `rt`: `zone` (or 404 for the zone), tokens valid `ttl` each.
    pub fn start(
        rt: &tokio::runtime::Runtime,
        zone: Option<&str>,
        ttl: Duration,
        on_token: OnToken,
    ) -> FakeGoogle {
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind fake metadata server");
        let host = listener.local_addr().expect("addr").to_string();
        let issued = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let zone = zone.map(str::to_string);
        let (i, r) = (issued.clone(), requests.clone());
        rt.spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let (zone, i, r, on_token) = (zone.clone(), i.clone(), r.clone(), on_token.clone());
                tokio::spawn(async move {
                    let _ = serve_one(sock, zone, ttl, i, r, on_token).await;
                });
            }
        });
        FakeGoogle {
            host,
            issued,
            requests,
        }
    }

    /// `http://127.0.0.1:PORT/token`, for an authorized_user file's `token_uri`.
    pub fn token_uri(&self) -> String {
        format!("http://{}/token", self.host)
    }
}

async fn serve_one(
    mut sock: tokio::net::TcpStream,
    zone: Option<String>,
    ttl: Duration,
    issued: Arc<AtomicU64>,
    requests: Arc<Mutex<Vec<String>>>,
    on_token: OnToken,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    // Headers, then as much body as Content-Length says.
    let head_end = loop {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let lower = head.to_ascii_lowercase();
    let len: usize = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let first = head.lines().next().unwrap_or("").to_string();
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    requests
        .lock()
        .expect("requests")
        .push(format!("{method} {path}"));
    let flavor = lower.contains("metadata-flavor: google");
    let token = |kind: &str| {
        let n = issued.fetch_add(1, Ordering::SeqCst) + 1;
        let t = format!("{kind}-token-{n}-{:016x}", rand_u64());
        on_token(&t, ttl);
        format!(
            r#"{{"access_token":"{t}","expires_in":{},"token_type":"Bearer"}}"#,
            ttl.as_secs()
        )
    };
    let (status, ctype, body) =
        if method == "GET" && flavor && path.starts_with("/computeMetadata/v1/instance/zone") {
            match &zone {
                Some(z) => ("200 OK", "text/plain", format!("projects/1234/zones/{z}")),
                None => ("404 Not Found", "text/plain", String::new()),
            }
        } else if method == "GET"
            && flavor
            && path.starts_with("/computeMetadata/v1/instance/service-accounts/")
            && path.contains("/token")
        {
            ("200 OK", "application/json", token("mds"))
        } else if method == "POST" && path.starts_with("/token") {
            ("200 OK", "application/json", token("user"))
        } else {
            ("404 Not Found", "text/plain", String::new())
        };
    let reply = format!(
        "HTTP/1.1 {status}\r\nMetadata-Flavor: Google\r\nContent-Type: {ctype}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(reply.as_bytes()).await?;
    sock.shutdown().await
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// A loopback port nothing listens on.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A test CA and a certificate for 127.0.0.1 / localhost signed by it, all PEM.
pub struct TestPki {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl TestPki {
    pub fn new() -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("ca key"))
            .expect("ca");
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .expect("server params");
        let cert = params.signed_by(&key, &ca).expect("server cert");
        TestPki {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// Writes the CA to `dir/ca.pem` and returns its path.
    pub fn write_ca(&self, dir: &std::path::Path) -> std::path::PathBuf {
        let p = dir.join("ca.pem");
        std::fs::write(&p, &self.ca_pem).expect("write ca");
        p
    }

    pub fn server_tls(&self) -> rapidfs::emulator::ServerTls {
        rapidfs::emulator::ServerTls {
            cert_pem: self.cert_pem.clone().into_bytes(),
            key_pem: self.key_pem.clone().into_bytes(),
        }
    }

    /// A memory-backed emulator serving TLS with this PKI on 127.0.0.1:0, with `bucket`
    /// created. It accepts no token until the test allows some (`Emulator::allow_token`).
    pub fn start_emulator(
        &self,
        rt: &tokio::runtime::Runtime,
        bucket: &str,
    ) -> Arc<rapidfs::emulator::Emulator> {
        use rapidfs::emulator::{Emulator, EmulatorOptions, Faults, Security};
        let opts = EmulatorOptions {
            root: None,
            memory: true,
            zone: "us-central1-a".to_string(),
            faults: Faults::default(),
        };
        let security = Security {
            tls: Some(self.server_tls()),
            tokens: vec![],
        };
        let emu = rt
            .block_on(Emulator::start_secure(
                opts,
                "127.0.0.1:0".parse().expect("addr"),
                security,
            ))
            .expect("TLS emulator starts");
        emu.create_bucket(bucket).expect("bucket");
        Arc::new(emu)
    }
}

/// An `authorized_user` credentials file (as `gcloud auth application-default login` writes)
/// whose token endpoint is `token_uri`.
pub fn authorized_user_file(dir: &std::path::Path, token_uri: &str) -> std::path::PathBuf {
    let p = dir.join("adc.json");
    let json = format!(
        r#"{{"type":"authorized_user","client_id":"test-client.apps.example","client_secret":"test-secret","refresh_token":"test-refresh-token","token_uri":"{token_uri}"}}"#
    );
    std::fs::write(&p, json).expect("write credentials");
    p
}
