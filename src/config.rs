//! Every tunable of rapidfs in one serde struct, with its default and a one-line doc.
//!
//! `config/rapidfs.toml` is the annotated example. A profile's keys (`profile = ...` in the
//! file, or `--profile`) come first, the TOML file overrides them, and the command-line flags
//! override both. Unknown keys are errors so a typo never goes unnoticed.

use crate::profiles::{overlay, Profile};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A TTL in milliseconds as a duration, at most [`crate::profiles::FOREVER_MS`] (longer ones
/// would overflow the caches' clocks).
pub fn ttl(ms: u64) -> std::time::Duration {
    std::time::Duration::from_millis(ms.min(crate::profiles::FOREVER_MS))
}

/// The whole configuration of a rapidfs daemon.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The workload profile whose keys lie under the file's (`aiml-training`, `aiml-serving`, `aiml-checkpointing`); unset means none.
    pub profile: Option<Profile>,
    /// The connection to the storage service.
    pub gcs: GcsConfig,
    /// The one memory budget and the block cache inside it.
    pub cache: CacheConfig,
    /// Filesystem semantics: ownership, modes, metadata caches.
    pub fs: FsConfig,
    /// The read path: streams and read-ahead.
    pub read: ReadConfig,
    /// The write path: streaming appends.
    pub write: WriteConfig,
    /// Logging.
    pub log: LogConfig,
    /// The Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// The zonal placement check at mount and in `rapidfs check`.
    pub zonal: ZonalConfig,
}

/// The connection to the storage service and the retry policy of every call.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GcsConfig {
    /// Where the Storage API lives: `https://HOST[:PORT]` (TLS + credentials) or `http://HOST:PORT` (plaintext, no credentials, for the emulator).
    pub endpoint: String,
    /// Time allowed to establish the HTTP/2 connection, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Deadline of one unary call (GetObject, ListObjects, ...), in milliseconds.
    pub call_timeout_ms: u64,
    /// Total time a call or a stream keeps retrying before its caller gets an error, in milliseconds.
    pub retry_deadline_ms: u64,
    /// First backoff between retries, in milliseconds; doubled each attempt, with jitter.
    pub initial_backoff_ms: u64,
    /// Largest backoff between retries, in milliseconds.
    pub max_backoff_ms: u64,
    /// A read stream with ranges outstanding that receives nothing for this long, or a write
    /// stream that neither answers nor takes more bytes for this long (plus as long again for
    /// every 2 MiB sent and not yet persisted), is reconnected, in milliseconds.
    pub stall_timeout_ms: u64,
    /// HTTP/2 connections per client for its unary calls, and as many again for its bidi read
    /// and write streams; each kind is spread over its connections round robin.
    pub connections: usize,
    /// Initial HTTP/2 flow-control window of each stream, in KiB (1 to 2097151: HTTP/2's limit).
    pub stream_window_kb: u32,
    /// Initial HTTP/2 flow-control window of each connection, in KiB (1 to 2097151).
    pub connection_window_kb: u32,
    /// Bytes a `read_stream` consumer may have requested ahead of what it has taken, in KiB.
    pub read_stream_window_kb: u64,
    /// Unpersisted bytes one appendable writer may hold before `append` waits for a flush, in KiB.
    pub write_buffer_kb: u64,
    /// PEM file of extra CA certificates trusted for `https://` endpoints, on top of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Credentials JSON file (service account key or `gcloud` authorized_user); unset means Application Default Credentials.
    pub credentials_file: Option<PathBuf>,
    /// Send no credentials at all (public buckets).
    pub anonymous: bool,
}

impl Default for GcsConfig {
    fn default() -> Self {
        Self {
            endpoint: "https://storage.googleapis.com".to_string(),
            connect_timeout_ms: 5_000,
            call_timeout_ms: 30_000,
            retry_deadline_ms: 60_000,
            initial_backoff_ms: 20,
            max_backoff_ms: 2_000,
            stall_timeout_ms: 10_000,
            connections: 2,
            stream_window_kb: 32 * 1024,
            connection_window_kb: 64 * 1024,
            read_stream_window_kb: 32 * 1024,
            write_buffer_kb: 32 * 1024,
            ca_file: None,
            credentials_file: None,
            anonymous: false,
        }
    }
}

