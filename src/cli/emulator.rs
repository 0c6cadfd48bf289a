//! `rapidfs emulator`: serve a directory (or memory) as buckets over the GCS gRPC API.
//! Parses the flags and the optional `--config` file (`[emulator]` and `[emulator.faults]`),
//! binds the address, prints the endpoint, and serves until SIGINT or SIGTERM.

use crate::config::LogFormat;
use crate::emulator::{
    serve_secure, Emulator, EmulatorOptions, Faults, Security, ServerTls, StatsSnapshot,
    MAX_FLOW_WINDOW_KIB,
};
use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Flags of `rapidfs emulator`.
#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Directory whose subdirectories are buckets and whose files are objects (with
    /// --memory: preloaded into memory, never written back).
    #[arg(long)]
    pub root: Option<PathBuf>,
    /// Address to listen on; loopback unless told otherwise.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Zone reported by GetStorageLayout and GetBucket.
    #[arg(long)]
    pub zone: Option<String>,
    /// Hold objects in memory (any names; nothing survives a restart).
    #[arg(long)]
    pub memory: bool,
    /// TOML file with an `[emulator]` table (root, listen, zone, memory) and
    /// `[emulator.faults]` (the fault flags below); flags win over it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Delay added to every response message and unary call, in microseconds.
    #[arg(long)]
    pub latency_us: Option<u64>,
    /// End each read stream with UNAVAILABLE after it has sent this many payload bytes.
    #[arg(long)]
    pub cut_read_after_bytes: Option<u64>,
    /// End each write stream with UNAVAILABLE when its payload would cross this many bytes.
    #[arg(long)]
    pub cut_write_after_bytes: Option<u64>,
    /// Fail every k-th call (unary calls and stream opens) with UNAVAILABLE.
    #[arg(long)]
    pub unavailable_every: Option<u64>,
    /// Redirect (ABORTED with routing token and handle) every k-th bidi stream open.
    #[arg(long)]
    pub redirect_every: Option<u64>,
    /// Random chunk sizes, interleaved read_ids, trailing empty chunks.
    #[arg(long)]
    pub chaos: bool,
    /// HTTP/2 flow-control window of each stream, in KiB (1-32768; four times that for a
    /// connection), instead of the large one loopback affords.
    #[arg(long)]
    pub flow_window_kib: Option<u32>,
    /// Serve TLS with this PEM certificate (needs --tls-key); the endpoint becomes https://.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Refuse calls without `authorization: Bearer TOKEN` (may be repeated).
    #[arg(long, value_name = "TOKEN")]
    pub require_token: Vec<String>,
    /// On each SIGUSR1, write the counters of what was served (calls, bytes sent, ...) as
    /// JSON to this file (replaced atomically), for benchmark scripts.
    #[arg(long, value_name = "FILE")]
    pub stats_file: Option<PathBuf>,
}

/// The `--config` file: only the `[emulator]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ConfigFile {
    emulator: EmulatorSection,
}

/// The `[emulator]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct EmulatorSection {
    root: Option<PathBuf>,
    listen: Option<SocketAddr>,
    zone: Option<String>,
    memory: bool,
    faults: Faults,
}

/// The listen address when neither a flag nor the file says.
const DEFAULT_LISTEN: &str = "127.0.0.1:8099";
/// How long open connections may finish after SIGINT/SIGTERM.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// The zone when neither a flag nor the file says.
const DEFAULT_ZONE: &str = "us-central1-a";

fn read_config(path: &Path) -> anyhow::Result<EmulatorSection> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let file: ConfigFile = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("config {}: {}", path.display(), e.message()))?;
    Ok(file.emulator)
}

