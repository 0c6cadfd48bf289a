//! `rapidfs emulator`: serve a directory (or memory) as buckets over the GCS gRPC API.

use crate::config::LogFormat;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Flags of `rapidfs emulator`.
#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Directory whose subdirectories are buckets and whose files are objects.
    #[arg(long)]
    pub root: PathBuf,
    /// Address to listen on; loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1:8099")]
    pub listen: SocketAddr,
    /// Zone reported by GetStorageLayout and GetBucket.
    #[arg(long, default_value = "us-central1-a")]
    pub zone: String,
    /// Hold objects in memory (any names; nothing survives a restart).
    #[arg(long)]
    pub memory: bool,
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
    anyhow::bail!(
        "the emulator over {} is not built yet ({args:?})",
        args.root.display()
    )
}
