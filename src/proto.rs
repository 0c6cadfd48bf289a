//! The generated `google.storage.v2`, `google.storage.control.v2`, `google.rpc` and
//! `google.longrunning` types, clients and servers. Nothing here is hand-written; the
//! module tree mirrors the proto packages because the generated code refers across them.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// Protobuf packages under `google`.
pub mod google {
    /// `google.rpc`: the error model.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
    /// `google.longrunning`: the operation returned by folder renames.
    pub mod longrunning {
        tonic::include_proto!("google.longrunning");
    }
    /// `google.storage`: the object API and the control API.
    pub mod storage {
        /// `google.storage.v2`: buckets, objects, bidi reads and writes.
        pub mod v2 {
            tonic::include_proto!("google.storage.v2");
        }
        /// `google.storage.control`.
        pub mod control {
            /// `google.storage.control.v2`: folders and storage layout.
            pub mod v2 {
                tonic::include_proto!("google.storage.control.v2");
            }
        }
    }
}

pub use google::longrunning;
pub use google::rpc;
pub use google::storage::control::v2 as control;
pub use google::storage::v2 as storage;
