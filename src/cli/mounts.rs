//! The rapidfs mounts of this machine, read from `/proc/self/mountinfo`: the commands that act
//! on a mounted bucket (`prefetch`, `finalize`, `unfinalized`) find the mount holding a path
//! here. A mount is ours when its type is `fuse.rapidfs`; a plain `fuse` mount whose source
//! reads `rapidfs:BUCKET` (how older rapidfs versions named themselves) counts too.

use anyhow::{anyhow, Context};
use std::path::{Path, PathBuf};

/// One rapidfs mount.
#[derive(Debug, Clone, PartialEq)]
pub struct RapidfsMount {
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// The bucket, as the mount's source names it.
    pub bucket: String,
}

/// Every rapidfs mount in a mountinfo text.
pub fn parse(mountinfo: &str) -> Vec<RapidfsMount> {
    crate::mountinfo::parse(mountinfo)
        .into_iter()
        .filter_map(|m| {
            let bucket = match (m.fstype.as_str(), m.source.strip_prefix("rapidfs:")) {
                ("fuse" | "fuse.rapidfs", Some(bucket)) => bucket.to_string(),
                ("fuse.rapidfs", None) => m.source.clone(),
                _ => return None,
            };
            Some(RapidfsMount {
                mountpoint: m.mountpoint,
                bucket,
            })
        })
        .collect()
}

/// The deepest rapidfs mount holding the absolute `path`, and `path` relative to its root.
pub fn containing(path: &Path) -> anyhow::Result<(RapidfsMount, String)> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mount = parse(&info)
        .into_iter()
        .filter(|m| path.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len())
        .ok_or_else(|| anyhow!("{} is not inside a rapidfs mount", path.display()))?;
    let rel = path
        .strip_prefix(&mount.mountpoint)
        .unwrap_or(Path::new(""))
        .to_str()
        .ok_or_else(|| anyhow!("{} is not valid UTF-8", path.display()))?
        .to_string();
    Ok((mount, rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(p: &str, b: &str) -> RapidfsMount {
        RapidfsMount {
            mountpoint: PathBuf::from(p),
            bucket: b.to_string(),
        }
    }

    #[test]
    fn rapidfs_mounts_are_found_in_mountinfo() {
        let info = "\
36 35 98:0 / /mnt/a\\040b rw,nosuid - fuse.rapidfs data rw,user_id=0
37 35 98:0 / /mnt/other rw - fuse.sshfs host:/x rw
38 35 98:0 / /mnt/c rw - fuse rapidfs:ckpt rw
39 35 98:0 / /mnt/d rw - fuse somebody-else rw";
        assert_eq!(
            parse(info),
            vec![mount("/mnt/a b", "data"), mount("/mnt/c", "ckpt")]
        );
    }
}
