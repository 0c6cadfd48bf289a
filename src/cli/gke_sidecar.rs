//! `rapidfs gke-sidecar`: the entrypoint of a rapidfs image run as the `gke-gcsfuse-sidecar`
//! container of GKE's managed Cloud Storage FUSE CSI driver.
//!
//! For each volume of the pod, the driver's node server has mounted `/dev/fuse` on the pod's
//! volume path itself and listens on `<tmp>/.volumes/<volume>/socket`. At start the sidecar
//! connects to each socket once and receives one message: JSON (bucket and gcsfuse-style
//! options) with the descriptor. It serves every volume from this one unprivileged process.
//! A volume that fails (missing bucket, denied access, bad option) gets its message in its
//! `error` file, which fails that volume's mount in the pod's events; the others still serve.
//! SIGTERM (a native sidecar), SIGINT or the `exit` file (a regular sidecar container in a
//! Job) end it: writes are made durable first, then it exits 0.

use super::gke_options;
use super::mount::{check_fuse_fd, connect, daemon_runtime, stop_signals, ConnectError};
use crate::config::{Config, LogFormat};
use crate::fuse::{Driver, Mounted};
use crate::machine::Serving;
use clap::Args;
use serde::Deserialize;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often a regular (not native) sidecar looks for the exit file.
const EXIT_FILE_POLL: Duration = Duration::from_secs(1);
/// The least memory budget a volume gets when the process's is shared out.
const MIN_VOLUME_MEMORY_MB: u64 = 64;

/// Flags of `rapidfs gke-sidecar`.
#[derive(Debug, Args)]
pub struct GkeSidecarArgs {
    /// Verbosity the driver passes to every sidecar image (`--v=5`); accepted and ignored (see --log-level and logging:severity).
    #[arg(long = "v", value_name = "N")]
    pub verbosity: Option<u32>,
    /// TOML configuration file; each volume's options override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Storage API endpoint (default https://storage.googleapis.com; http://HOST:PORT for an emulator).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The directory the node server shares with the sidecar (its volume sockets, error and exit files).
    #[arg(long, env = "RAPIDFS_GKE_TMP", default_value = "/gcsfuse-tmp")]
    pub tmp_dir: PathBuf,
    /// The directory for local staging files of rewritten files (one subdirectory per volume).
    #[arg(long, env = "RAPIDFS_GKE_BUFFER", default_value = "/gcsfuse-buffer")]
    pub buffer_dir: PathBuf,
    /// Credentials, TLS and zonal-check flags.
    #[command(flatten)]
    pub access: super::access::AccessArgs,
}

/// What the node server sends with the descriptor.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Offer {
    bucket_name: String,
    #[serde(default)]
    options: Vec<String>,
}

/// One volume of the pod, as far as it got.
struct Volume {
    name: String,
    dir: PathBuf,
}

impl Volume {
    /// Tells the node why this volume cannot be served: the error file, and the log.
    fn fail(&self, why: &str) {
        let line = format!("failed to mount volume {:?}: {why}", self.name);
        tracing::error!(volume = %self.name, "{line}");
        if let Err(e) = std::fs::write(self.dir.join("error"), format!("{line}\n")) {
            tracing::error!(volume = %self.name, error = %e, "cannot write the error file");
        }
    }
}

/// A volume whose descriptor and options arrived and made sense.
struct Ready {
    volume: Volume,
    bucket: String,
    cfg: Config,
    applied: gke_options::Applied,
    fd: OwnedFd,
}

