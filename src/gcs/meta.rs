//! The client's own view of objects and listings (`ObjectMeta`, `ListRequest`, `ListPage`),
//! converted from the generated proto types so fs/ never sees them.

use crate::proto::storage as pb;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What fs/ needs to know of an object.
#[derive(Debug, Clone, PartialEq)]
pub struct ObjectMeta {
    /// Object name within its bucket.
    pub name: String,
    /// Generation (version) of the object.
    pub generation: i64,
    /// Metadata generation.
    pub metageneration: i64,
    /// Size in bytes (persisted size for an unfinalized appendable object).
    pub size: u64,
    /// True when finalize_time is set.
    pub finalized: bool,
    /// Whole-object CRC32C when the service reports one.
    pub crc32c: Option<u32>,
    /// Creation time.
    pub create_time: SystemTime,
    /// Last update time.
    pub update_time: SystemTime,
}

/// The `Object` fields `ObjectMeta` is made of: what listings ask for (`read_mask`), so the
/// service neither builds nor sends the rest.
pub(crate) const OBJECT_META_FIELDS: [&str; 8] = [
    "name",
    "generation",
    "metageneration",
    "size",
    "finalize_time",
    "checksums",
    "create_time",
    "update_time",
];

impl From<&pb::Object> for ObjectMeta {
    fn from(o: &pb::Object) -> Self {
        ObjectMeta::with_name(o.name.clone(), o)
    }
}

impl From<pb::Object> for ObjectMeta {
    fn from(mut o: pb::Object) -> Self {
        ObjectMeta::with_name(std::mem::take(&mut o.name), &o)
    }
}

impl ObjectMeta {
    fn with_name(name: String, o: &pb::Object) -> Self {
        ObjectMeta {
            name,
            generation: o.generation,
            metageneration: o.metageneration,
            size: u64::try_from(o.size).unwrap_or(0),
            finalized: o.finalize_time.is_some(),
            crc32c: o.checksums.as_ref().and_then(|c| c.crc32c),
            create_time: to_system_time(o.create_time.as_ref()),
            update_time: to_system_time(o.update_time.as_ref()),
        }
    }
}

/// A missing or pre-epoch timestamp becomes the epoch.
fn to_system_time(t: Option<&prost_types::Timestamp>) -> SystemTime {
    let Some(t) = t else { return UNIX_EPOCH };
    let (Ok(secs), Ok(nanos)) = (u64::try_from(t.seconds), u32::try_from(t.nanos)) else {
        return UNIX_EPOCH;
    };
    UNIX_EPOCH + Duration::new(secs, nanos.min(999_999_999))
}

/// One ListObjects request; set what you need (no delimiter is implied).
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Only names starting with this.
    pub prefix: String,
    /// Group names by this separator into `prefixes` (usually `/`).
    pub delimiter: Option<String>,
    /// Page size; 0 = server default (1000).
    pub page_size: i32,
    /// Continue from this token (empty = first page).
    pub page_token: String,
    /// Only names >= this.
    pub lexicographic_start: String,
    /// Only names < this.
    pub lexicographic_end: String,
    /// Show empty folders (HNS) in `prefixes`.
    pub include_folders_as_prefixes: bool,
}

impl ListRequest {
    /// The wire request for `bucket`.
    pub(crate) fn to_proto(&self, bucket: &str) -> pb::ListObjectsRequest {
        pb::ListObjectsRequest {
            parent: super::bucket_path(bucket),
            page_size: self.page_size,
            page_token: self.page_token.clone(),
            delimiter: self.delimiter.clone().unwrap_or_default(),
            prefix: self.prefix.clone(),
            lexicographic_start: self.lexicographic_start.clone(),
            lexicographic_end: self.lexicographic_end.clone(),
            include_folders_as_prefixes: self.include_folders_as_prefixes,
            read_mask: Some(prost_types::FieldMask {
                paths: OBJECT_META_FIELDS.iter().map(|f| f.to_string()).collect(),
            }),
            ..Default::default()
        }
    }
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListPage {
    /// Objects on this page.
    pub objects: Vec<ObjectMeta>,
    /// Common prefixes (directories) on this page.
    pub prefixes: Vec<String>,
    /// Token of the next page; empty on the last page.
    pub next_page_token: String,
}

impl From<pb::ListObjectsResponse> for ListPage {
    fn from(r: pb::ListObjectsResponse) -> Self {
        ListPage {
            objects: r.objects.into_iter().map(ObjectMeta::from).collect(),
            prefixes: r.prefixes,
            next_page_token: r.next_page_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_conversion_reads_finalize_and_crc() {
        let o = pb::Object {
            name: "a/b".into(),
            generation: 7,
            metageneration: 1,
            size: 42,
            finalize_time: Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 5,
            }),
            checksums: Some(pb::ObjectChecksums {
                crc32c: Some(0xdead_beef),
                md5_hash: Default::default(),
            }),
            create_time: Some(prost_types::Timestamp {
                seconds: 100,
                nanos: 0,
            }),
            ..Default::default()
        };
        let m = ObjectMeta::from(&o);
        assert_eq!(m.size, 42);
        assert!(m.finalized);
        assert_eq!(m.crc32c, Some(0xdead_beef));
        assert_eq!(m.create_time, UNIX_EPOCH + Duration::from_secs(100));
        assert_eq!(m.update_time, UNIX_EPOCH);
        let unfinalized = pb::Object {
            size: -1,
            ..Default::default()
        };
        let m = ObjectMeta::from(&unfinalized);
        assert!(!m.finalized);
        assert_eq!(m.size, 0);
    }

    #[test]
    fn list_request_maps_delimiter_and_parent() {
        let r = ListRequest {
            prefix: "dir/".into(),
            delimiter: Some("/".into()),
            ..Default::default()
        }
        .to_proto("b");
        assert_eq!(r.parent, "projects/_/buckets/b");
        assert_eq!(r.delimiter, "/");
        assert_eq!(r.prefix, "dir/");
        let mask = r
            .read_mask
            .expect("listings ask only for what ObjectMeta holds");
        assert_eq!(mask.paths, OBJECT_META_FIELDS);
    }
}
