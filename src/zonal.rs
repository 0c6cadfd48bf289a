//! Zonal placement check: the zone this machine runs in (from the GCE metadata server)
//! against the zone the bucket lives in (from `StorageControl.GetStorageLayout`). Rapid's
//! sub-millisecond reads exist only when both are the same zone, so a mismatch is worth one
//! loud warning (or a refusal with `--require-same-zone`). Touches the metadata server and,
//! through `gcs::Client`, GetStorageLayout.

use crate::config::{BucketType, ZonalConfig};
use crate::gcs::Client as GcsClient;
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
    /// `location` of the layout: the region in upper case (`US-CENTRAL1`) for Rapid buckets,
    /// though some servers give the zone itself.
    pub location: String,
    /// `location_type`: `zone` for Rapid buckets; `region`, `dual-region`, `multi-region` else.
    pub location_type: String,
    /// `custom_placement_config.data_locations`: the zone of a Rapid bucket.
    pub data_locations: Vec<String>,
}

impl BucketPlacement {
    /// True for a zonal (Rapid) bucket.
    pub fn is_zonal(&self) -> bool {
        self.location_type.eq_ignore_ascii_case("zone")
    }

    /// The bucket's zone in lower case: its one data location, else the location when that
    /// names a zone (`us-central1-a`); `None` when neither does.
    pub fn zone(&self) -> Option<String> {
        match self.data_locations.as_slice() {
            [one] if is_zone(one) => Some(one.to_ascii_lowercase()),
            _ if is_zone(&self.location) => Some(self.location.to_ascii_lowercase()),
            _ => None,
        }
    }
}

/// `us-central1-a` is a zone; `us-central1` and `US` are not.
fn is_zone(name: &str) -> bool {
    name.rsplit_once('-').is_some_and(|(region, z)| {
        region.contains('-') && z.len() == 1 && z.chars().all(|c| c.is_ascii_alphabetic())
    })
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
    /// The bucket is zonal but its zone is not known (layout denied under `--bucket-type zonal`).
    ZoneUnknown {
        /// Why.
        reason: String,
    },
    /// GetStorageLayout failed and no `--bucket-type` was given.
    Undetermined {
        /// Why.
        reason: String,
    },
    /// A local endpoint with `GCE_METADATA_HOST` unset: nothing to compare.
    Skipped,
}

impl Verdict {
    /// Compares the two placements.
    pub fn of(compute: &ComputeZone, bucket: &BucketPlacement) -> Verdict {
        if !bucket.is_zonal() {
            return Verdict::NotZonal {
                location_type: bucket.location_type.clone(),
            };
        }
        match (compute, bucket.zone()) {
            (ComputeZone::NotOnGce(reason), _) => Verdict::NotOnGce {
                reason: reason.clone(),
            },
            (ComputeZone::Zone(_), None) => Verdict::ZoneUnknown {
                reason: format!(
                    "the service reports location {:?} and no zone",
                    bucket.location
                ),
            },
            (ComputeZone::Zone(zone), Some(b)) if zone.eq_ignore_ascii_case(&b) => {
                Verdict::SameZone(zone.clone())
            }
            (ComputeZone::Zone(zone), Some(b)) => Verdict::ZoneMismatch {
                compute: zone.clone(),
                bucket: b,
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
            Verdict::ZoneUnknown { reason } => {
                format!("the bucket's zone is unknown ({reason}): the zone check is skipped")
            }
            Verdict::Undetermined { reason } => format!(
                "cannot tell whether the bucket is zonal ({reason}); pass --bucket-type \
                 zonal or --bucket-type standard"
            ),
            Verdict::Skipped => {
                "local endpoint and GCE_METADATA_HOST unset: the zone check is skipped".to_string()
            }
        }
    }

    /// True when the user should see this verdict even without a log (mismatch, not on GCE,
    /// not zonal, unknown); a match or a skipped check is silent.
    pub fn worth_saying(&self) -> bool {
        !matches!(self, Verdict::SameZone(_) | Verdict::Skipped)
    }

    /// "warning" or "note": how loud the verdict is.
    pub fn severity(&self) -> &'static str {
        match self {
            Verdict::ZoneMismatch { .. }
            | Verdict::NotZonal { .. }
            | Verdict::Undetermined { .. } => "warning",
            _ => "note",
        }
    }

    /// True when `--require-same-zone` must refuse to mount.
    pub fn refuses(&self, require_same_zone: bool) -> bool {
        require_same_zone && matches!(self, Verdict::ZoneMismatch { .. })
    }

