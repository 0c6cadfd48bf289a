//! The errors the filesystem hands to its frontend: a POSIX errno, mapped from `gcs::Error`
//! in one place so every operation agrees on what each failure means.

use crate::gcs;

/// A POSIX error number (positive), what the kernel receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// No such file or directory.
    pub const ENOENT: Errno = Errno(libc::ENOENT);
    /// Input/output error: the service failed after retries, or bytes did not check out.
    pub const EIO: Errno = Errno(libc::EIO);
    /// The object changed under an open handle (its generation is gone).
    pub const ESTALE: Errno = Errno(libc::ESTALE);
    /// The filesystem is read-only.
    pub const EROFS: Errno = Errno(libc::EROFS);
    /// Not a directory.
    pub const ENOTDIR: Errno = Errno(libc::ENOTDIR);
    /// Is a directory.
    pub const EISDIR: Errno = Errno(libc::EISDIR);
    /// Bad file handle.
    pub const EBADF: Errno = Errno(libc::EBADF);
    /// Invalid argument.
    pub const EINVAL: Errno = Errno(libc::EINVAL);
    /// Name longer than a path component may be.
    pub const ENAMETOOLONG: Errno = Errno(libc::ENAMETOOLONG);
}

impl From<&gcs::Error> for Errno {
    fn from(e: &gcs::Error) -> Self {
        use gcs::Error as E;
        match e {
            E::NotFound(_) => Errno::ENOENT,
            E::PreconditionFailed(_) => Errno::ESTALE,
            E::OutOfRange(_) | E::InvalidArgument(_) => Errno::EINVAL,
            E::PermissionDenied(_) => Errno(libc::EACCES),
            E::AlreadyExists(_) => Errno(libc::EEXIST),
            E::Fenced(_) | E::Checksum(_) | E::Unavailable(_) | E::Other(_) => Errno::EIO,
        }
    }
}

impl From<gcs::Error> for Errno {
    fn from(e: gcs::Error) -> Self {
        Errno::from(&e)
    }
}

/// What every filesystem operation returns.
pub type FsResult<T> = Result<T, Errno>;

/// Logs a service error once at the point where it becomes an errno, then converts it.
pub(crate) fn log_err(op: &str, path: &str, e: &gcs::Error) -> Errno {
    let errno = Errno::from(e);
    if errno != Errno::ENOENT {
        tracing::warn!(op, path, error = %e, "request failed");
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_errors_map_to_errnos() {
        assert_eq!(Errno::from(gcs::Error::NotFound("x".into())), Errno::ENOENT);
        assert_eq!(
            Errno::from(gcs::Error::PreconditionFailed("x".into())),
            Errno::ESTALE
        );
        assert_eq!(Errno::from(gcs::Error::Unavailable("x".into())), Errno::EIO);
        assert_eq!(
            Errno::from(gcs::Error::PermissionDenied("x".into())),
            Errno(libc::EACCES)
        );
    }
}