/// The one memory budget covering everything the daemon buffers.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Memory budget in MiB for the block cache, read-ahead, prefetch and write buffers together; 0 means automatic: an eighth of what the machine or its container (cgroup limit) allows, from 64 MiB to 2 GiB.
    pub memory_mb: u64,
}

impl CacheConfig {
    /// The budget in MiB: `memory_mb`, or the automatic one when that is 0.
    pub fn budget_mb(&self) -> u64 {
        match self.memory_mb {
            0 => crate::machine::default_budget_mb(crate::machine::memory_limit_bytes()),
            mb => mb,
        }
    }
}

/// Filesystem semantics.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FsConfig {
    /// Owner of every file and directory; unset means the user running the daemon.
    pub uid: Option<u32>,
    /// Group of every file and directory; unset means the group running the daemon.
    pub gid: Option<u32>,
    /// Permission bits of files (octal in TOML as 0o644 or as the decimal 420).
    pub file_mode: u32,
    /// Permission bits of directories.
    pub dir_mode: u32,
    /// Let users other than the one who mounted see the files (FUSE `allow_other`).
    pub allow_other: bool,
    /// Mount only this prefix of the bucket (no leading or trailing `/` needed).
    pub only_dir: Option<String>,
    /// Mount read-only.
    pub read_only: bool,
    /// How long a fetched object's metadata (size, generation) is trusted before it is fetched again, in milliseconds.
    pub stat_ttl_ms: u64,
    /// How long a name found missing stays missing before it is looked up again, in milliseconds.
    pub negative_ttl_ms: u64,
    /// How long a directory listing is reused (for readdir and lookups in it), in milliseconds.
    pub list_ttl_ms: u64,
    /// At mount, list the whole mounted tree into the listing cache in the background (up to `metadata_cache_mb`), so the first walk or epoch of lookups is answered from memory; the mount serves requests meanwhile.
    pub prefetch_metadata: bool,
    /// Memory for cached directory listings (names and object metadata), in MiB; beyond it the least recently used listings are dropped and listed again when next needed. The same figure bounds the listings and the inodes the kernel holds together (an inode takes about 130 bytes with a 28-byte key): past it the kernel is asked to let go of the files looked up least recently.
    pub metadata_cache_mb: u64,
    /// How long the kernel may trust a name -> inode answer without asking again, in milliseconds.
    pub kernel_entry_ttl_ms: u64,
    /// How long the kernel may trust an inode's attributes without asking again, in milliseconds.
    pub kernel_attr_ttl_ms: u64,
    /// Deadline for connecting and checking the bucket when mounting, in milliseconds.
    pub mount_timeout_ms: u64,
    /// Entries per ListObjects page (the service allows at most 1000).
    pub list_page_size: u32,
    /// A directory with more entries than this (listed one page after another so far) is listed the rest of the way by several concurrent ListObjects calls over split key ranges.
    pub parallel_list_threshold: u64,
    /// Concurrent ListObjects calls of one parallel listing; 1 lists every directory page by page.
    pub parallel_list_workers: u32,
}

impl Default for FsConfig {
    fn default() -> Self {
        Self {
            uid: None,
            gid: None,
            file_mode: 0o644,
            dir_mode: 0o755,
            allow_other: false,
            only_dir: None,
            read_only: false,
            stat_ttl_ms: 60_000,
            negative_ttl_ms: 5_000,
            list_ttl_ms: 60_000,
            prefetch_metadata: false,
            metadata_cache_mb: 256,
            kernel_entry_ttl_ms: 60_000,
            kernel_attr_ttl_ms: 60_000,
            mount_timeout_ms: 10_000,
            list_page_size: 1000,
            parallel_list_threshold: 2000,
            parallel_list_workers: 16,
        }
    }
}

