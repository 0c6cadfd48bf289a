//! Reading a directory tree as buckets, objects and folders (shared by the directory backend
//! and the memory backend's preload). Reads directories only.

use std::path::{Path, PathBuf};

/// Files under `dir` as (relative name prefixed by `rel`, path), and sub-directories as
/// folder names ("a/"); a missing `dir`, or a file where it would be, is empty.
pub(crate) fn walk(
    dir: &Path,
    rel: &str,
    files: &mut Vec<(String, PathBuf)>,
    folders: &mut Vec<String>,
) -> std::io::Result<()> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(())
        }
        Err(e) => return Err(e),
    };
    for ent in rd {
        let ent = ent?;
        let Ok(name) = ent.file_name().into_string() else {
            continue;
        };
        let ty = ent.file_type()?;
        let full = format!("{rel}{name}");
        if ty.is_dir() {
            folders.push(format!("{full}/"));
            walk(&ent.path(), &format!("{full}/"), files, folders)?;
        } else if ty.is_file() {
            files.push((full, ent.path()));
        }
    }
    Ok(())
}

/// The non-hidden sub-directories of `root`: the buckets.
pub(crate) fn bucket_dirs(root: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    for ent in std::fs::read_dir(root)? {
        let ent = ent?;
        if !ent.file_type()?.is_dir() {
            continue;
        }
        if let Ok(name) = ent.file_name().into_string() {
            if !name.starts_with('.') {
                out.push(name);
            }
        }
    }
    out.sort();
    Ok(out)
}
