//! `/proc/self/mountinfo` read into mounts: what is mounted where, in mount order. The
//! commands that act on a mounted bucket find their mount here (`cli::mounts`), and a mount
//! checks here that it is still the one on its mountpoint before it unmounts that path.

use std::path::{Path, PathBuf};

/// One mount.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    /// Its device, `major:minor`: different for every mount of a FUSE filesystem.
    pub device: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Its filesystem type (`fuse.rapidfs`, `ext4`).
    pub fstype: String,
    /// Its source, as mount(8) was told.
    pub source: String,
}

/// Every mount in a mountinfo text, in the order they were mounted (a later mount on the
/// same path hides the earlier one).
pub fn parse(mountinfo: &str) -> Vec<Mount> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            let mut h = head.split(' ');
            let device = h.nth(2)?;
            let mountpoint = h.nth(1)?;
            let mut t = tail.split(' ');
            Some(Mount {
                device: device.to_string(),
                mountpoint: PathBuf::from(unescape(mountpoint)),
                fstype: t.next()?.to_string(),
                source: unescape(t.next()?),
            })
        })
        .collect()
}

/// The mounts of this process's mount namespace now.
pub fn read() -> std::io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The device of the mount on `path` that is visible there now (the last mounted), if any.
pub fn device_on(path: &Path) -> Option<String> {
    read()
        .ok()?
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path)
        .map(|m| m.device)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_mounts() {
        let info = "\
36 35 0:51 / /mnt/a\\040b rw,nosuid - fuse.rapidfs data rw,user_id=0
37 35 98:0 / /mnt/other rw shared:1 - ext4 /dev/vda rw";
        let got = parse(info);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].device, "0:51");
        assert_eq!(got[0].mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(
            (got[0].fstype.as_str(), got[0].source.as_str()),
            ("fuse.rapidfs", "data")
        );
        assert_eq!(got[1].mountpoint, PathBuf::from("/mnt/other"));
        assert_eq!(got[1].fstype, "ext4");
    }

    #[test]
    fn octal_escapes_are_undone() {
        assert_eq!(unescape("/mnt/my\\040data"), "/mnt/my data");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape("/end\\04"), "/end\\04");
    }
}