    /// Logs the verdict at the level it deserves: mismatches and non-zonal buckets warn.
    pub fn log(&self) {
        match self {
            Verdict::SameZone(_) | Verdict::Skipped => tracing::debug!("{}", self.message()),
            _ if self.severity() == "warning" => tracing::warn!("{}", self.message()),
            _ => tracing::info!("{}", self.message()),
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

/// True when the endpoint URL names a loopback host (an emulator on this machine).
pub fn endpoint_is_loopback(endpoint: &str) -> bool {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host_port = rest.split('/').next().unwrap_or("");
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Everything the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// This machine's zone (or why there is none); `None` when the probe was skipped.
    pub compute: Option<ComputeZone>,
    /// The bucket's placement, or why it is unknown.
    pub bucket: Result<BucketPlacement, String>,
    /// The outcome.
    pub verdict: Verdict,
}

/// Longest wait for GetStorageLayout: the check must never hold a mount for long.
const LAYOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the whole check: the metadata server and GetStorageLayout at the same time.
pub async fn check(client: &GcsClient, bucket: &str, cfg: &ZonalConfig) -> Report {
    let host = metadata_host(endpoint_is_loopback(&client.config().endpoint));
    let timeout = Duration::from_millis(cfg.metadata_timeout_ms);
    let compute = async {
        match &host {
            Some(h) => Some(compute_zone(h, timeout).await),
            None => None,
        }
    };
    let layout = async {
        if cfg.bucket_type == BucketType::Standard {
            return Ok(BucketPlacement {
                location: String::new(),
                location_type: "standard (--bucket-type)".to_string(),
                data_locations: vec![],
            });
        }
        match tokio::time::timeout(LAYOUT_TIMEOUT, client.get_storage_layout(bucket)).await {
            Ok(Ok(l)) => Ok(BucketPlacement {
                location: l.location,
                location_type: l.location_type,
                data_locations: l.data_locations,
            }),
            Ok(Err(e)) => Err(format!("GetStorageLayout: {e}")),
            Err(_) => Err(format!(
                "GetStorageLayout: no answer within {} s",
                LAYOUT_TIMEOUT.as_secs()
            )),
        }
    };
    let (compute, bucket) = tokio::join!(compute, layout);
    let verdict = decide(compute.as_ref(), &bucket, cfg.bucket_type);
    Report {
        compute,
        bucket,
        verdict,
    }
}

/// The verdict from what was found and what the user said the bucket is.
fn decide(
    compute: Option<&ComputeZone>,
    bucket: &Result<BucketPlacement, String>,
    bucket_type: BucketType,
) -> Verdict {
    let placement = match (bucket, bucket_type) {
        (Ok(p), BucketType::Zonal) if !p.is_zonal() => BucketPlacement {
            location_type: "zone".to_string(),
            ..p.clone()
        },
        (Ok(p), _) => p.clone(),
        (Err(reason), BucketType::Zonal) => {
            return match compute {
                Some(ComputeZone::NotOnGce(r)) => Verdict::NotOnGce { reason: r.clone() },
                _ => Verdict::ZoneUnknown {
                    reason: reason.clone(),
                },
            }
        }
        (Err(reason), _) => {
            return Verdict::Undetermined {
                reason: reason.clone(),
            }
        }
    };
    match compute {
        Some(c) => Verdict::of(c, &placement),
        None if !placement.is_zonal() => Verdict::NotZonal {
            location_type: placement.location_type,
        },
        None => Verdict::Skipped,
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
            data_locations: vec![],
        }
    }

    /// The shape real Rapid buckets (and our emulator) report: the region in upper case as
    /// the location, the zone in the data locations.
    fn rapid(region: &str, zone: &str) -> BucketPlacement {
        BucketPlacement {
            location: region.into(),
            location_type: "zone".into(),
            data_locations: vec![zone.into()],
        }
    }

    #[test]
    fn zone_comes_from_data_locations_or_a_zonal_location() {
        let b = rapid("US-CENTRAL1", "us-central1-a");
        assert_eq!(b.zone().as_deref(), Some("us-central1-a"));
        assert_eq!(
            zonal("US-CENTRAL1-A").zone().as_deref(),
            Some("us-central1-a")
        );
        assert_eq!(zonal("US-CENTRAL1").zone(), None);
        let here = ComputeZone::Zone("us-central1-a".into());
        assert_eq!(
            Verdict::of(&here, &b),
            Verdict::SameZone("us-central1-a".into())
        );
        let v = Verdict::of(&ComputeZone::Zone("us-central1-b".into()), &b);
        assert_eq!(
            v,
            Verdict::ZoneMismatch {
                compute: "us-central1-b".into(),
                bucket: "us-central1-a".into()
            }
        );
        assert!(matches!(
            Verdict::of(&here, &zonal("US-CENTRAL1")),
            Verdict::ZoneUnknown { .. }
        ));
    }

    #[test]
    fn bucket_type_overrides_and_failed_layouts() {
        let here = ComputeZone::Zone("us-central1-a".into());
        let denied: Result<BucketPlacement, String> = Err("permission denied".into());
        assert!(matches!(
            decide(Some(&here), &denied, BucketType::Auto),
            Verdict::Undetermined { .. }
        ));
        assert!(matches!(
            decide(Some(&here), &denied, BucketType::Zonal),
            Verdict::ZoneUnknown { .. }
        ));
        let regional = Ok(BucketPlacement {
            location: "US-CENTRAL1".into(),
            location_type: "region".into(),
            data_locations: vec![],
        });
        assert!(matches!(
            decide(None, &regional, BucketType::Auto),
            Verdict::NotZonal { .. }
        ));
        assert_eq!(
            decide(
                None,
                &Ok(rapid("US-CENTRAL1", "us-central1-a")),
                BucketType::Auto
            ),
            Verdict::Skipped
        );
    }

    #[test]
    fn loopback_endpoints() {
        assert!(endpoint_is_loopback("http://127.0.0.1:8099"));
        assert!(endpoint_is_loopback("https://localhost:443/"));
        assert!(endpoint_is_loopback("http://[::1]:80"));
        assert!(!endpoint_is_loopback("https://storage.googleapis.com"));
        assert!(!endpoint_is_loopback("http://10.0.0.1:80"));
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
            data_locations: vec![],
        };
        let v = Verdict::of(&ComputeZone::Zone("us-central1-a".into()), &regional);
        assert!(matches!(v, Verdict::NotZonal { .. }));
        assert!(!v.refuses(true));
    }
}