/// The read path.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReadConfig {
    /// First read-ahead window of a sequential reader, in KiB, where rapidfs reads ahead itself: only when the kernel's read-ahead stays under 4 MiB (a mount by an ordinary user).
    pub readahead_initial_kb: u64,
    /// Largest read-ahead window, in KiB.
    pub readahead_max_kb: u64,
    /// Unit of the block cache and of sequential fetches, in KiB (at most 65536).
    pub block_kb: u64,
    /// Objects up to this size are fetched whole, in one range, at their first read, in KiB.
    pub small_object_kb: u64,
    /// Most BidiReadObject streams one object may use at once (more streams for larger objects).
    pub max_streams_per_object: usize,
    /// Object size that earns one more stream in an object's pool, in MiB.
    pub stream_per_mb: u64,
    /// How long an object's streams stay open after its last handle closed, in milliseconds;
    /// a small object's (up to `small_object_kb`, read whole) close with its last handle.
    pub stream_idle_ms: u64,
    /// Most objects whose streams are kept open at once (the warm pool bound).
    pub max_warm_objects: u64,
    /// The mount's kernel read-ahead (`/sys/class/bdi/*/read_ahead_kb`), set after mounting (as root), in KiB; 0 leaves the kernel default. From 4 MiB on, the kernel's read-ahead drives sequential reads.
    pub kernel_read_ahead_kb: u64,
    /// Bytes of upcoming small files (hinted order or directory order) fetched ahead of the reader, in MiB; capped at half the block cache.
    pub prefetch_window_mb: u64,
    /// Most upcoming files fetched ahead of the reader at once.
    pub prefetch_max_files: usize,
    /// Whole-file prefetches in flight at once (one BidiReadObject stream each).
    pub prefetch_parallel: usize,
    /// Prefetch the next files of a directory when a process opens its files in listing order.
    pub prefetch_dir_order: bool,
    /// Bytes of the most recently opened files the kernel's page cache is assumed to hold, in MiB: those are not prefetched again, older ones are; 0 means half the machine's memory.
    pub prefetch_page_cache_mb: u64,
}

impl Default for ReadConfig {
    fn default() -> Self {
        Self {
            readahead_initial_kb: 1024,
            readahead_max_kb: 64 * 1024,
            block_kb: 1024,
            small_object_kb: 1024,
            max_streams_per_object: 4,
            stream_per_mb: 128,
            stream_idle_ms: 30_000,
            max_warm_objects: 1024,
            kernel_read_ahead_kb: 16 * 1024,
            prefetch_window_mb: 64,
            prefetch_max_files: 512,
            prefetch_parallel: 16,
            prefetch_dir_order: true,
            prefetch_page_cache_mb: 0,
        }
    }
}

/// The write path: files written through the mount stream into appendable objects.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WriteConfig {
    /// Finalize an object when its last writer closes it (it can no longer be appended to); false leaves it appendable.
    pub finalize_on_close: bool,
    /// Share of `cache.memory_mb` reserved for unpersisted write buffers, in percent (the read path gets the rest).
    pub memory_percent: u64,
    /// Directory of the local staging files of rewritten files (seeks, truncation, edits); empty means `$XDG_CACHE_HOME/rapidfs/staging`, else `/var/tmp/rapidfs-UID/staging`; created mode 0700.
    pub staging_dir: String,
    /// Total size of all staging files together, in MiB; a write beyond it fails with ENOSPC.
    pub staging_limit_mb: u64,
}

impl Default for WriteConfig {
    fn default() -> Self {
        Self {
            finalize_on_close: false,
            memory_percent: 25,
            staging_dir: String::new(),
            staging_limit_mb: 10240,
        }
    }
}

/// Logging.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// Level filter in `RUST_LOG` syntax (`info`, `rapidfs=debug`, ...); `RUST_LOG` wins when set.
    pub level: String,
    /// `text` for people, `json` for log collectors.
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_string(),
            format: LogFormat::Text,
        }
    }
}

/// The Prometheus metrics endpoint.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `HOST:PORT` to serve Prometheus text on (`GET /metrics`); unset serves nothing.
    pub addr: Option<String>,
}

/// The zonal placement check: compute zone (metadata server) against bucket zone.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ZonalConfig {
    /// Refuse to mount when this machine and the bucket are in different zones.
    pub require_same_zone: bool,
    /// `auto` asks GetStorageLayout; `zonal` or `standard` skip the question (for when the call is denied).
    pub bucket_type: BucketType,
    /// How long to wait for the GCE metadata server before deciding this is not GCE, in milliseconds.
    pub metadata_timeout_ms: u64,
}

