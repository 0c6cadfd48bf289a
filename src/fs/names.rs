//! Which object names a POSIX directory tree can show, and how names join into object keys.
//!
//! Object names are plain strings; `/` makes directories only by convention. A component that
//! is empty, `.` or `..`, longer than 255 bytes, or holds a NUL cannot be a file name, so such
//! objects are hidden rather than shown under a mangled name. So are the objects an upload
//! writes beside its target before moving them onto it (`gcs::is_aside_name`): they are not
//! files of anyone's, and a reader who opened one would find it moved away.

/// Longest file name Linux accepts in one path component.
pub const NAME_MAX: usize = 255;

/// Longest object name the service stores, in bytes of UTF-8.
pub const KEY_MAX: usize = 1024;

/// Longest folder name (a directory's key, with its slash) a bucket with a hierarchical
/// namespace holds, in bytes of UTF-8.
pub const FOLDER_MAX: usize = 512;

/// Most folder levels (slashes) an object name may have in such a bucket.
pub const DEPTH_MAX: usize = 50;

/// Whether the service's object naming rules let `key` (an object's or a folder's name)
/// be stored: no carriage return or line feed, nothing under `.well-known/acme-challenge/`.
/// (Its lengths are checked apart: `KEY_MAX`, `FOLDER_MAX`, `DEPTH_MAX`.)
pub fn is_storable(key: &str) -> bool {
    !key.contains(['\r', '\n']) && !key.starts_with(".well-known/acme-challenge/")
}

/// True when `name` can be shown as one entry of a directory.
pub fn is_visible(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= NAME_MAX
        && !name.contains('/')
        && !name.contains('\0')
        && !crate::gcs::is_aside_name(name)
}

/// Normalizes a `--only-dir` prefix to the form directory keys use: no leading `/`, one
/// trailing `/`, or empty for the bucket root.
pub fn dir_prefix(only_dir: Option<&str>) -> String {
    let trimmed = only_dir.unwrap_or("").trim_matches('/');
    if trimmed.is_empty() {
        String::new()
    } else {
        format!("{trimmed}/")
    }
}

/// The object key of file `name` inside directory key `dir` (which is empty or ends in `/`).
pub fn file_key(dir: &str, name: &str) -> String {
    format!("{dir}{name}")
}

/// The directory key (empty or ending in `/`) of the directory holding object `key`.
pub fn parent_dir(key: &str) -> &str {
    key.rfind('/').map_or("", |i| &key[..=i])
}

/// The last segment of a file's key: its name inside its directory.
pub fn base_name(key: &str) -> &str {
    key.rfind('/').map_or(key, |i| &key[i + 1..])
}

/// The directory key (prefix, ending in `/`) of subdirectory `name` inside directory key `dir`.
pub fn dir_key(dir: &str, name: &str) -> String {
    format!("{dir}{name}/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_names_are_hidden() {
        assert!(is_visible("a.txt"));
        assert!(is_visible(&"x".repeat(255)));
        assert!(is_visible(".rapidfs-upload-0123"));
        assert!(is_visible(".rapidfs-upload-0123456789abcdefg"));
        assert!(
            is_visible(".rapidfs-upload-0123456789ABCDEF"),
            "ours are lowercase"
        );
        let aside = ".rapidfs-upload-0123456789abcdef";
        for bad in ["", ".", "..", "a/b", "nul\0", &"x".repeat(256), aside] {
            assert!(!is_visible(bad), "{bad:?}");
        }
    }

    #[test]
    fn prefixes_are_normalized() {
        assert_eq!(dir_prefix(None), "");
        assert_eq!(dir_prefix(Some("/")), "");
        assert_eq!(dir_prefix(Some("/a/b/")), "a/b/");
        assert_eq!(dir_prefix(Some("a")), "a/");
        assert_eq!(file_key("a/", "f"), "a/f");
        assert_eq!(dir_key("", "d"), "d/");
    }
}
