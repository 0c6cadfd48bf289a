//! The control socket of a mount: a unix stream socket outside the mounted tree (so it works
//! on read-only mounts and adds nothing to the namespace) taking newline-delimited JSON
//! requests, one JSON reply line each (progress lines first for `prefetch`):
//!
//! - `{"op":"hint","paths":[...]}`: the order in which files will be read next; replaces the
//!   previous hint of this connection and lasts as long as the connection.
//! - `{"op":"prefetch","paths":[...]}`: load files or directory trees into the cache now;
//!   progress lines `{"done":N,"total":M,"bytes":B}`, then `{"ok":true,...}`.
//! - `{"op":"stats"}`: what prefetch did, what the cache holds, and what the metadata
//!   holds (`metadata`: inodes, listings and their bytes).
//! - `{"op":"info"}`: bucket, endpoint, prefix and mountpoint of the mount.
//!
//! Paths are relative to the mount root, or absolute under the mountpoint. A bad request gets
//! an `{"error":"..."}` line and the connection stays usable. Touches only `fs`'s public
//! prefetch API and its own socket file.

use crate::fs::{Fs, Progress};
use serde::Serialize;
use serde_json::{json, Value};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

/// Longest request line accepted (a hint of about a million paths).
const MAX_LINE: u64 = 128 * 1024 * 1024;
/// Environment variable naming the socket explicitly (clients honour it).
pub const SOCKET_ENV: &str = "RAPIDFS_CONTROL_SOCKET";
/// An escaped mountpoint longer than this is shortened and given a hash (socket paths are
/// limited to 107 bytes).
const MAX_ESCAPED: usize = 64;

/// What `info` reports about the mount.
#[derive(Debug, Clone, Serialize)]
pub struct Info {
    /// The bucket name.
    pub bucket: String,
    /// The storage endpoint.
    pub endpoint: String,
    /// The `--only-dir` prefix, or "".
    pub prefix: String,
    /// The absolute mountpoint.
    pub mountpoint: PathBuf,
}

/// The directories a control socket may live in, most preferred first:
/// `$XDG_RUNTIME_DIR/rapidfs`, then `/run/rapidfs` for root or `/tmp/rapidfs-<uid>` otherwise.
pub fn socket_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        dirs.push(PathBuf::from(x).join("rapidfs"));
    }
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        dirs.push(PathBuf::from("/run/rapidfs"));
    } else {
        dirs.push(PathBuf::from(format!("/tmp/rapidfs-{uid}")));
    }
    dirs
}

/// The control socket of the mount on `mountpoint`, as a client finds it: `$RAPIDFS_CONTROL_SOCKET`,
/// else the first candidate directory (`socket_dirs`) that holds it.
pub fn find_socket(mountpoint: &Path) -> Option<PathBuf> {
    match std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => socket_in(&socket_dirs(), &socket_name(mountpoint)),
    }
}

/// `name` in the first of `dirs` that holds it, among those only this user can write: a
/// socket another user put in a `/tmp` directory of our name could send a client (and its
/// credentials) to an endpoint of theirs.
fn socket_in(dirs: &[PathBuf], name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: getuid cannot fail and touches no memory.
    let uid = unsafe { libc::getuid() };
    dirs.iter()
        .filter(|d| {
            std::fs::symlink_metadata(d)
                .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o022 == 0)
        })
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// The socket file name of `mountpoint`: the absolute path escaped as `systemd-escape --path`
/// does (`/` -> `-`, other bytes outside `[A-Za-z0-9:_.]` -> `\xNN`), shortened with an FNV-1a
/// hash when long, plus `.sock`.
pub fn socket_name(mountpoint: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let raw = mountpoint.as_os_str().as_bytes();
    let trimmed: &[u8] = {
        let mut s = raw;
        while let [b'/', rest @ ..] = s {
            s = rest;
        }
        while let [rest @ .., b'/'] = s {
            s = rest;
        }
        s
    };
    let mut out = String::new();
    if trimmed.is_empty() {
        out.push('-');
    }
    for (n, &b) in trimmed.iter().enumerate() {
        match b {
            b'/' => out.push('-'),
            b'.' if n == 0 => out.push_str("\\x2e"),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' | b'.' => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    if out.len() > MAX_ESCAPED {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in raw {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // Escaped names are ASCII, so any byte index is a char boundary.
        out = format!("{}-{h:016x}", &out[out.len() - 40..]);
    }
    out.push_str(".sock");
    out
}

/// Where the control socket of a mount on `mountpoint` (absolute) lives:
/// `$XDG_RUNTIME_DIR/rapidfs/<escaped>.sock`, else `/run/rapidfs/...` for root,
/// `/tmp/rapidfs-<uid>/...` otherwise.
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let dir = socket_dirs()
        .into_iter()
        .next()
        .unwrap_or_else(|| PathBuf::from("/tmp/rapidfs"));
    dir.join(socket_name(mountpoint))
}

