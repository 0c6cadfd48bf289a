//! `rapidfs prefetch PATH...`: load files or whole directory trees of a mounted bucket into
//! the mount's cache before they are read (warm-up before training), through the mount's
//! control socket, with a progress bar on a terminal and plain progress lines otherwise.
//! Touches nothing but the socket; the mount does the loading.

use crate::control::{socket_dirs, socket_name, SOCKET_ENV};
use anyhow::{anyhow, bail, Context};
use clap::Args;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Flags of `rapidfs prefetch`.
#[derive(Debug, Args)]
pub struct PrefetchArgs {
    /// Files or directories inside a rapidfs mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Loads every path, one request per mount; fails on the first path outside a mount.
pub fn run(args: PrefetchArgs) -> anyhow::Result<()> {
    let mounts = rapidfs_mounts()?;
    let mut groups: Vec<(PathBuf, Vec<String>)> = Vec::new();
    for p in &args.paths {
        let abs = p
            .canonicalize()
            .map_err(|e| anyhow!("{}: {e}", p.display()))?;
        let mnt = mounts
            .iter()
            .filter(|m| abs.starts_with(m))
            .max_by_key(|m| m.as_os_str().len())
            .ok_or_else(|| anyhow!("{} is not inside a rapidfs mount", p.display()))?;
        let s = abs
            .to_str()
            .ok_or_else(|| anyhow!("{}: not valid UTF-8", p.display()))?
            .to_string();
        match groups.iter_mut().find(|(m, _)| m == mnt) {
            Some((_, v)) => v.push(s),
            None => groups.push((mnt.clone(), vec![s])),
        }
    }
    for (mnt, paths) in groups {
        prefetch(&mnt, &paths)?;
    }
    Ok(())
}

/// Mountpoints of rapidfs mounts in /proc/self/mountinfo: type `fuse.rapidfs`, or `fuse`
/// with source `rapidfs:BUCKET` (the kernel drops the subtype when root mounts directly).
fn rapidfs_mounts() -> anyhow::Result<Vec<PathBuf>> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut right = right.split(' ');
            let (fstype, source) = (right.next()?, right.next()?);
            let mnt = left.split(' ').nth(4)?;
            let ours =
                fstype == "fuse.rapidfs" || (fstype == "fuse" && source.starts_with("rapidfs:"));
            ours.then(|| PathBuf::from(unescape(mnt)))
        })
        .collect())
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The control socket of the mount on `mnt`: `$RAPIDFS_CONTROL_SOCKET`, else the first
/// candidate directory holding one.
fn find_socket(mnt: &Path) -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let name = socket_name(mnt);
    let dirs = socket_dirs();
    dirs.iter()
        .map(|d| d.join(&name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            anyhow!(
                "the rapidfs mount on {} has no control socket ({name} not found in {})",
                mnt.display(),
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )
        })
}

/// One `prefetch` request to the mount on `mnt`, showing its progress.
fn prefetch(mnt: &Path, paths: &[String]) -> anyhow::Result<()> {
    let sock = find_socket(mnt)?;
    let mut w = UnixStream::connect(&sock)
        .map_err(|e| anyhow!("cannot connect to {}: {e}", sock.display()))?;
    let r = BufReader::new(w.try_clone().context("control socket")?);
    let req = json!({"op": "prefetch", "paths": paths});
    writeln!(w, "{req}").context("sending the request")?;
    let bar = std::io::stderr().is_terminal();
    let mut err = std::io::stderr();
    for line in r.lines() {
        let line = line.context("reading the reply")?;
        let v: Value = serde_json::from_str(&line)
            .map_err(|e| anyhow!("bad reply from {}: {e}", sock.display()))?;
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            if bar {
                eprintln!();
            }
            bail!("{e}");
        }
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        let (done, total, bytes) = (n("done"), n("total"), n("bytes"));
        if v.get("ok").is_some() {
            if bar {
                eprintln!("\r{}", progress_bar(done, total, bytes));
            }
            let failed = n("failed");
            println!(
                "prefetched {done} files, {} in {}",
                human(bytes),
                mnt.display()
            );
            if failed > 0 {
                bail!("{failed} of {total} files could not be loaded (see the mount's log)");
            }
            return Ok(());
        }
        if bar {
            let _ = write!(err, "\r{}", progress_bar(done, total, bytes));
            let _ = err.flush();
        } else {
            eprintln!("prefetch: {done}/{total} files, {}", human(bytes));
        }
    }
    bail!("the mount closed the control connection before finishing")
}

/// `[#####.....]  12/40 files  3.2 MiB`
fn progress_bar(done: u64, total: u64, bytes: u64) -> String {
    const WIDTH: u64 = 30;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH) as usize;
    format!(
        "[{}{}] {done}/{total} files  {}",
        "#".repeat(filled),
        ".".repeat(WIDTH as usize - filled.min(WIDTH as usize)),
        human(bytes)
    )
}

fn human(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    format!("{:.1} MiB", bytes as f64 / MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape("/mnt/my\\040data"), "/mnt/my data");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }

    #[test]
    fn the_bar_fills_with_progress() {
        assert!(progress_bar(0, 10, 0).starts_with("[......"));
        assert!(progress_bar(10, 10, 0).starts_with("[######"));
        assert!(progress_bar(0, 0, 0).contains("0/0"));
    }
}
