//! Zonal placement check: the zone this machine runs in (from the GCE metadata server)
//! against the zone the bucket lives in (from `StorageControl.GetStorageLayout`). Rapid's
//! sub-millisecond reads exist only when both are the same zone, so a mismatch is worth one
//! loud warning (or a refusal with `--require-same-zone`). Touches only the metadata server;
//! the bucket's layout is handed in by the caller.

use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Where Google's libraries look for the metadata server when `GCE_METADATA_HOST` is unset.
const DEFAULT_METADATA_HOST: &str = "169.254.169.254";

/// Where this machine runs, as far as the metadata server says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ComputeZone {
    /// On GCE (or GKE) in this zone, e.g. `us-central1-a`.
    Zone(String),
    /// No metadata server answered: not on Google Cloud, or it is unreachable.
    NotOnGce(String),
}

/// Where the bucket lives, as GetStorageLayout reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlacement {
    /// `location` of the layout: a zone such as `us-central1-a` for Rapid buckets.
    pub location: String,
    /// `location_type`: `zone` for Rapid buckets; `region`, `dual-region`, `multi-region` else.
    pub location_type: String,
}

impl BucketPlacement {
    /// True for a zonal (Rapid) bucket.
    pub fn is_zonal(&self) -> bool {
        self.location_type.eq_ignore_ascii_case("zone")
    }
}

/// The outcome of the check, with the words a user needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Compute and bucket share a zone: Rapid latency is available.
    SameZone(String),
    /// Compute and bucket are in different zones.
    ZoneMismatch {
        /// The machine's zone.
        compute: String,
        /// The bucket's zone.
        bucket: String,
    },
    /// Not on GCE: the bucket's zone cannot be compared with anything.
    NotOnGce {
        /// Why the metadata server did not answer.
        reason: String,
    },
    /// The bucket is not zonal: reads work, appendable writes need a Rapid bucket.
    NotZonal {
        /// The bucket's location type.
        location_type: String,
    },
}

impl Verdict {
    /// Compares the two placements.
    pub fn of(compute: &ComputeZone, bucket: &BucketPlacement) -> Verdict {
        if !bucket.is_zonal() {
            return Verdict::NotZonal {
                location_type: bucket.location_type.clone(),
            };
        }
        match compute {
            ComputeZone::NotOnGce(reason) => Verdict::NotOnGce {
                reason: reason.clone(),
            },
            ComputeZone::Zone(zone) if zone.eq_ignore_ascii_case(&bucket.location) => {
                Verdict::SameZone(zone.clone())
            }
            ComputeZone::Zone(zone) => Verdict::ZoneMismatch {
                compute: zone.clone(),
                bucket: bucket.location.clone(),
            },
        }
    }

    /// One line for the log or the terminal.
    pub fn message(&self) -> String {
        match self {
            Verdict::SameZone(zone) => format!("compute and bucket are both in zone {zone}"),
            Verdict::ZoneMismatch { compute, bucket } => format!(
                "this machine runs in zone {compute} but the bucket is in zone {bucket}: every \
                 read crosses zones (several times Rapid's latency, and cross-zone egress is \
                 billed); run in {bucket} or use a bucket in {compute}"
            ),
            Verdict::NotOnGce { reason } => {
                format!("not on Google Compute Engine ({reason}): the zone check is skipped")
            }
            Verdict::NotZonal { location_type } => format!(
                "the bucket is not zonal (location type {location_type:?}): reads work, but \
                 appendable writes and Rapid latency need a Rapid (zonal) bucket"
            ),
        }
    }

    /// True when `--require-same-zone` must refuse to mount.
    pub fn refuses(&self, require_same_zone: bool) -> bool {
        require_same_zone && matches!(self, Verdict::ZoneMismatch { .. })
    }

    /// Logs the verdict at the level it deserves: mismatches and non-zonal buckets warn.
    pub fn log(&self) {
        match self {
            Verdict::SameZone(_) => tracing::debug!("{}", self.message()),
            Verdict::NotOnGce { .. } => tracing::info!("{}", self.message()),
            Verdict::ZoneMismatch { .. } | Verdict::NotZonal { .. } => {
                tracing::warn!("{}", self.message())
            }
        }
    }
}