impl Default for ZonalConfig {
    fn default() -> Self {
        Self {
            require_same_zone: false,
            bucket_type: BucketType::Auto,
            metadata_timeout_ms: 500,
        }
    }
}

/// What kind of bucket to assume.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BucketType {
    /// Ask the service (GetStorageLayout).
    Auto,
    /// A Rapid (zonal) bucket.
    Zonal,
    /// A regional, dual-region or multi-region bucket.
    Standard,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// A configuration file that could not be used, with a message fit for one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown or mistyped keys.
    #[error("bad config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation, folded onto one line.
        message: String,
    },
}

/// A parser's message folded onto one line.
fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Largest size accepted in MiB (16 TiB): its bytes fit a `u64` with room for sums.
const MAX_MIB: u64 = 1 << 24;

/// Largest size accepted in KiB (the same 16 TiB).
const MAX_KIB: u64 = MAX_MIB << 10;

/// Largest block of the block cache, in KiB: a block is one buffer and one range request.
const MAX_BLOCK_KB: u64 = 64 * 1024;

/// Largest HTTP/2 flow-control window, in KiB: HTTP/2 allows 2^31 - 1 bytes.
const MAX_WINDOW_KB: u32 = (u32::MAX >> 1) / 1024;

/// `value` of `key`, unless it lies outside `min..=max`: then a one-line error naming both.
fn within<T: PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), String> {
    if value < min || value > max {
        return Err(format!(
            "{key} = {value} is out of range: it must be from {min} to {max}"
        ));
    }
    Ok(())
}

impl Config {
    /// Refuses sizes that would overflow where they are turned into bytes, or that HTTP/2
    /// cannot carry: a configuration that passes never panics or wraps when used.
    pub fn validate(&self) -> Result<(), String> {
        let (g, r) = (&self.gcs, &self.read);
        within("gcs.stream_window_kb", g.stream_window_kb, 1, MAX_WINDOW_KB)?;
        within(
            "gcs.connection_window_kb",
            g.connection_window_kb,
            1,
            MAX_WINDOW_KB,
        )?;
        for (key, kb) in [
            ("gcs.read_stream_window_kb", g.read_stream_window_kb),
            ("gcs.write_buffer_kb", g.write_buffer_kb),
            ("read.readahead_initial_kb", r.readahead_initial_kb),
            ("read.readahead_max_kb", r.readahead_max_kb),
            ("read.small_object_kb", r.small_object_kb),
            ("read.kernel_read_ahead_kb", r.kernel_read_ahead_kb),
        ] {
            within(key, kb, 0, MAX_KIB)?;
        }
        within("read.block_kb", r.block_kb, 0, MAX_BLOCK_KB)?;
        for (key, mb) in [
            ("cache.memory_mb", self.cache.memory_mb),
            ("fs.metadata_cache_mb", self.fs.metadata_cache_mb),
            ("read.stream_per_mb", r.stream_per_mb),
            ("read.prefetch_window_mb", r.prefetch_window_mb),
            ("read.prefetch_page_cache_mb", r.prefetch_page_cache_mb),
            ("write.staging_limit_mb", self.write.staging_limit_mb),
        ] {
            within(key, mb, 0, MAX_MIB)?;
        }
        Ok(())
    }

