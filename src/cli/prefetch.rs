//! `rapidfs prefetch PATH...`: load files or whole directory trees of a mounted bucket into
//! the mount's cache before they are read (warm-up before training), through the mount's
//! control socket, with a progress bar on a terminal and plain progress lines otherwise.
//! Touches nothing but the socket; the mount does the loading.

use crate::cli::outln;
use crate::control::{self, socket_dirs, socket_name};
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
    let mut groups: Vec<(PathBuf, Vec<String>)> = Vec::new();
    for p in &args.paths {
        let abs = p
            .canonicalize()
            .map_err(|e| anyhow!("{}: {e}", p.display()))?;
        let mnt = super::mounts::containing(&abs)?.0.mountpoint;
        let s = abs
            .to_str()
            .ok_or_else(|| anyhow!("{}: not valid UTF-8", p.display()))?
            .to_string();
        match groups.iter_mut().find(|(m, _)| *m == mnt) {
            Some((_, v)) => v.push(s),
            None => groups.push((mnt, vec![s])),
        }
    }
    for (mnt, paths) in groups {
        prefetch(&mnt, &paths)?;
    }
    Ok(())
}

/// The control socket of the mount on `mnt` (see `control::find_socket`).
fn find_socket(mnt: &Path) -> anyhow::Result<PathBuf> {
    control::find_socket(mnt).ok_or_else(|| {
        let name = socket_name(mnt);
        let dirs = socket_dirs();
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
            outln!(
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
    fn the_bar_fills_with_progress() {
        assert!(progress_bar(0, 10, 0).starts_with("[......"));
        assert!(progress_bar(10, 10, 0).starts_with("[######"));
        assert!(progress_bar(0, 0, 0).contains("0/0"));
    }
}