/// The metadata server to ask: `GCE_METADATA_HOST` as Google's libraries honour it, else the
/// link-local default. `None` when the storage endpoint is on loopback and the variable is
/// unset: a local emulator has no zone, and probing the link-local address from a laptop or
/// a test would only cost a timeout.
pub fn metadata_host(endpoint_is_loopback: bool) -> Option<String> {
    match std::env::var("GCE_METADATA_HOST") {
        Ok(host) if !host.is_empty() => Some(host),
        _ if endpoint_is_loopback => None,
        _ => Some(DEFAULT_METADATA_HOST.to_string()),
    }
}

/// Asks the metadata server for this machine's zone, giving up after `timeout`.
pub async fn compute_zone(metadata_host: &str, timeout: Duration) -> ComputeZone {
    match tokio::time::timeout(timeout, fetch_zone(metadata_host)).await {
        Ok(Ok(zone)) => ComputeZone::Zone(zone),
        Ok(Err(reason)) => ComputeZone::NotOnGce(reason),
        Err(_) => ComputeZone::NotOnGce(format!(
            "metadata server {metadata_host} did not answer within {} ms",
            timeout.as_millis()
        )),
    }
}

async fn fetch_zone(host: &str) -> Result<String, String> {
    let uri = format!("http://{host}/computeMetadata/v1/instance/zone");
    let request = http::Request::get(&uri)
        .header("Metadata-Flavor", "Google")
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("bad metadata host {host:?}: {e}"))?;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("metadata server {host} unreachable: {e}"))?;
    let status = response.status();
    let flavor_ok = response
        .headers()
        .get("Metadata-Flavor")
        .is_some_and(|v| v == "Google");
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("metadata server {host}: {e}"))?
        .to_bytes();
    if !status.is_success() || !flavor_ok {
        return Err(format!(
            "{host} is not a GCE metadata server (HTTP {status})"
        ));
    }
    // The answer is `projects/NUMBER/zones/ZONE`.
    let text = String::from_utf8_lossy(&body);
    text.trim()
        .rsplit('/')
        .next()
        .filter(|zone| !zone.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("metadata server {host} gave an empty zone"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A metadata server on loopback that answers every request with `zone_path`, and only
    /// when the request carries `Metadata-Flavor: Google`.
    async fn fake_metadata_server(zone_path: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = sock.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
                let reply = if request.contains("metadata-flavor: google")
                    && request.starts_with("get /computemetadata/v1/instance/zone ")
                {
                    format!(
                        "HTTP/1.1 200 OK\r\nMetadata-Flavor: Google\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{zone_path}",
                        zone_path.len()
                    )
                } else {
                    "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .to_string()
                };
                let _ = sock.write_all(reply.as_bytes()).await;
            }
        });
        addr.to_string()
    }

    #[tokio::test]
    async fn reads_the_zone_from_the_metadata_server() {
        let host = fake_metadata_server("projects/1234/zones/us-central1-b").await;
        let zone = compute_zone(&host, Duration::from_secs(2)).await;
        assert_eq!(zone, ComputeZone::Zone("us-central1-b".into()));
    }

    #[tokio::test]
    async fn closed_port_means_not_on_gce_quickly() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let started = std::time::Instant::now();
        let zone = compute_zone(&format!("127.0.0.1:{port}"), Duration::from_secs(1)).await;
        assert!(matches!(zone, ComputeZone::NotOnGce(_)), "{zone:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    fn zonal(location: &str) -> BucketPlacement {
        BucketPlacement {
            location: location.into(),
            location_type: "zone".into(),
        }
    }

    #[test]
    fn mismatch_names_both_zones_and_refuses_only_when_required() {
        let v = Verdict::of(
            &ComputeZone::Zone("us-central1-b".into()),
            &zonal("us-central1-a"),
        );
        let msg = v.message();
        assert!(
            msg.contains("us-central1-b") && msg.contains("us-central1-a"),
            "{msg}"
        );
        assert!(v.refuses(true));
        assert!(!v.refuses(false));
    }

    #[test]
    fn same_zone_and_non_zonal_buckets() {
        let same = Verdict::of(
            &ComputeZone::Zone("us-central1-a".into()),
            &zonal("us-central1-a"),
        );
        assert_eq!(same, Verdict::SameZone("us-central1-a".into()));
        assert!(!same.refuses(true));
        let regional = BucketPlacement {
            location: "US-CENTRAL1".into(),
            location_type: "region".into(),
        };
        let v = Verdict::of(&ComputeZone::Zone("us-central1-a".into()), &regional);
        assert!(matches!(v, Verdict::NotZonal { .. }));
        assert!(!v.refuses(true));
    }
}
