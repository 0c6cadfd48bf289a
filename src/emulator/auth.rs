//! The emulator's optional security, for testing real-GCS connections on loopback: a TLS
//! identity (PEM certificate and key) and a bearer-token check. Every call and stream open
//! passes the check's interceptor, which counts calls with a valid, a missing or an invalid
//! (unknown or expired) `authorization: Bearer` token; once any token is allowed, calls
//! without a valid one are refused with UNAUTHENTICATED. Touches only request metadata and
//! the stats.

use super::stats::{add, Stats};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tonic::{Request, Status};

/// A TLS identity for the emulator (PEM). The key never appears in Debug output.
#[derive(Clone)]
pub struct ServerTls {
    /// Certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Private key, PEM.
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Reads the certificate and key files.
    pub fn from_files(cert: &std::path::Path, key: &std::path::Path) -> anyhow::Result<ServerTls> {
        use anyhow::Context;
        Ok(ServerTls {
            cert_pem: std::fs::read(cert)
                .with_context(|| format!("cannot read TLS certificate {}", cert.display()))?,
            key_pem: std::fs::read(key)
                .with_context(|| format!("cannot read TLS key {}", key.display()))?,
        })
    }

    pub(crate) fn config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(
            &self.cert_pem,
            &self.key_pem,
        ))
    }
}

/// How an emulator protects itself beyond the defaults (plaintext, no token check).
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// Serve TLS with this identity (`https://` endpoint).
    pub tls: Option<ServerTls>,
    /// Bearer tokens accepted forever; when any is given, calls without one are refused.
    pub tokens: Vec<String>,
}

/// The accepted bearer tokens, changeable at run time.
#[derive(Debug, Default)]
pub(crate) struct TokenCheck {
    /// Token -> the instant it stops being valid (`None`: never).
    tokens: RwLock<HashMap<String, Option<Instant>>>,
    enforce: AtomicBool,
}

impl TokenCheck {
    /// Accepts `token` from now on, for `valid_for` (forever when `None`), and starts refusing
    /// calls without a valid token.
    pub fn allow(&self, token: &str, valid_for: Option<Duration>) {
        let until = valid_for.map(|d| Instant::now() + d);
        match self.tokens.write() {
            Ok(mut t) => t.insert(token.to_string(), until),
            Err(poisoned) => poisoned.into_inner().insert(token.to_string(), until),
        };
        self.enforce.store(true, Ordering::Relaxed);
    }

    fn is_valid(&self, token: &str) -> bool {
        let now = Instant::now();
        let check = |t: &HashMap<String, Option<Instant>>| {
            t.get(token).is_some_and(|u| u.is_none_or(|u| now < u))
        };
        match self.tokens.read() {
            Ok(t) => check(&t),
            Err(poisoned) => check(&poisoned.into_inner()),
        }
    }
}

/// The interceptor in front of both services.
#[derive(Clone)]
pub(crate) struct Interceptor {
    pub check: Arc<TokenCheck>,
    pub stats: Arc<Stats>,
}

impl tonic::service::Interceptor for Interceptor {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let bearer = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let ok = match bearer {
            None => {
                add(&self.stats.bearer_missing, 1);
                false
            }
            Some(t) if self.check.is_valid(t) => {
                add(&self.stats.bearer_valid, 1);
                true
            }
            Some(_) => {
                add(&self.stats.bearer_invalid, 1);
                false
            }
        };
        if ok || !self.check.enforce.load(Ordering::Relaxed) {
            Ok(req)
        } else if bearer.is_none() {
            Err(Status::unauthenticated("missing bearer token"))
        } else {
            Err(Status::unauthenticated("invalid or expired bearer token"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor as _;

    fn call(i: &mut Interceptor, token: Option<&str>) -> bool {
        let mut req = Request::new(());
        if let Some(t) = token {
            req.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        i.call(req).is_ok()
    }

    #[test]
    fn counts_and_enforces_once_a_token_is_allowed() {
        let mut i = Interceptor {
            check: Arc::default(),
            stats: Arc::default(),
        };
        assert!(call(&mut i, None), "no check until a token is allowed");
        i.check.allow("good", None);
        i.check.allow("old", Some(Duration::ZERO));
        assert!(call(&mut i, Some("good")));
        assert!(!call(&mut i, Some("old")));
        assert!(!call(&mut i, Some("other")));
        assert!(!call(&mut i, None));
        let s = i.stats.snapshot();
        assert_eq!(
            (s.bearer_valid, s.bearer_invalid, s.bearer_missing),
            (1, 2, 2)
        );
    }
}
