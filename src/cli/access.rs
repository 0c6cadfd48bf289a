//! The flags `rapidfs mount` and `rapidfs check` share for reaching a real bucket: TLS trust,
//! credentials and the zonal check. Only moves flag values into the `Config`.

use crate::config::{BucketType, Config};
use clap::Args;
use std::path::PathBuf;

/// Credentials, TLS and zonal-check flags.
#[derive(Debug, Args, Default, Clone)]
pub struct AccessArgs {
    /// PEM file of extra CA certificates to trust for https:// endpoints (on top of the system's).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Credentials JSON (service account key or gcloud user credentials) instead of Application Default Credentials.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,
    /// Send no credentials (public buckets).
    #[arg(long)]
    pub anonymous: bool,
    /// Refuse to mount when this machine and the bucket are in different zones.
    #[arg(long)]
    pub require_same_zone: bool,
    /// Bucket type when GetStorageLayout is denied or unreliable (default: auto).
    #[arg(long, value_enum)]
    pub bucket_type: Option<BucketType>,
}

impl AccessArgs {
    /// Flags win over the config file.
    pub fn apply(&self, cfg: &mut Config) {
        if self.ca_file.is_some() {
            cfg.gcs.ca_file = self.ca_file.clone();
        }
        if self.key_file.is_some() {
            cfg.gcs.credentials_file = self.key_file.clone();
        }
        cfg.gcs.anonymous |= self.anonymous;
        cfg.zonal.require_same_zone |= self.require_same_zone;
        if let Some(t) = self.bucket_type {
            cfg.zonal.bucket_type = t;
        }
    }
}
