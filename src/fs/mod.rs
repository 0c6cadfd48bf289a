//! Filesystem semantics over `gcs`: inodes, directories, readers with read-ahead, errors to
//! errno. Never names fuser.
