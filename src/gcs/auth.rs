//! Credentials of a `Client`: which source they come from (a credentials file, Application
//! Default Credentials through google-cloud-auth, or none), a first token fetched at connect
//! time so that missing or broken credentials fail with one line naming what was tried, and
//! `AuthChannel`, the tower service that puts the current bearer token on every call and
//! stream open. google-cloud-auth caches the token and refreshes it in the background before
//! it expires, so asking for it per call costs a lock, and a stream reopened after a long
//! read gets a fresh token. Tokens and key material never reach a log line or an error:
//! nothing here formats them, and the `authorization` value is marked sensitive.

use super::{Error, Result};
use crate::config::GcsConfig;
use google_cloud_auth::credentials::{
    service_account, user_account, Builder, CacheableResource, Credentials,
};
use http::header::AUTHORIZATION;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tonic::body::Body;
use tonic::transport::Channel;

/// Where the metadata server is when `GCE_METADATA_HOST` is unset.
const DEFAULT_METADATA_HOST: &str = "169.254.169.254";

/// The credentials of one client; cheap to clone.
#[derive(Clone)]
pub(crate) struct Auth {
    creds: Option<Credentials>,
    source: String,
}

/// Only the source: the credentials hold tokens and keys.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Picks the credentials `cfg` asks for and, when there are any, fetches a first token
    /// (within `connect_timeout_ms`) so that a broken source fails now, in one line.
    pub(crate) async fn new(cfg: &GcsConfig) -> Result<Auth> {
        // google-cloud-auth leaves the choice of crypto to the application: tonic's ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if cfg.anonymous {
            return Ok(Auth {
                creds: None,
                source: "anonymous (--anonymous: no credentials sent)".to_string(),
            });
        }
        if !cfg.endpoint.starts_with("https://") {
            return Ok(Auth {
                creds: None,
                source: "none (plaintext endpoint: credentials are only sent over TLS)".to_string(),
            });
        }
        let (creds, source) = match &cfg.credentials_file {
            Some(path) => from_file(path)?,
            None => adc()?,
        };
        let first = tokio::time::timeout(
            Duration::from_millis(cfg.connect_timeout_ms.max(1000)),
            creds.headers(http::Extensions::new()),
        )
        .await;
        match first {
            Ok(Ok(_)) => Ok(Auth {
                creds: Some(creds),
                source,
            }),
            Ok(Err(e)) => Err(Error::PermissionDenied(format!(
                "no usable credentials: tried {source}: {e}"
            ))),
            Err(_) => Err(Error::PermissionDenied(format!(
                "no usable credentials: tried {source}: no token within {} ms",
                cfg.connect_timeout_ms.max(1000)
            ))),
        }
    }

    /// Where the credentials come from, in words (never the credentials themselves).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// `channel` with this client's credentials on every request.
    pub(crate) fn channel(&self, channel: Channel) -> AuthChannel {
        AuthChannel {
            inner: channel,
            creds: self.creds.clone(),
        }
    }
}

/// The `type` field of a credentials JSON.
fn credential_type(json: &serde_json::Value) -> &str {
    json.get("type")
        .and_then(|t| t.as_str())
        .unwrap_or("unknown")
}

/// Reads a credentials JSON without ever quoting its content in an error.
fn read_json(path: &Path, what: &str) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Error::PermissionDenied(format!(
            "no usable credentials: cannot read {what} {}: {e}",
            path.display()
        ))
    })?;
    serde_json::from_str(&text).map_err(|_| {
        Error::PermissionDenied(format!(
            "no usable credentials: {what} {} is not a JSON credentials file",
            path.display()
        ))
    })
}

/// An explicit credentials file: a service account key or `gcloud` user credentials.
fn from_file(path: &Path) -> Result<(Credentials, String)> {
    let json = read_json(path, "credentials file")?;
    let kind = credential_type(&json).to_string();
    let source = format!("credentials file {} ({kind})", path.display());
    let built = match kind.as_str() {
        "authorized_user" => user_account::Builder::new(json).build(),
        "service_account" => service_account::Builder::new(json).build(),
        other => {
            return Err(Error::PermissionDenied(format!(
                "no usable credentials: {source}: type {other:?} is not supported \
                 (use a service account key or gcloud user credentials)"
            )))
        }
    };
    let creds = built
        .map_err(|e| Error::PermissionDenied(format!("no usable credentials: {source}: {e}")))?;
    Ok((creds, source))
}

/// Application Default Credentials, in Google's order: `GOOGLE_APPLICATION_CREDENTIALS`, the
/// gcloud application-default file, the GCE metadata server.
fn adc() -> Result<(Credentials, String)> {
    let source = adc_source()?;
    let creds = Builder::default()
        .build()
        .map_err(|e| Error::PermissionDenied(format!("no usable credentials: {source}: {e}")))?;
    Ok((creds, source))
}

