//! Direct writes: a handle opened write-only (a checkpoint's `open(path, "wb")`, `cp`'s
//! target) bypasses the page cache (FOPEN_DIRECT_IO), on kernels that keep readers on the
//! mount coherent with it. Its bytes then go from the writer's own pages into the request the
//! daemon reads, where a cached write first copied them into page-cache pages that nothing
//! reads back through that handle: one copy less per byte for the writer, and a checkpoint no
//! longer leaves a second copy of itself in the page cache beside the server's.
//!
//! A direct write does not touch the cached pages it overlaps, so the kernel must drop them,
//! and twice: before the write (Linux 6.6, "fuse: invalidate page cache pages before direct
//! write", the release that first offers FUSE_DIRECT_IO_ALLOW_MMAP, then named
//! FUSE_DIRECT_IO_RELAX) and after it ("fuse: Invalidate the page cache after FOPEN_DIRECT_IO
//! write", Linux 6.19, queued for the 6.18 and 6.12 stable series on 2026-01-06). Without the
//! second, a reader that reads a file's partial last page while an append to it is in flight
//! caches that page with zeros past the old end, and reads those zeros where the appended bytes
//! are until the page is evicted. Kernels without both keep every handle on the page cache.

use fuser::{FopenFlags, InitFlags};

/// A release of each stable series taken to drop a direct write's pages after it: months
/// past the backport's stable review of 2026-01-06, since its exact tag is not at hand.
const FIXED_SERIES: [(u32, u32, u32); 2] = [(6, 18, 20), (6, 12, 80)];

/// Whether this kernel keeps readers coherent with direct writes: it offered
/// FUSE_DIRECT_IO_ALLOW_MMAP at `init` (`capabilities`) and its `release` (uname's, such as
/// "6.18.44-fc") is 6.19 or later, or a stable release past `FIXED_SERIES`'s.
pub(super) fn kernel_allows(capabilities: InitFlags, release: &str) -> bool {
    if !capabilities.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
        return false;
    }
    let Some((major, minor, patch)) = version(release) else {
        return false;
    };
    (major, minor) >= (6, 19)
        || FIXED_SERIES
            .iter()
            .any(|&(ma, mi, p)| (major, minor) == (ma, mi) && patch >= p)
}

/// The running kernel's release string, as uname reports it.
pub(super) fn running_release() -> String {
    // SAFETY: a zeroed utsname is a valid one (arrays of c_char).
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname writes into the struct it is given and nothing else.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return String::new();
    }
    // SAFETY: after a successful uname each field is a NUL-terminated string inside `uts`.
    let release = unsafe { std::ffi::CStr::from_ptr(uts.release.as_ptr()) };
    release.to_string_lossy().into_owned()
}

/// "6.18.44-fc-v509" as (6, 18, 44); a missing patch level is 0.
fn version(release: &str) -> Option<(u32, u32, u32)> {
    let numeric = release
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .next()?;
    let mut parts = numeric.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

/// FOPEN_DIRECT_IO for a handle opened with `flags` when it only writes and `allowed`
/// (`kernel_allows`); a handle that reads keeps the page cache.
pub(super) fn write_only_flags(allowed: bool, flags: i32) -> FopenFlags {
    if allowed && flags & libc::O_ACCMODE == libc::O_WRONLY {
        FopenFlags::FOPEN_DIRECT_IO
    } else {
        FopenFlags::empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_write_only_handle_bypasses_the_page_cache_and_only_when_allowed() {
        let direct = FopenFlags::FOPEN_DIRECT_IO;
        let checkpoint = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
        assert_eq!(write_only_flags(true, checkpoint), direct);
        assert_eq!(
            write_only_flags(true, libc::O_WRONLY | libc::O_APPEND),
            direct
        );
        assert_eq!(write_only_flags(true, libc::O_RDWR), FopenFlags::empty());
        assert_eq!(write_only_flags(true, libc::O_RDONLY), FopenFlags::empty());
        assert_eq!(write_only_flags(false, checkpoint), FopenFlags::empty());
    }

    #[test]
    fn kernels_that_drop_a_direct_writes_pages_after_it_allow_direct_writes() {
        let offered = InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        for release in [
            "6.19.0",
            "6.19",
            "7.0.3-generic",
            "6.18.44-fc-v509",
            "6.12.80",
        ] {
            assert!(kernel_allows(offered, release), "{release}");
        }
        for release in [
            "6.18.5", "6.17.9", "6.12.63", "6.6.100", "5.15.0", "", "linux",
        ] {
            assert!(!kernel_allows(offered, release), "{release}");
        }
        assert!(!kernel_allows(InitFlags::empty(), "6.19.0"));
    }
}