    /// Reads a TOML file; every key is optional and unknown keys are errors.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_with_profile(Some(path), None)
    }

    /// Parses TOML text, under the profile it names; the error is folded onto one line.
    pub fn parse(text: &str) -> Result<Config, String> {
        Config::parse_with_profile(text, None)
    }

    /// Parses TOML text under `profile`, or, when that is `None`, under the profile the text
    /// names; the error is folded onto one line.
    pub fn parse_with_profile(text: &str, profile: Option<Profile>) -> Result<Config, String> {
        let file: toml::Table = text.parse().map_err(one_line)?;
        let profile = match (profile, file.get("profile")) {
            (Some(p), _) => Some(p),
            (None, Some(named)) => Some(Profile::deserialize(named.clone()).map_err(one_line)?),
            (None, None) => None,
        };
        let Some(profile) = profile else {
            // Straight from the text, so that errors keep their line and column.
            return toml::from_str(text).map_err(one_line);
        };
        let mut merged = overlay(profile.keys(), file);
        merged.insert("profile".into(), profile.name().into());
        toml::Value::Table(merged).try_into().map_err(one_line)
    }

    /// Reads `path` when given, the defaults otherwise.
    pub fn load_or_default(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_with_profile(path, None)
    }

    /// Reads `path` when given under `profile` (which wins over the file's own `profile`
    /// key), the defaults under `profile` otherwise.
    pub fn load_with_profile(
        path: Option<&Path>,
        profile: Option<Profile>,
    ) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            // No file: the profile's own keys, which its unit tests parse.
            return Ok(Config::parse_with_profile("", profile).unwrap_or_default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse_with_profile(&text, profile).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_would_overflow_or_break_http2_are_refused_by_name() {
        assert_eq!(Config::default().validate(), Ok(()));
        let example = include_str!("../config/rapidfs.toml");
        assert_eq!(Config::parse(example).map(|c| c.validate()), Ok(Ok(())));
        for (text, key) in [
            (
                "[gcs]\nconnection_window_kb = 2097152",
                "gcs.connection_window_kb",
            ),
            ("[gcs]\nstream_window_kb = 0", "gcs.stream_window_kb"),
            ("[cache]\nmemory_mb = 17592186044416", "cache.memory_mb"),
            ("[read]\nblock_kb = 18014398509481984", "read.block_kb"),
            (
                "[fs]\nmetadata_cache_mb = 9223372036854775807",
                "fs.metadata_cache_mb",
            ),
            (
                "[gcs]\nwrite_buffer_kb = 9223372036854775807",
                "gcs.write_buffer_kb",
            ),
        ] {
            let err = Config::parse(text)
                .expect("parses")
                .validate()
                .expect_err(text);
            assert!(err.starts_with(key) && !err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn empty_file_gives_defaults() {
        assert_eq!(Config::parse("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_key_is_an_error_on_one_line() {
        let err = Config::parse("[cache]\nmemory_mib = 3\n").unwrap_err();
        assert!(err.contains("memory_mib"), "{err}");
        assert!(!err.contains('\n'));
    }

    #[test]
    fn a_profile_sets_defaults_and_the_file_wins() {
        let c = Config::parse("profile = \"aiml-training\"\n[fs]\nstat_ttl_ms = 7\n").unwrap();
        assert_eq!(c.profile, Some(Profile::AimlTraining));
        assert_eq!(c.fs.stat_ttl_ms, 7, "the file's key wins");
        assert_eq!(c.fs.list_ttl_ms, crate::profiles::FOREVER_MS);
        assert!(c.fs.prefetch_metadata);
        let c = Config::parse_with_profile(
            "[fs]\nnegative_ttl_ms = 9\n",
            Some(Profile::AimlCheckpointing),
        )
        .unwrap();
        assert_eq!(c.fs.negative_ttl_ms, 9);
        assert_eq!(c.write.memory_percent, 50);
        let c =
            Config::parse_with_profile("profile = \"aiml-training\"\n", Some(Profile::AimlServing))
                .unwrap();
        assert_eq!(
            c.profile,
            Some(Profile::AimlServing),
            "--profile wins over the file"
        );
        assert_eq!(c.read.max_streams_per_object, 8);
    }

    #[test]
    fn an_unknown_profile_is_an_error_on_one_line() {
        let err = Config::parse("profile = \"aiml-fast\"\n").unwrap_err();
        assert!(
            err.contains("aiml-fast") || err.contains("variant"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }

    #[test]
    fn keys_override_defaults() {
        let c = Config::parse("[cache]\nmemory_mb = 128\n[fs]\nfile_mode = 0o600\n").unwrap();
        assert_eq!(c.cache.memory_mb, 128);
        assert_eq!(c.fs.file_mode, 0o600);
        assert_eq!(c.read, ReadConfig::default());
    }
}
