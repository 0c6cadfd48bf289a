//! `rapidfs check BUCKET`: a doctor for users. Reports the credentials source, whether the
//! endpoint answers, the bucket's type and zone, this machine's zone and whether they match,
//! time-to-first-byte over 20 small reads, single-stream throughput over a 64 MiB read when an
//! object that large exists, and a verdict; `--json` prints the same as one JSON object.
//! A hard failure (credentials, endpoint, bucket) exits non-zero. Touches the bucket only
//! through `gcs::Client` and the metadata server only through `zonal`.

use super::access::AccessArgs;
use crate::cli::outln;
use crate::config::{Config, LogFormat};
use crate::gcs::{self, Client, ListRequest, ObjectMeta};
use crate::zonal::{self, ComputeZone, Verdict};
use anyhow::{anyhow, Context};
use clap::Args;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Small reads timed for time-to-first-byte.
const TTFB_READS: usize = 20;
/// Size of each of those reads.
const TTFB_READ_BYTES: u64 = 4096;
/// Size of the throughput read.
const THROUGHPUT_BYTES: u64 = 64 * 1024 * 1024;
/// Longest the connection may take: a dead endpoint must fail fast.
const CONNECT_TIMEOUT_MS: u64 = 3_000;
/// Longest a failing call is retried.
const RETRY_DEADLINE_MS: u64 = 10_000;

/// Flags of `rapidfs check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The bucket to check (its name, not `gs://`).
    pub bucket: String,
    /// Storage API endpoint (default https://storage.googleapis.com).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Workload profile whose keys lie under the config file's (as for `rapidfs mount`).
    #[arg(long, value_enum)]
    pub profile: Option<crate::profiles::Profile>,
    /// Print one JSON object instead of lines for people.
    #[arg(long)]
    pub json: bool,
    /// Credentials, TLS and zonal-check flags.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// What the check found, line by line; `None` where it did not get that far.
#[derive(Default)]
struct Findings {
    endpoint: String,
    credentials: Option<String>,
    connect_ms: Option<f64>,
    bucket: Option<Value>,
    compute: Option<Value>,
    placement: Option<(String, String)>,
    ttfb: Option<Value>,
    throughput: Option<Value>,
    failure: Option<String>,
}

