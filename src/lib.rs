//! rapidfs: mount a Google Cloud Storage Rapid (zonal) bucket as a POSIX directory.
//!
//! The crate is layered `fuse -> fs -> gcs -> proto`, with the `emulator` apart: it is the
//! server side of the same wire and shares nothing with the client but the generated types.
//! `cli` and `config` sit on top and wire the layers together.

pub mod cli;
pub mod config;
pub mod control;
pub mod emulator;
pub mod fs;
pub mod fuse;
pub mod gcs;
pub mod machine;
pub mod metrics;
pub mod mountinfo;
pub mod profiles;
pub mod proto;
pub mod zonal;
