//! `rapidfs unfinalized MOUNTPOINT|BUCKET` lists the objects left unfinalized (appendable,
//! for example by a writer that crashed), and `rapidfs finalize PATH...` finalizes them: it
//! takes each object over (fencing any writer still holding it) and finishes it, with the
//! whole-object CRC32C checked.
//!
//! The objects an interrupted rewrite left beside its file (`gcs::is_aside_name`: a daemon
//! killed while it uploaded a new version, which mounts hide) are not listed as unfinalized
//! files but counted; `--leftovers` lists them, and `--delete-leftovers` deletes those not
//! updated for `--older-than-hours` (the generation seen), as a mount's `rmdir` does.
//!
//! A BUCKET is a bucket name or `gs://BUCKET/PREFIX`; a PATH is `gs://BUCKET/OBJECT` or a file
//! inside a rapidfs mount. A mount is found in `/proc/self/mountinfo` (see `cli::mounts`);
//! its control socket's `info` tells its bucket, endpoint
//! and `--only-dir` prefix. A mount without a control socket (an older daemon) is taken from
//! mountinfo alone: bucket from the source, endpoint from `--endpoint`/`--config` as for
//! `rapidfs mount`, prefix from `--prefix`. Touches only the objects it is asked about (and
//! reads the mount's control socket).

use super::access::AccessArgs;
use crate::cli::outln;
use crate::config::{Config, LogFormat};
use crate::control::find_socket;
use crate::gcs::{Client, ListRequest};
use anyhow::{bail, Context};
use clap::Args;
use futures::StreamExt;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How to reach the bucket: the same flags as `rapidfs mount`.
#[derive(Debug, Args, Clone)]
pub struct ConnArgs {
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Storage API endpoint (default https://storage.googleapis.com; http://HOST:PORT for an emulator).
    #[arg(long)]
    pub endpoint: Option<String>,
    /// The prefix a mount was mounted with (`--only-dir`), for paths inside such a mount.
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Credentials and TLS flags.
    #[command(flatten)]
    pub access: AccessArgs,
}

/// Flags of `rapidfs unfinalized`.
#[derive(Debug, Args)]
pub struct UnfinalizedArgs {
    /// A rapidfs mountpoint (or a directory inside one), a bucket name, or gs://BUCKET/PREFIX.
    pub target: String,
    /// List what interrupted rewrites left (hidden `.rapidfs-upload-*` objects) instead.
    #[arg(long, conflicts_with = "delete_leftovers")]
    pub leftovers: bool,
    /// Delete what interrupted rewrites left (appendable), where it was not updated for
    /// --older-than-hours.
    #[arg(long)]
    pub delete_leftovers: bool,
    /// How long a leftover must have gone without an update for --delete-leftovers. An upload
    /// in progress appends to its object far more often; one through a descriptor kept open
    /// without a write for a day is rare.
    #[arg(
        long,
        value_name = "HOURS",
        default_value_t = 24,
        requires = "delete_leftovers"
    )]
    pub older_than_hours: u64,
    /// How to reach the bucket.
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// Flags of `rapidfs finalize`.
#[derive(Debug, Args)]
pub struct FinalizeArgs {
    /// Files inside a rapidfs mount, or gs://BUCKET/OBJECT.
    #[arg(required = true)]
    pub paths: Vec<String>,
    /// How to reach the bucket.
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// Where names live: the bucket, the key prefix, and the mount that shows them (if any).
#[derive(Debug, Clone, PartialEq)]
struct Place {
    bucket: String,
    prefix: String,
    /// The mount that shows them, and the key prefix its root shows.
    mount: Option<(PathBuf, String)>,
    /// The mount's endpoint, when its control socket told it.
    endpoint: Option<String>,
}

impl Place {
    /// How `key` is shown: the path in the mount, else its gs:// URL.
    fn show(&self, key: &str) -> String {
        let in_mount = self
            .mount
            .as_ref()
            .and_then(|(m, root)| Some(m.join(key.strip_prefix(root.as_str())?)));
        match in_mount {
            Some(path) => path.display().to_string(),
            None => format!("gs://{}/{key}", self.bucket),
        }
    }
}

/// The rapidfs mount holding `path`: (mountpoint, bucket, path relative to the mount root).
fn mount_of(path: &Path) -> anyhow::Result<(PathBuf, String, String)> {
    let (m, rel) = super::mounts::containing(path)?;
    Ok((m.mountpoint, m.bucket, rel))
}

/// What a mount's control socket says of it: (bucket, endpoint, prefix). `None` when it has no
/// socket or does not answer within a few seconds.
fn mount_info(mnt: &Path) -> Option<(String, String, String)> {
    let sock = find_socket(mnt)?;
    let mut conn = std::os::unix::net::UnixStream::connect(&sock).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    conn.write_all(b"{\"op\":\"info\"}\n").ok()?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).ok()?;
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    if v.get("ok").and_then(|x| x.as_bool()) != Some(true) {
        return None;
    }
    Some((field("bucket")?, field("endpoint")?, field("prefix")?))
}