/// Runs the check and prints the findings; an error means a hard failure (already printed).
pub fn run(
    args: CheckArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let mut cfg = Config::load_with_profile(args.config.as_deref(), args.profile)?;
    if let Some(e) = &args.endpoint {
        cfg.gcs.endpoint = e.clone();
    }
    args.access.apply(&mut cfg);
    cfg.cache.memory_mb = cfg.cache.budget_mb();
    cfg.validate().map_err(|e| anyhow!("configuration: {e}"))?;
    // What a mount with the same file and flags would run with, before the check's own
    // shorter deadlines below.
    let effective = cfg.clone();
    cfg.gcs.connect_timeout_ms = cfg.gcs.connect_timeout_ms.min(CONNECT_TIMEOUT_MS);
    cfg.gcs.retry_deadline_ms = cfg.gcs.retry_deadline_ms.min(RETRY_DEADLINE_MS);
    // Logs only when asked for: the report is the output.
    super::init_logging(
        log_level.as_deref().unwrap_or("off"),
        log_format.unwrap_or(LogFormat::Text),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let findings = rt.block_on(examine(&args.bucket, &cfg));
    if args.json {
        let mut v = to_json(&args.bucket, &findings);
        v["configuration"] = serde_json::to_value(&effective).unwrap_or_default();
        outln!("{v}");
    } else {
        print_text(&args.bucket, &findings);
        print_configuration(&effective);
    }
    match findings.failure {
        Some(f) => Err(anyhow!("check of bucket '{}' failed: {f}", args.bucket)),
        None => Ok(()),
    }
}

async fn examine(bucket: &str, cfg: &Config) -> Findings {
    let mut f = Findings {
        endpoint: cfg.gcs.endpoint.clone(),
        ..Findings::default()
    };
    let started = Instant::now();
    let client = match Client::connect(&cfg.gcs).await {
        Ok(c) => c,
        Err(e) => {
            f.failure = Some(e.to_string());
            return f;
        }
    };
    f.credentials = Some(client.credentials_source().to_string());
    f.connect_ms = Some(ms(started.elapsed()));
    let page = client
        .list_page(
            bucket,
            &ListRequest {
                page_size: 1000,
                ..ListRequest::default()
            },
        )
        .await;
    let objects = match page {
        // An upload's aside object may still be growing, or vanish mid-read when moved.
        Ok(p) => p
            .objects
            .into_iter()
            .filter(|o| !gcs::is_aside_name(o.name.rsplit('/').next().unwrap_or_default()))
            .collect::<Vec<_>>(),
        Err(gcs::Error::NotFound(_)) => {
            f.failure = Some(format!("bucket '{bucket}' not found at {}", f.endpoint));
            return f;
        }
        Err(e) => {
            f.failure = Some(format!("cannot list bucket '{bucket}': {e}"));
            return f;
        }
    };
    let report = zonal::check(&client, bucket, &cfg.zonal).await;
    f.bucket = Some(match &report.bucket {
        Ok(p) => json!({
            "zonal": p.is_zonal(),
            "location_type": p.location_type,
            "location": p.location,
            "zone": p.zone(),
        }),
        Err(e) => json!({ "error": e }),
    });
    f.compute = Some(match &report.compute {
        Some(ComputeZone::Zone(z)) => json!({ "on_gce": true, "zone": z }),
        Some(ComputeZone::NotOnGce(why)) => json!({ "on_gce": false, "reason": why }),
        None => json!({ "on_gce": null, "reason": "local endpoint and GCE_METADATA_HOST unset" }),
    });
    let v = &report.verdict;
    f.placement = Some((placement_word(v).to_string(), v.message()));
    if v.refuses(cfg.zonal.require_same_zone) {
        f.failure = Some(format!("{} (--require-same-zone)", v.message()));
    }
    f.ttfb = Some(ttfb(&client, bucket, &objects).await);
    f.throughput = Some(throughput(&client, bucket, &objects).await);
    f
}

/// A one-word summary of the zonal verdict.
fn placement_word(v: &Verdict) -> &'static str {
    match v {
        Verdict::SameZone(_) => "same-zone",
        Verdict::ZoneMismatch { .. } => "zone-mismatch",
        Verdict::NotOnGce { .. } => "not-on-gce",
        Verdict::NotZonal { .. } => "not-zonal",
        Verdict::ZoneUnknown { .. } => "zone-unknown",
        Verdict::Undetermined { .. } => "undetermined",
        Verdict::Skipped => "skipped",
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Time-to-first-byte of 20 small reads of the smallest non-empty object, on one stream.
async fn ttfb(client: &Client, bucket: &str, objects: &[ObjectMeta]) -> Value {
    let Some(obj) = objects.iter().filter(|o| o.size > 0).min_by_key(|o| o.size) else {
        return json!({ "skipped": "the bucket has no non-empty object (other than uploads' aside objects) in its first listing page" });
    };
    let reader = match client.open_reader(bucket, &obj.name, None).await {
        Ok(r) => r,
        Err(e) => return json!({ "error": format!("opening {}: {e}", obj.name) }),
    };
    let mut times = Vec::with_capacity(TTFB_READS);
    for _ in 0..TTFB_READS {
        let t = Instant::now();
        let mut stream = Box::pin(reader.read_stream(0, TTFB_READ_BYTES.min(obj.size)));
        match stream.next().await {
            Some(Ok(_)) => times.push(t.elapsed()),
            Some(Err(e)) => return json!({ "error": format!("reading {}: {e}", obj.name) }),
            None => return json!({ "error": format!("reading {}: no data", obj.name) }),
        }
    }
    times.sort();
    let pick = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    json!({
        "object": obj.name,
        "reads": TTFB_READS,
        "read_bytes": TTFB_READ_BYTES.min(obj.size),
        "p50_ms": ms(pick(0.5)),
        "p99_ms": ms(pick(0.99)),
    })
}

/// Single-stream throughput over the first 64 MiB of an object at least that large.
async fn throughput(client: &Client, bucket: &str, objects: &[ObjectMeta]) -> Value {
    let Some(obj) = objects.iter().find(|o| o.size >= THROUGHPUT_BYTES) else {
        return json!({ "skipped": "no object of 64 MiB or more in the first listing page" });
    };
    let reader = match client.open_reader(bucket, &obj.name, None).await {
        Ok(r) => r,
        Err(e) => return json!({ "error": format!("opening {}: {e}", obj.name) }),
    };
    let t = Instant::now();
    let mut got = 0u64;
    let mut stream = Box::pin(reader.read_stream(0, THROUGHPUT_BYTES));
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(b) => got += b.len() as u64,
            Err(e) => return json!({ "error": format!("reading {}: {e}", obj.name) }),
        }
    }
    let secs = t.elapsed().as_secs_f64().max(1e-9);
    json!({
        "object": obj.name,
        "bytes": got,
        "seconds": (secs * 1e3).round() / 1e3,
        "mib_per_s": ((got as f64 / (1024.0 * 1024.0) / secs) * 10.0).round() / 10.0,
    })
}