/// Flags over the file over the defaults.
fn resolve(args: EmulatorArgs) -> anyhow::Result<(EmulatorOptions, SocketAddr)> {
    let file = match &args.config {
        Some(p) => read_config(p)?,
        None => EmulatorSection::default(),
    };
    let mut faults = file.faults;
    if let Some(v) = args.latency_us {
        faults.latency_us = v;
    }
    if args.cut_read_after_bytes.is_some() {
        faults.cut_read_after_bytes = args.cut_read_after_bytes;
    }
    if args.cut_write_after_bytes.is_some() {
        faults.cut_write_after_bytes = args.cut_write_after_bytes;
    }
    if args.unavailable_every.is_some() {
        faults.unavailable_every = args.unavailable_every;
    }
    if args.redirect_every.is_some() {
        faults.redirect_every = args.redirect_every;
    }
    faults.chaos |= args.chaos;
    if args.flow_window_kib.is_some() {
        faults.flow_window_kib = args.flow_window_kib;
    }
    if let Some(kib) = faults.flow_window_kib {
        anyhow::ensure!(
            (1..=MAX_FLOW_WINDOW_KIB).contains(&kib),
            "flow_window_kib must be between 1 and {MAX_FLOW_WINDOW_KIB}, not {kib}"
        );
    }
    for (name, k) in [
        ("unavailable_every", faults.unavailable_every),
        ("redirect_every", faults.redirect_every),
    ] {
        anyhow::ensure!(k != Some(0), "{name} must be at least 1");
    }
    let memory = args.memory || file.memory;
    let root = args.root.or(file.root);
    if root.is_none() && !memory {
        anyhow::bail!("missing --root DIR (the directory to serve), or use --memory");
    }
    if let Some(r) = &root {
        let meta = std::fs::metadata(r)
            .with_context(|| format!("root directory {} is not usable", r.display()))?;
        anyhow::ensure!(meta.is_dir(), "root {} is not a directory", r.display());
    }
    let listen = match args.listen.or(file.listen) {
        Some(l) => l,
        None => DEFAULT_LISTEN.parse()?,
    };
    let zone = args
        .zone
        .or(file.zone)
        .unwrap_or_else(|| DEFAULT_ZONE.to_string());
    Ok((
        EmulatorOptions {
            root,
            memory,
            zone,
            faults,
        },
        listen,
    ))
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs the emulator until SIGINT or SIGTERM.
pub fn run(
    args: EmulatorArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    super::init_logging(
        log_level.as_deref().unwrap_or("info"),
        log_format.unwrap_or(LogFormat::Text),
    );
    let security = Security {
        tls: match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls::from_files(cert, key)?),
            _ => None,
        },
        tokens: args.require_token.clone(),
    };
    let scheme = if security.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let stats_file = args.stats_file.clone();
    let (opts, listen) = resolve(args)?;
    let runtime = crate::machine::serving_runtime("emulator", crate::machine::Serving::Emulator)
        .context("cannot start the async runtime")?;
    if let Some(path) = stats_file {
        return runtime.block_on(serve_with_stats(opts, listen, security, scheme, path));
    }
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("cannot listen on {listen}"))?;
        let addr = listener.local_addr()?;
        let what = match (&opts.root, opts.memory) {
            (Some(r), false) => format!("directory {}", r.display()),
            (Some(r), true) => format!("memory, preloaded from {}", r.display()),
            (None, _) => "memory".to_string(),
        };
        println!(
            "rapidfs emulator listening on {scheme}://{addr} ({what}, zone {})",
            opts.zone
        );
        let _ = std::io::stdout().flush();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = serve_secure(listener, opts, security, async move {
            let _ = stopped.await;
        });
        tokio::pin!(server);
        tokio::select! {
            result = &mut server => result,
            _ = stop_signal() => {
                let _ = stop.send(());
                // Idle client connections must not keep us alive: a short grace, then exit.
                tokio::time::timeout(SHUTDOWN_GRACE, server).await.unwrap_or(Ok(()))
            }
        }
    })
}

/// `run` with counters: the in-process emulator, whose counters go to `path` at each SIGUSR1.
async fn serve_with_stats(
    opts: EmulatorOptions,
    listen: SocketAddr,
    security: Security,
    scheme: &str,
    path: PathBuf,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut usr1 = signal(SignalKind::user_defined1()).context("cannot catch SIGUSR1")?;
    let what = match (&opts.root, opts.memory) {
        (Some(r), false) => format!("directory {}", r.display()),
        (Some(r), true) => format!("memory, preloaded from {}", r.display()),
        (None, _) => "memory".to_string(),
    };
    let zone = opts.zone.clone();
    let emulator = Emulator::start_secure(opts, listen, security).await?;
    println!(
        "rapidfs emulator listening on {scheme}://{} ({what}, zone {zone}, stats to {} on SIGUSR1)",
        emulator.addr(),
        path.display()
    );
    let _ = std::io::stdout().flush();
    let stop = stop_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = usr1.recv() => {
                if let Err(e) = write_stats(&emulator.stats(), &path) {
                    tracing::warn!("cannot write stats to {}: {e:#}", path.display());
                }
            }
            _ = &mut stop => break,
        }
    }
    emulator.shutdown().await;
    Ok(())
}

/// Replaces `path` with the counters as JSON (written aside, then renamed).
fn write_stats(stats: &StatsSnapshot, path: &Path) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(stats)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}