/// The place of the mount on `mnt` (bucket `bucket` by mountinfo) with `rel` below its root.
fn mount_place(mnt: PathBuf, bucket: String, conn: &ConnArgs) -> Place {
    let (bucket, endpoint, told) = match mount_info(&mnt) {
        Some((bucket, endpoint, prefix)) => (bucket, Some(endpoint), prefix),
        None => (bucket, None, String::new()),
    };
    let root = with_slash(conn.prefix.as_deref().unwrap_or(&told));
    Place {
        bucket,
        prefix: root.clone(),
        mount: Some((mnt, root)),
        endpoint,
    }
}

/// An absolute path without resolving the last component (it may be a file being written).
fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    let abs = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => Ok(parent
            .canonicalize()
            .with_context(|| format!("{}", parent.display()))?
            .join(name)),
        _ => Ok(abs),
    }
}

fn split_gs(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("gs://")?;
    let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
    Some((bucket.to_string(), key.to_string()))
}

fn with_slash(p: &str) -> String {
    let p = p.trim_matches('/');
    if p.is_empty() {
        String::new()
    } else {
        format!("{p}/")
    }
}

/// What `rapidfs unfinalized` lists.
fn resolve_target(target: &str, conn: &ConnArgs) -> anyhow::Result<Place> {
    if let Some((bucket, prefix)) = split_gs(target) {
        return Ok(Place {
            bucket,
            prefix,
            mount: None,
            endpoint: None,
        });
    }
    let path = Path::new(target);
    if path.is_dir() {
        let (mnt, bucket, rel) = mount_of(&path.canonicalize()?)?;
        let mut place = mount_place(mnt, bucket, conn);
        place.prefix = format!("{}{}", place.prefix, with_slash(&rel));
        return Ok(place);
    }
    if target.contains('/') || target.is_empty() {
        bail!("'{target}' is neither a rapidfs mount nor a bucket name");
    }
    Ok(Place {
        bucket: target.to_string(),
        prefix: String::new(),
        mount: None,
        endpoint: None,
    })
}

/// The bucket and object key a `finalize` argument names.
fn resolve_file(arg: &str, conn: &ConnArgs) -> anyhow::Result<(Place, String)> {
    if let Some((bucket, key)) = split_gs(arg) {
        if key.is_empty() {
            bail!("'{arg}' names no object");
        }
        let place = Place {
            bucket,
            prefix: String::new(),
            mount: None,
            endpoint: None,
        };
        return Ok((place, key));
    }
    let (mnt, bucket, rel) = mount_of(&absolute(Path::new(arg))?)?;
    if rel.is_empty() {
        bail!("'{arg}' is the mountpoint, not a file");
    }
    let place = mount_place(mnt, bucket, conn);
    let key = format!("{}{rel}", place.prefix);
    Ok((place, key))
}

/// The client configuration: config file, then the mount's endpoint, then the flags.
fn client_config(conn: &ConnArgs, mount_endpoint: Option<&str>) -> anyhow::Result<Config> {
    let mut cfg = Config::load_or_default(conn.config.as_deref())?;
    if let Some(e) = mount_endpoint {
        cfg.gcs.endpoint = e.to_string();
    }
    if let Some(e) = &conn.endpoint {
        cfg.gcs.endpoint = e.clone();
    }
    conn.access.apply(&mut cfg);
    Ok(cfg)
}