/// Receives every volume, serves those that work, and waits for the end.
pub fn run(args: GkeSidecarArgs, log_level: Option<String>) -> anyhow::Result<()> {
    let mut base = Config::load_or_default(args.config.as_deref())?;
    if let Some(e) = &args.endpoint {
        base.gcs.endpoint = e.clone();
    }
    args.access.apply(&mut base);
    base.validate()
        .map_err(|e| anyhow::anyhow!("configuration: {e}"))?;
    // As gcsfuse under the driver: files belong to root unless the options say otherwise
    // (the sidecar's own uid, 65534, would lock every non-root writer out).
    base.fs.uid.get_or_insert(0);
    base.fs.gid.get_or_insert(0);
    let volumes_dir = args.tmp_dir.join(".volumes");
    // Everything the node offers is taken before logging starts, so that the most verbose
    // `logging:severity` among the volumes sets the level; failures are reported after.
    let mut ready = Vec::new();
    let mut failed = Vec::new();
    for volume in offered_volumes(&volumes_dir) {
        match prepare(&volume, &base, &args.buffer_dir) {
            Ok(r) => ready.push(r),
            Err(why) => failed.push((volume, why)),
        }
    }
    // One process serves every volume: the memory budget is the process's, shared out.
    let shares = u64::try_from(ready.len()).unwrap_or(1).max(1);
    for r in &mut ready {
        r.cfg.cache.memory_mb = (base.cache.budget_mb() / shares).max(MIN_VOLUME_MEMORY_MB);
    }
    let level = log_level
        .or_else(|| most_verbose(ready.iter().filter_map(|r| r.applied.log_level.as_deref())))
        .unwrap_or_else(|| base.log.level.clone());
    super::init_logging_to(&level, LogFormat::Json, false, std::io::stdout);
    tracing::info!(version = env!("CARGO_PKG_VERSION"), volumes = %volumes_dir.display(), "rapidfs GKE sidecar starting");
    if ready.is_empty() && failed.is_empty() {
        tracing::warn!(volumes = %volumes_dir.display(), "no volume sockets found: nothing to serve");
    }
    for (volume, why) in &failed {
        volume.fail(why);
    }
    let rt = daemon_runtime(Serving::Volumes)?;
    let (mut sigint, mut sigterm) = stop_signals(&rt)?;
    let metrics = metrics_handle(&rt, &ready, &base);
    // Buckets are checked all at once: one that does not answer delays no other volume.
    let connected = rt.block_on(futures::future::join_all(
        ready.iter().map(|r| connect(&r.bucket, &r.cfg)),
    ));
    let mut served = Vec::new();
    let mut metrics_served = false;
    for (r, conn) in ready.into_iter().zip(connected) {
        // The text is the whole process's: served on one volume's socket, so a node that
        // scrapes every volume does not count it twice.
        let metrics = metrics
            .as_ref()
            .filter(|_| r.applied.metrics && !metrics_served);
        if let Some(m) = serve(&rt, r, conn, metrics) {
            metrics_served |= metrics.is_some();
            served.push(m);
        }
    }
    let native = native_sidecar();
    tracing::info!(
        served = served.len(),
        native,
        "waiting for SIGTERM or the exit file"
    );
    let exit_file = volumes_dir.join("exit");
    rt.block_on(async {
        loop {
            tokio::select! {
                _ = sigint.recv() => break tracing::info!("SIGINT received"),
                _ = sigterm.recv() => {
                    if native {
                        break tracing::info!("SIGTERM received");
                    }
                    // A regular sidecar container gets SIGTERM with the pod's other
                    // containers, which may still be writing: it makes what they appended
                    // durable and goes on serving until the exit file says they ended.
                    for (_, mounted) in &served {
                        mounted.sync_writes().await;
                    }
                    tracing::info!("SIGTERM received: appended bytes made durable, serving on until the exit file");
                }
                _ = appears(&exit_file), if !native => {
                    tracing::info!("exit file found: the pod's other containers have ended");
                    let _ = std::fs::remove_file(&exit_file);
                    break;
                }
            }
        }
    });
    for (name, mounted) in &served {
        rt.block_on(mounted.stop_writes());
        tracing::info!(volume = %name, "writes made durable");
    }
    for (name, mounted) in served {
        if let Err(e) = mounted.unmount() {
            tracing::warn!(volume = %name, error = %e, "stopping the volume failed");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// The volumes whose sockets the node server listens on, in name order. The node server
/// creates them before the sidecar starts and never again, so one look suffices.
fn offered_volumes(volumes_dir: &Path) -> Vec<Volume> {
    let Ok(entries) = std::fs::read_dir(volumes_dir) else {
        return Vec::new();
    };
    let mut volumes: Vec<Volume> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| dir.join("socket").exists())
        .map(|dir| Volume {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            dir,
        })
        .collect();
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    volumes
}

/// Takes the volume's descriptor and message, and maps its options onto the config.
fn prepare(volume: &Volume, base: &Config, buffer_dir: &Path) -> Result<Ready, String> {
    let socket = volume.dir.join("socket");
    let (message, fd) = crate::fuse::receive_message(&socket)
        .map_err(|e| format!("cannot receive the mount from {}: {e}", socket.display()))?;
    // The node server is done with it; a restarted sidecar finds no stale socket.
    let _ = std::fs::remove_file(&socket);
    check_fuse_fd(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        "the received descriptor",
    )
    .map_err(|e| e.to_string())?;
    let offer: Offer = serde_json::from_slice(&message)
        .map_err(|e| format!("the node server's message is not the expected JSON: {e}"))?;
    if offer.bucket_name.is_empty() {
        return Err("the node server's message names no bucket".to_string());
    }
    let mut cfg = base.clone();
    if cfg.write.staging_dir.is_empty() {
        let staging = buffer_dir
            .join(".volumes")
            .join(&volume.name)
            .join("staging");
        cfg.write.staging_dir = staging.to_string_lossy().into_owned();
    }
    let applied = gke_options::apply(&offer.options, &mut cfg)?;
    cfg.validate()
        .map_err(|e| format!("the volume's mount options: {e}"))?;
    Ok(Ready {
        volume: Volume {
            name: volume.name.clone(),
            dir: volume.dir.clone(),
        },
        bucket: offer.bucket_name,
        cfg,
        applied,
        fd,
    })
}

/// Serves the volume's descriptor once its bucket answered; on failure, fills its error file
/// in the words the driver matches ("bucket doesn't exist", "googleapi: Error 403").
fn serve(
    rt: &tokio::runtime::Runtime,
    r: Ready,
    connected: Result<(crate::fs::Fs, crate::zonal::Verdict), ConnectError>,
    metrics: Option<&metrics_exporter_prometheus::PrometheusHandle>,
) -> Option<(String, Mounted)> {
    let Ready {
        volume,
        bucket,
        cfg,
        applied,
        fd,
    } = r;
    for line in &applied.ignored {
        tracing::info!(volume = %volume.name, "option accepted without effect: {line}");
    }
    let fs = match connected {
        Ok((fs, zonal)) => {
            zonal.log();
            fs
        }
        Err(e) => {
            let why = match &e {
                ConnectError::NoBucket { .. } => format!("bucket doesn't exist: {e}"),
                ConnectError::Denied { .. } => format!("googleapi: Error 403: {e}"),
                _ => e.to_string(),
            };
            volume.fail(&why);
            return None;
        }
    };
    let mounted = match Mounted::serve_fd(fs, Driver::Workers(rt.handle().clone()), fd) {
        Ok(m) => m,
        Err(e) => {
            volume.fail(&format!("cannot serve the /dev/fuse descriptor: {e}"));
            return None;
        }
    };
    if let Some(handle) = metrics {
        let path = volume.dir.join("metrics.sock");
        let _guard = rt.enter();
        match crate::metrics::serve_unix(&path, handle.clone()) {
            Ok(()) => {
                tracing::info!(volume = %volume.name, socket = %path.display(), "serving metrics")
            }
            // Metrics are optional: the volume still serves.
            Err(e) => tracing::warn!(volume = %volume.name, error = %e, "no metrics"),
        }
    }
    tracing::info!(
        volume = %volume.name,
        bucket = %bucket,
        only_dir = cfg.fs.only_dir.as_deref().unwrap_or(""),
        endpoint = %cfg.gcs.endpoint,
        "serving"
    );
    Some((volume.name, mounted))
}

/// The metrics recorder, when any volume serves metrics.
fn metrics_handle(
    rt: &tokio::runtime::Runtime,
    ready: &[Ready],
    base: &Config,
) -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    if !ready.iter().any(|r| r.applied.metrics) {
        return None;
    }
    let _guard = rt.enter();
    match crate::metrics::install() {
        Ok(handle) => {
            crate::metrics::sample_memory(base.cache.budget_mb() * 1024 * 1024);
            Some(handle)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no metrics");
            None
        }
    }
}

/// Resolves once `path` exists.
async fn appears(path: &Path) {
    let mut tick = tokio::time::interval(EXIT_FILE_POLL);
    loop {
        tick.tick().await;
        if path.exists() {
            return;
        }
    }
}

/// The driver sets `NATIVE_SIDECAR=TRUE` on a native sidecar (an init container that
/// Kubernetes itself stops with SIGTERM); a regular sidecar container watches the exit file.
fn native_sidecar() -> bool {
    std::env::var("NATIVE_SIDECAR")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "t" | "true"))
}

/// The most verbose of tracing levels.
fn most_verbose<'a>(levels: impl Iterator<Item = &'a str>) -> Option<String> {
    const ORDER: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    levels
        .min_by_key(|l| ORDER.iter().position(|o| o == l).unwrap_or(ORDER.len()))
        .map(str::to_string)
}
