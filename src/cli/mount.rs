//! `rapidfs mount BUCKET MOUNTPOINT`: mount a bucket and serve it until unmounted.

use crate::config::LogFormat;
use clap::Args;
use std::path::PathBuf;

/// Flags of `rapidfs mount`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The bucket to mount (its name, not `gs://`).
    pub bucket: String,
    /// The empty directory to mount it on.
    pub mountpoint: PathBuf,
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// Mounts and serves until unmounted or signalled.
pub fn run(
    args: MountArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let _ = (log_level, log_format);
    anyhow::bail!("mount of {} is not built yet", args.bucket)
}
