//! The wire form of a stored object: the `Object` message, with the fields a request's
//! `read_mask` selects, and the time formats it carries.

use super::bucket_names::bucket_path;
use super::store::Entry;
use crate::proto::storage::{Object, ObjectChecksums};
use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};

/// A protobuf timestamp.
pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// The wire form of an object.
pub(crate) fn to_proto(bucket: &str, name: &str, e: &Entry) -> Object {
    to_proto_masked(bucket, name, e, &ObjectFields::ALL)
}

/// The `Object` fields a request's `read_mask` asks for; no mask, or `*`, means all of them.
/// Paths name `Object` fields (`name`, `size`, ...) as Google's clients send them; a path
/// naming a field the emulator never fills (`acl`, `owner`, ...) selects nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ObjectFields {
    bucket: bool,
    etag: bool,
    generation: bool,
    metageneration: bool,
    storage_class: bool,
    size: bool,
    finalize_time: bool,
    content_type: bool,
    create_time: bool,
    checksums: bool,
    update_time: bool,
    metadata: bool,
}

impl ObjectFields {
    /// Every field the emulator fills.
    pub const ALL: ObjectFields = ObjectFields {
        bucket: true,
        etag: true,
        generation: true,
        metageneration: true,
        storage_class: true,
        size: true,
        finalize_time: true,
        content_type: true,
        create_time: true,
        checksums: true,
        update_time: true,
        metadata: true,
    };

    /// The fields `mask` selects. `name` is always sent: a listing without names is useless,
    /// and the service sends it too.
    pub fn from_mask(mask: Option<&prost_types::FieldMask>) -> ObjectFields {
        let Some(mask) = mask else {
            return ObjectFields::ALL;
        };
        let has = |field: &str| {
            mask.paths
                .iter()
                .any(|p| p == "*" || p.split('.').next() == Some(field))
        };
        ObjectFields {
            bucket: has("bucket"),
            etag: has("etag"),
            generation: has("generation"),
            metageneration: has("metageneration"),
            storage_class: has("storage_class"),
            size: has("size"),
            finalize_time: has("finalize_time"),
            content_type: has("content_type"),
            create_time: has("create_time"),
            checksums: has("checksums"),
            update_time: has("update_time"),
            metadata: has("metadata"),
        }
    }
}

/// `o` as a service whose metadata lags behind appends reports entry `e`: the size of an
/// unfinalized object as 0, and no checksum (see `Faults::stale_unfinalized_size`).
pub(crate) fn lag_behind_appends(o: &mut Object, e: &Entry) {
    if e.content.state().finalized.is_none() {
        o.size = 0;
        o.checksums = None;
    }
}

/// The wire form of an object, with only the fields in `f` (and its name).
pub(crate) fn to_proto_masked(bucket: &str, name: &str, e: &Entry, f: &ObjectFields) -> Object {
    let st = e.content.state();
    Object {
        name: name.to_string(),
        bucket: if f.bucket {
            bucket_path(bucket)
        } else {
            String::new()
        },
        etag: if f.etag {
            format!("{}-{}", e.content.generation, e.metageneration)
        } else {
            String::new()
        },
        generation: if f.generation {
            e.content.generation
        } else {
            0
        },
        metageneration: if f.metageneration {
            e.metageneration
        } else {
            0
        },
        storage_class: if f.storage_class {
            "RAPID".to_string()
        } else {
            String::new()
        },
        size: if f.size { st.persisted as i64 } else { 0 },
        finalize_time: st.finalized.filter(|_| f.finalize_time).map(timestamp),
        content_type: if f.content_type {
            "application/octet-stream".to_string()
        } else {
            String::new()
        },
        create_time: f.create_time.then(|| timestamp(e.create_time)),
        checksums: f.checksums.then(|| ObjectChecksums {
            crc32c: st.crc_known.then_some(st.persisted_crc),
            md5_hash: Bytes::new(),
        }),
        update_time: f.update_time.then(|| timestamp(st.update_time)),
        metadata: if f.metadata {
            e.metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        } else {
            Default::default()
        },
        ..Object::default()
    }
}