/// The verdict line: FAILED on a hard failure, WARNING when the placement costs latency or
/// money, OK otherwise.
fn verdict(f: &Findings) -> (String, String) {
    if let Some(fail) = &f.failure {
        return ("FAILED".into(), fail.clone());
    }
    match &f.placement {
        Some((word, msg))
            if word == "zone-mismatch" || word == "not-zonal" || word == "undetermined" =>
        {
            ("WARNING".into(), msg.clone())
        }
        _ => ("OK".into(), "the bucket is reachable and readable".into()),
    }
}

fn to_json(bucket: &str, f: &Findings) -> Value {
    let (status, why) = verdict(f);
    json!({
        "bucket": bucket,
        "endpoint": f.endpoint,
        "credentials": f.credentials,
        "reachable": f.connect_ms.is_some(),
        "connect_ms": f.connect_ms,
        "bucket_placement": f.bucket,
        "compute": f.compute,
        "placement": f.placement.as_ref().map(|(w, m)| json!({ "result": w, "message": m })),
        "ttfb": f.ttfb,
        "throughput": f.throughput,
        "verdict": { "status": status, "message": why },
    })
}

/// Describes one JSON finding in words.
fn describe(v: &Value) -> String {
    if let Some(s) = v.get("skipped").and_then(Value::as_str) {
        return format!("skipped: {s}");
    }
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        return format!("error: {e}");
    }
    v.to_string()
}

/// The configuration a mount with the same file, profile and flags runs with, as TOML.
fn print_configuration(cfg: &Config) {
    let profile = cfg.profile.map_or("none", |p| p.name());
    outln!("\neffective configuration (profile: {profile}):");
    match toml::to_string(cfg) {
        Ok(text) => text.lines().for_each(|l| outln!("  {l}")),
        Err(e) => outln!("  (cannot print: {e})"),
    }
}

fn print_text(bucket: &str, f: &Findings) {
    let line = |k: &str, v: String| outln!("{k:<14} {v}");
    line("bucket:", format!("{bucket} at {}", f.endpoint));
    match &f.credentials {
        Some(c) => line("credentials:", c.clone()),
        None => line("credentials:", "not established".into()),
    }
    match f.connect_ms {
        Some(ms) => line("endpoint:", format!("reachable (connected in {ms} ms)")),
        None => line("endpoint:", "not reached".into()),
    }
    if let Some(b) = &f.bucket {
        let text = match (b.get("zonal").and_then(Value::as_bool), b.get("error")) {
            (_, Some(e)) => format!("unknown ({})", e.as_str().unwrap_or_default()),
            (Some(true), _) => format!(
                "zonal (Rapid), zone {}",
                b.get("zone").and_then(Value::as_str).unwrap_or("unknown")
            ),
            _ => format!(
                "not zonal (location type {}, location {})",
                b["location_type"], b["location"]
            ),
        };
        line("bucket type:", text);
    }
    if let Some(c) = &f.compute {
        let text = match c.get("zone").and_then(Value::as_str) {
            Some(z) => z.to_string(),
            None => format!(
                "not on GCE ({})",
                c.get("reason").and_then(Value::as_str).unwrap_or_default()
            ),
        };
        line("compute zone:", text);
    }
    if let Some((word, msg)) = &f.placement {
        line("placement:", format!("{word}: {msg}"));
    }
    if let Some(t) = &f.ttfb {
        let text = match (t.get("p50_ms"), t.get("p99_ms")) {
            (Some(p50), Some(p99)) => format!(
                "p50 {p50} ms, p99 {p99} ms over {TTFB_READS} reads of {} B of {}",
                t["read_bytes"],
                t["object"].as_str().unwrap_or_default()
            ),
            _ => describe(t),
        };
        line("first byte:", text);
    }
    if let Some(t) = &f.throughput {
        let text = match t.get("mib_per_s") {
            Some(rate) => format!(
                "{rate} MiB/s single stream over 64 MiB of {}",
                t["object"].as_str().unwrap_or_default()
            ),
            None => describe(t),
        };
        line("throughput:", text);
    }
    let (status, why) = verdict(f);
    line("verdict:", format!("{status}: {why}"));
}