fn runtime(
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<tokio::runtime::Runtime> {
    super::init_logging(
        log_level.as_deref().unwrap_or("warn"),
        log_format.unwrap_or(LogFormat::Text),
    );
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")
}

/// `rapidfs unfinalized`: one line per unfinalized object (path or URL, TAB, size); with
/// `--leftovers`, one per aside object (path or URL, TAB, size, TAB, hours since its last
/// update, TAB, finalized or appendable); with `--delete-leftovers`, one per aside object
/// deleted (appendable ones only).
pub fn run_unfinalized(
    args: UnfinalizedArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let place = resolve_target(&args.target, &args.conn)?;
    let cfg = client_config(&args.conn, place.endpoint.as_deref())?;
    let rt = runtime(log_level, log_format)?;
    let (files, leftovers, deleted, failed) = rt.block_on(async {
        let client = Client::connect(&cfg.gcs).await?;
        let req = ListRequest {
            prefix: place.prefix.clone(),
            page_size: 1000,
            ..Default::default()
        };
        let mut pages = Box::pin(client.list(&place.bucket, req));
        let (mut files, mut leftovers, mut deleted, mut failed) = (0usize, 0usize, 0usize, 0usize);
        let now = SystemTime::now();
        let min_idle = Duration::from_secs(args.older_than_hours.saturating_mul(3600));
        while let Some(page) = pages.next().await {
            for o in page?.objects {
                let base = o.name.rsplit('/').next().unwrap_or_default();
                if !crate::gcs::is_aside_name(base) {
                    if !o.finalized && !args.leftovers && !args.delete_leftovers {
                        outln!("{}\t{}", place.show(&o.name), o.size);
                    }
                    files += usize::from(!o.finalized);
                    continue;
                }
                leftovers += 1;
                // An update time the service did not give (the epoch) says nothing of age.
                let idle = (o.update_time > SystemTime::UNIX_EPOCH)
                    .then(|| now.duration_since(o.update_time).unwrap_or_default());
                if args.leftovers {
                    let hours = idle.map_or("?".to_string(), |d| {
                        format!("{:.1}", d.as_secs_f64() / 3600.0)
                    });
                    let state = if o.finalized {
                        "finalized"
                    } else {
                        "appendable"
                    };
                    outln!("{}\t{}\t{hours}\t{state}", place.show(&o.name), o.size);
                } else if args.delete_leftovers
                    // A finalized one may be the only copy of a file whose old version was
                    // deleted before a move that failed (its error named it): kept.
                    && !o.finalized
                    && idle.is_some_and(|d| d >= min_idle)
                {
                    match client
                        .delete_object(&place.bucket, &o.name, Some(o.generation))
                        .await
                    {
                        Ok(()) | Err(crate::gcs::Error::NotFound(_)) => {
                            outln!("deleted {} ({} bytes)", place.show(&o.name), o.size);
                            deleted += 1;
                        }
                        Err(e) => {
                            eprintln!("rapidfs: error: {}: {e}", place.show(&o.name));
                            failed += 1;
                        }
                    }
                }
            }
        }
        Ok::<_, crate::gcs::Error>((files, leftovers, deleted, failed))
    })?;
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let at = format!("gs://{}/{}", place.bucket, place.prefix);
    if args.delete_leftovers {
        eprintln!(
            "deleted {deleted} of {leftovers} object{} interrupted rewrites left in {at} (those not updated for {} hours)",
            plural(leftovers),
            args.older_than_hours
        );
        if failed > 0 {
            bail!("{failed} could not be deleted");
        }
    } else if args.leftovers {
        eprintln!(
            "{leftovers} object{} interrupted rewrites left in {at}",
            plural(leftovers)
        );
    } else {
        eprintln!("{files} unfinalized object{} in {at}", plural(files));
        if leftovers > 0 {
            eprintln!(
                "{leftovers} more object{} of rewrites in progress or interrupted (hidden by mounts): --leftovers lists them, --delete-leftovers deletes those of interrupted ones",
                plural(leftovers)
            );
        }
    }
    Ok(())
}

/// `rapidfs finalize`: finalizes each object; fails (after trying all) if any failed.
pub fn run_finalize(
    args: FinalizeArgs,
    log_level: Option<String>,
    log_format: Option<LogFormat>,
) -> anyhow::Result<()> {
    let targets = args
        .paths
        .iter()
        .map(|p| resolve_file(p, &args.conn))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = runtime(log_level, log_format)?;
    let failed = rt.block_on(async {
        let mut clients: HashMap<Option<String>, Client> = HashMap::new();
        let mut failed = 0usize;
        for (place, key) in &targets {
            let shown = place.show(key);
            let client = match clients.get(&place.endpoint) {
                Some(c) => c.clone(),
                None => {
                    let cfg = client_config(&args.conn, place.endpoint.as_deref())?;
                    let c = Client::connect(&cfg.gcs).await?;
                    clients.insert(place.endpoint.clone(), c.clone());
                    c
                }
            };
            match finalize_one(&client, &place.bucket, key).await {
                Ok(Some(size)) => outln!("finalized {shown} ({size} bytes)"),
                Ok(None) => outln!("{shown} was already finalized"),
                Err(e) => {
                    eprintln!("rapidfs: error: {shown}: {e}");
                    failed += 1;
                }
            }
        }
        Ok::<_, anyhow::Error>(failed)
    })?;
    if failed > 0 {
        bail!("{failed} of {} objects not finalized", targets.len());
    }
    Ok(())
}

/// Finalizes one object: `Some(size)`, or `None` when it was finalized already.
async fn finalize_one(client: &Client, bucket: &str, key: &str) -> crate::gcs::Result<Option<u64>> {
    let meta = client.get_object(bucket, key).await?;
    if meta.finalized {
        return Ok(None);
    }
    let w = client.open_appendable(bucket, key, meta.generation).await?;
    let done = w.finalize().await?;
    Ok(Some(done.size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gs_urls_split_into_bucket_and_key() {
        assert_eq!(
            split_gs("gs://b/x/y"),
            Some(("b".to_string(), "x/y".to_string()))
        );
        assert_eq!(split_gs("gs://b"), Some(("b".to_string(), String::new())));
        assert_eq!(split_gs("/mnt/x"), None);
    }
}