/// A running control socket; stopped and its file removed when dropped.
pub struct ControlServer {
    path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
}

impl ControlServer {
    /// Binds the socket of `info.mountpoint` (directory 0700, socket 0600) and serves it on
    /// the current tokio runtime. A live socket of another mount at the same path is an error;
    /// a stale one is replaced.
    pub fn start(fs: Fs, info: Info) -> io::Result<ControlServer> {
        let path = socket_path(&info.mountpoint);
        let listener = bind(&path)?;
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(serve(listener, fs, Arc::new(info), stopped));
        Ok(ControlServer {
            path,
            stop: Some(stop),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "{} is the live control socket of another mount",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn serve(
    listener: UnixListener,
    fs: Fs,
    info: Arc<Info>,
    mut stopped: oneshot::Receiver<()>,
) {
    static NEXT_CONN: AtomicU64 = AtomicU64::new(1);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
                    let (fs, info) = (fs.clone(), info.clone());
                    tokio::spawn(async move {
                        if let Err(e) = connection(stream, conn, &fs, &info).await {
                            tracing::debug!(error = %e, "control connection ended");
                        }
                        fs.end_hint(conn);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "control socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Serves one client until it closes the connection or cannot be written to.
async fn connection(stream: UnixStream, conn: u64, fs: &Fs, info: &Info) -> io::Result<()> {
    let (rd, mut wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut rd)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') && n as u64 >= MAX_LINE {
            send(
                &mut wr,
                &error(format!("request longer than {MAX_LINE} bytes")),
            )
            .await?;
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line);
        if text.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(&text) {
            Ok(req) => request(&req, conn, fs, info, &mut wr).await?,
            Err(e) => send(&mut wr, &error(format!("bad JSON: {e}"))).await?,
        }
    }
}

/// Answers one parsed request.
async fn request(
    req: &Value,
    conn: u64,
    fs: &Fs,
    info: &Info,
    wr: &mut (impl AsyncWriteExt + Unpin),
) -> io::Result<()> {
    let op = req.get("op").and_then(Value::as_str).unwrap_or("");
    match op {
        "info" => {
            send(
                wr,
                &json!({"ok": true, "bucket": info.bucket, "endpoint": info.endpoint,
            "prefix": info.prefix, "mountpoint": info.mountpoint}),
            )
            .await
        }
        "stats" => {
            let mut v = serde_json::to_value(fs.prefetch_stats()).unwrap_or_else(|_| json!({}));
            if let Some(m) = v.as_object_mut() {
                m.insert("ok".into(), Value::Bool(true));
                m.insert("metadata".into(), json!(fs.metadata_usage()));
            }
            send(wr, &v).await
        }
        "hint" => match paths(req, &info.mountpoint) {
            Ok(rels) => {
                let n = fs.hint(conn, &rels);
                send(wr, &json!({"ok": true, "hinted": n})).await
            }
            Err(e) => send(wr, &error(e)).await,
        },
        "prefetch" => match paths(req, &info.mountpoint) {
            Ok(rels) => prefetch(fs, &rels, wr).await,
            Err(e) => send(wr, &error(e)).await,
        },
        "" => {
            send(
                wr,
                &error("missing \"op\" (hint, prefetch, stats or info)".into()),
            )
            .await
        }
        other => {
            send(
                wr,
                &error(format!(
                    "unknown op {other:?} (hint, prefetch, stats or info)"
                )),
            )
            .await
        }
    }
}

/// Runs a warm-up, streaming progress lines; a client gone mid-way stops it (what is loaded
/// stays loaded).
async fn prefetch(
    fs: &Fs,
    rels: &[String],
    wr: &mut (impl AsyncWriteExt + Unpin),
) -> io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Progress>();
    // A task of its own, so that a client that stops reading its progress lines does not
    // pause loads that readers of the same files have joined; the set ends it with the
    // connection.
    let mut work = JoinSet::new();
    let (fs, rels) = (fs.clone(), rels.to_vec());
    work.spawn(async move {
        fs.warm(&rels, move |p| {
            let _ = tx.send(p);
        })
        .await
    });
    let result = loop {
        tokio::select! {
            ended = work.join_next() => break match ended {
                Some(Ok(r)) => r,
                Some(Err(e)) => Err(format!("the warm-up stopped: {e}")),
                None => Err("no warm-up ran".into()),
            },
            Some(p) = rx.recv() => send(wr, &json!({"done": p.done, "total": p.total, "bytes": p.bytes})).await?,
        }
    };
    match result {
        Ok(p) => {
            send(
                wr,
                &json!({"ok": true, "done": p.done, "total": p.total, "bytes": p.bytes, "failed": p.failed}),
            )
            .await
        }
        Err(e) => send(wr, &error(e)).await,
    }
}

fn error(msg: String) -> Value {
    json!({ "error": msg })
}

async fn send(wr: &mut (impl AsyncWriteExt + Unpin), v: &Value) -> io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    wr.write_all(line.as_bytes()).await
}

/// The request's `paths`, each made relative to the mount root.
fn paths(req: &Value, mountpoint: &Path) -> Result<Vec<String>, String> {
    let list = req
        .get("paths")
        .and_then(Value::as_array)
        .ok_or("\"paths\" must be a list of strings")?;
    list.iter()
        .map(|p| {
            let p = p.as_str().ok_or("\"paths\" must be a list of strings")?;
            relative(p, mountpoint)
        })
        .collect()
}

/// `p` (relative to the mount root, or absolute under `mountpoint`) as a clean relative path
/// ("" is the root).
pub fn relative(p: &str, mountpoint: &Path) -> Result<String, String> {
    let path = Path::new(p);
    let rel = if path.is_absolute() {
        path.strip_prefix(mountpoint)
            .map_err(|_| format!("{p}: not under the mountpoint {}", mountpoint.display()))?
    } else {
        path
    };
    let mut parts = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => parts.push(
                s.to_str()
                    .ok_or_else(|| format!("{p}: not valid UTF-8"))?
                    .to_string(),
            ),
            Component::CurDir => {}
            _ => return Err(format!("{p}: '..' is not allowed")),
        }
    }
    Ok(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_like_systemd() {
        assert_eq!(socket_name(Path::new("/mnt/data")), "mnt-data.sock");
        assert_eq!(socket_name(Path::new("/")), "-.sock");
        assert_eq!(socket_name(Path::new("/a-b/c d/")), "a\\x2db-c\\x20d.sock");
        assert_eq!(socket_name(Path::new("/.x/y")), "\\x2ex-y.sock");
    }

    #[test]
    fn long_names_are_shortened_with_a_hash() {
        let long = format!("/{}", "d/".repeat(60));
        let a = socket_name(Path::new(&long));
        let b = socket_name(Path::new(&format!("{long}e")));
        assert!(a.len() <= MAX_ESCAPED + 5 + 17, "{a}");
        assert_ne!(a, b);
        // The same name python/rapidfs_sampler.py computes.
        assert_eq!(a, format!("{}-243462728bd4819e.sock", "-d".repeat(20)));
    }

    /// A writer that never takes a byte: a client that stopped reading.
    struct Stuck;

    impl tokio::io::AsyncWrite for Stuck {
        fn poll_write(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            _: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            std::task::Poll::Pending
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Pending
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Pending
        }
    }

    /// A prefetch client that stops reading its progress lines does not stop the warm-up:
    /// paused loads would hold every reader that joined them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_warm_up_goes_on_while_its_client_reads_nothing() {
        let objects: Vec<(String, bytes::Bytes)> = (0..20u8)
            .map(|i| (format!("d/f{i}"), bytes::Bytes::from(vec![i; 10_000])))
            .collect();
        let named: Vec<(&str, bytes::Bytes)> = objects
            .iter()
            .map(|(n, b)| (n.as_str(), b.clone()))
            .collect();
        let (emu, cfg) = crate::fs::test_emulator(&named, 0).await;
        let client = crate::gcs::Client::connect(&cfg.gcs).await.expect("client");
        let fs = Fs::new(client, "b", &cfg);
        let (rels, mut stuck) = (["d".to_string()], Stuck);
        let warming = prefetch(&fs, &rels, &mut stuck);
        tokio::pin!(warming);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while emu.stats().bytes_sent < 200_000 {
            assert!(
                std::time::Instant::now() < deadline,
                "the warm-up stopped with its client: {} bytes loaded",
                emu.stats().bytes_sent
            );
            tokio::select! {
                _ = &mut warming => panic!("a warm-up whose client reads nothing cannot answer"),
                _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
            }
        }
    }

    #[test]
    fn a_socket_is_found_only_in_a_directory_no_one_else_can_write() {
        let base = tempfile::tempdir().expect("tempdir");
        let dir = base.path().join("rapidfs");
        std::fs::create_dir(&dir).expect("mkdir");
        std::fs::write(dir.join("mnt.sock"), b"").expect("socket stand-in");
        let dirs = [dir.clone()];
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert_eq!(
            socket_in(&dirs, "mnt.sock"),
            None,
            "a directory all may write"
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        assert_eq!(socket_in(&dirs, "mnt.sock"), Some(dir.join("mnt.sock")));
        assert_eq!(socket_in(&dirs, "other.sock"), None);
    }

    /// A daemon killed with SIGKILL leaves its socket file behind: the next mount on the same
    /// mountpoint (systemd's restart) takes the path over, while a live one keeps it.
    #[tokio::test]
    async fn bind_takes_over_a_dead_socket_and_refuses_a_live_one() {
        let base = tempfile::tempdir().expect("tempdir");
        let path = base.path().join("rapidfs").join("mnt.sock");
        drop(bind(&path).expect("first bind"));
        assert!(
            path.exists(),
            "a dropped listener leaves its file, as a killed daemon does"
        );
        let _live = bind(&path).expect("a dead socket's path is taken over");
        let refused = bind(&path).expect_err("a live socket's path is not");
        assert_eq!(refused.kind(), io::ErrorKind::AddrInUse);
        std::os::unix::net::UnixStream::connect(&path).expect("the live socket is left in place");
    }

    #[test]
    fn paths_are_made_relative_to_the_mount() {
        let m = Path::new("/mnt/data");
        assert_eq!(relative("/mnt/data/a/b.jpg", m).unwrap(), "a/b.jpg");
        assert_eq!(relative("a/./b.jpg", m).unwrap(), "a/b.jpg");
        assert_eq!(relative("/mnt/data", m).unwrap(), "");
        assert!(relative("/etc/passwd", m).is_err());
        assert!(relative("a/../../x", m).is_err());
        assert!(relative("/mnt/database/x", m).is_err());
    }
}