/// Names the source ADC will use, the way google-cloud-auth picks it.
fn adc_source() -> Result<String> {
    if let Some(path) = std::env::var_os("GOOGLE_APPLICATION_CREDENTIALS") {
        let path = PathBuf::from(path);
        let json = read_json(&path, "GOOGLE_APPLICATION_CREDENTIALS file")?;
        return Ok(format!(
            "GOOGLE_APPLICATION_CREDENTIALS={} ({})",
            path.display(),
            credential_type(&json)
        ));
    }
    let well_known = std::env::var_os("HOME").map(|home| {
        PathBuf::from(home).join(".config/gcloud/application_default_credentials.json")
    });
    if let Some(path) = well_known.as_ref().filter(|p| p.exists()) {
        let json = read_json(path, "gcloud application-default credentials")?;
        return Ok(format!(
            "gcloud application-default credentials {} ({})",
            path.display(),
            credential_type(&json)
        ));
    }
    let host = std::env::var("GCE_METADATA_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| DEFAULT_METADATA_HOST.to_string());
    let gcloud = well_known.map_or_else(
        || "no gcloud credentials ($HOME unset)".to_string(),
        |p| format!("no {}", p.display()),
    );
    Ok(format!(
        "Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS unset, {gcloud}, \
         so the GCE metadata server at {host})"
    ))
}

/// A channel that adds the current credentials' headers to every request.
#[derive(Clone)]
pub(crate) struct AuthChannel {
    inner: Channel,
    creds: Option<Credentials>,
}

impl tower::Service<http::Request<Body>> for AuthChannel {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let method = crate::metrics::grpc_method(req.uri().path());
        let start = std::time::Instant::now();
        let call = self.call_with_credentials(req);
        Box::pin(async move {
            let response = call.await;
            // A failed call answers at once with its status in the headers; a stream's or
            // a unary call's status comes later, in the trailers: then this is the open.
            let code = match &response {
                Ok(r) => r
                    .headers()
                    .get("grpc-status")
                    .and_then(|v| v.to_str().ok()?.parse().ok())
                    .unwrap_or(0),
                Err(_) => tonic::Code::Unavailable as i32,
            };
            crate::metrics::grpc_call(method, start.elapsed(), crate::metrics::grpc_code(code));
            response
        })
    }
}

impl AuthChannel {
    fn call_with_credentials(
        &mut self,
        mut req: http::Request<Body>,
    ) -> <Self as tower::Service<http::Request<Body>>>::Future {
        use tower::Service;
        // The channel that was polled ready serves this call; a clone takes its place.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let Some(creds) = self.creds.clone() else {
            return Box::pin(inner.call(req));
        };
        Box::pin(async move {
            if let Err(status) = credential_headers(&creds, req.headers_mut()).await {
                return Ok(status.into_http());
            }
            inner.call(req).await
        })
    }
}

impl Auth {
    /// Puts the current credentials' headers (the bearer token) into `headers`; nothing
    /// when there are no credentials.
    pub(crate) async fn add_headers(
        &self,
        headers: &mut http::HeaderMap,
    ) -> std::result::Result<(), tonic::Status> {
        match &self.creds {
            Some(creds) => credential_headers(creds, headers).await,
            None => Ok(()),
        }
    }
}

/// `creds`' headers into `headers`; a failure is the status the call ends with.
async fn credential_headers(
    creds: &Credentials,
    headers: &mut http::HeaderMap,
) -> std::result::Result<(), tonic::Status> {
    match creds.headers(http::Extensions::new()).await {
        Ok(CacheableResource::New { data, .. }) => {
            for (name, value) in &data {
                let mut value = value.clone();
                if name == AUTHORIZATION {
                    value.set_sensitive(true);
                }
                headers.insert(name.clone(), value);
            }
            Ok(())
        }
        // Only returned to callers that pass an entity tag, which we never do.
        Ok(CacheableResource::NotModified) => Err(tonic::Status::unauthenticated(
            "credentials gave no headers",
        )),
        Err(e) => {
            // A transient failure (token endpoint briefly down) is retried like any
            // unavailable call; anything else is an authentication failure.
            let msg = format!("credentials: {e}");
            Err(if e.is_transient() {
                tonic::Status::unavailable(msg)
            } else {
                tonic::Status::unauthenticated(msg)
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plaintext_and_anonymous_send_nothing() {
        let cfg = GcsConfig {
            endpoint: "http://127.0.0.1:9".into(),
            ..Default::default()
        };
        let a = Auth::new(&cfg).await.unwrap();
        assert!(a.creds.is_none() && a.source().contains("plaintext"));
        let cfg = GcsConfig {
            anonymous: true,
            ..Default::default()
        };
        let a = Auth::new(&cfg).await.unwrap();
        assert!(a.creds.is_none() && a.source().contains("anonymous"));
    }

    #[tokio::test]
    async fn broken_files_fail_in_one_line_without_their_content() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("key.json");
        std::fs::write(&bad, "not json, secret-material").unwrap();
        let cfg = GcsConfig {
            credentials_file: Some(bad.clone()),
            ..Default::default()
        };
        let e = Auth::new(&cfg).await.unwrap_err().to_string();
        assert!(e.contains(&bad.display().to_string()), "{e}");
        assert!(!e.contains("secret-material") && !e.contains('\n'), "{e}");
        std::fs::write(&bad, r#"{"type":"external_thing","secret":"s3cr3t"}"#).unwrap();
        let e = Auth::new(&cfg).await.unwrap_err().to_string();
        assert!(e.contains("external_thing") && !e.contains("s3cr3t"), "{e}");
        let cfg = GcsConfig {
            credentials_file: Some(dir.path().join("missing.json")),
            ..Default::default()
        };
        let e = Auth::new(&cfg).await.unwrap_err().to_string();
        assert!(e.contains("missing.json"), "{e}");
    }
}
