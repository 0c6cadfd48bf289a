//! The client's own view of objects and listings (`ObjectMeta`, `ListRequest`, `ListPage`),
//! converted from the generated proto types so fs/ never sees them, and the custom metadata
//! conventions other GCS tools mark symbolic links (`Symlink`) and modification times with.

use crate::proto::storage as pb;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The custom metadata key gcsfuse has always marked a symbolic link with, the value being
/// the link's target (before gcsfuse 3.9 the object itself is empty).
const SYMLINK_TARGET_KEY: &str = "gcsfuse_symlink_target";
/// The key gcloud storage, Storage Transfer Service and gcsfuse 3.9 on mark a symbolic link
/// with, the value being `true`: the object's bytes are the target.
const SYMLINK_MARKER_KEY: &str = "goog-reserved-file-is-symlink";

/// The custom metadata key gcsfuse keeps a file's modification time in (set by `utimes(2)`,
/// `touch`, `rsync -a`, `tar -x`, `cp -p`), an RFC 3339 time.
pub(crate) const MTIME_KEY: &str = "gcsfuse_mtime";
/// The key gcloud storage and gsutil keep a copied file's modification time in, in whole
/// seconds since the epoch; `gcloud storage rsync` compares it.
const UPLOADED_MTIME_KEY: &str = "goog-reserved-file-mtime";

/// Whether custom metadata key `key` records a modification time.
pub(crate) fn is_mtime_key(key: &str) -> bool {
    key == MTIME_KEY || key == UPLOADED_MTIME_KEY
}

/// The modification time `metadata` gives an object, gcsfuse's key first.
fn mtime_of(metadata: &HashMap<String, String>) -> Option<SystemTime> {
    if let Some(t) = metadata.get(MTIME_KEY) {
        let parsed = t.trim().parse::<prost_types::Timestamp>().ok();
        if let Some(t) = parsed.and_then(|t| SystemTime::try_from(t).ok()) {
            return Some(t);
        }
    }
    let secs = metadata
        .get(UPLOADED_MTIME_KEY)?
        .trim()
        .parse::<u64>()
        .ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// `t` as `MTIME_KEY` holds it (RFC 3339 in UTC, as gcsfuse writes it).
pub(crate) fn mtime_value(t: SystemTime) -> String {
    prost_types::Timestamp::from(t).to_string()
}

/// How an object says it is a symbolic link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Symlink {
    /// The target, as `gcsfuse_symlink_target` gives it (no read needed).
    Target(String),
    /// Marked by `goog-reserved-file-is-symlink` alone: the object's bytes are the target.
    InContent,
}

impl Symlink {
    /// What `metadata` says: a link when either convention marks it, its target from the
    /// metadata when it is there. (gcsfuse 3.9 reads the bytes when both keys are present;
    /// it writes both with the same target, so the metadata saves that read.)
    pub fn of(metadata: &HashMap<String, String>) -> Option<Symlink> {
        if let Some(target) = metadata.get(SYMLINK_TARGET_KEY) {
            return Some(Symlink::Target(target.clone()));
        }
        metadata
            .get(SYMLINK_MARKER_KEY)
            .filter(|v| v.eq_ignore_ascii_case("true"))
            .map(|_| Symlink::InContent)
    }

    /// The custom metadata of a new link to `target`, for an object whose bytes are the
    /// target too: what gcsfuse 3.9 writes, so gcsfuse old and new, gcloud storage and
    /// Storage Transfer Service all read it as the same link.
    pub fn metadata(target: &str) -> HashMap<String, String> {
        HashMap::from([
            (SYMLINK_TARGET_KEY.to_string(), target.to_string()),
            (SYMLINK_MARKER_KEY.to_string(), "true".to_string()),
        ])
    }
}

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
    /// Set when the object stands for a symbolic link (see `Symlink`).
    pub symlink: Option<Symlink>,
    /// The modification time its custom metadata gives (`MTIME_KEY`, or the key gcloud
    /// storage sets), when one does; else the file's mtime is `update_time`.
    pub mtime: Option<SystemTime>,
}

/// The `Object` fields `ObjectMeta` is made of: what listings ask for (`read_mask`), so the
/// service neither builds nor sends the rest. The custom metadata is asked for because it
/// tells a symbolic link from a file, so that a listing shows links without a call each.
pub(crate) const OBJECT_META_FIELDS: [&str; 9] = [
    "name",
    "generation",
    "metageneration",
    "size",
    "finalize_time",
    "checksums",
    "create_time",
    "update_time",
    "metadata",
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
            symlink: Symlink::of(&o.metadata),
            mtime: mtime_of(&o.metadata),
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
    fn the_mtime_comes_from_gcsfuse_s_key_then_gcloud_s_and_survives_a_round_trip() {
        let md = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let at = |s: u64, n: u32| UNIX_EPOCH + Duration::new(s, n);
        // As gcsfuse writes it (Go's RFC3339Nano, trailing zeros dropped).
        assert_eq!(
            mtime_of(&md(&[(MTIME_KEY, "2020-01-02T03:04:05.5Z")])),
            Some(at(1_577_934_245, 500_000_000))
        );
        assert_eq!(
            mtime_of(&md(&[(UPLOADED_MTIME_KEY, "1577934245")])),
            Some(at(1_577_934_245, 0))
        );
        assert_eq!(
            mtime_of(&md(&[
                (MTIME_KEY, "2020-01-02T03:04:05Z"),
                (UPLOADED_MTIME_KEY, "7")
            ])),
            Some(at(1_577_934_245, 0))
        );
        // Unreadable values fall through to the next convention, then to none.
        assert_eq!(
            mtime_of(&md(&[(MTIME_KEY, "yesterday"), (UPLOADED_MTIME_KEY, "7")])),
            Some(at(7, 0))
        );
        assert_eq!(mtime_of(&md(&[(UPLOADED_MTIME_KEY, "-1")])), None);
        assert_eq!(mtime_of(&md(&[])), None);
        for t in [at(1_577_934_245, 0), at(1_795_961_776, 440_004_835)] {
            assert_eq!(mtime_of(&md(&[(MTIME_KEY, &mtime_value(t))])), Some(t));
        }
    }

    #[test]
    fn either_convention_marks_a_symlink_and_the_metadata_target_wins() {
        let md = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(Symlink::of(&md(&[])), None);
        assert_eq!(Symlink::of(&md(&[("other", "x")])), None);
        assert_eq!(
            Symlink::of(&md(&[(SYMLINK_TARGET_KEY, "../a")])),
            Some(Symlink::Target("../a".into())),
            "gcsfuse before 3.9: an empty object, the target in the metadata"
        );
        assert_eq!(
            Symlink::of(&md(&[(SYMLINK_MARKER_KEY, "TRUE")])),
            Some(Symlink::InContent),
            "gcloud storage and Storage Transfer Service: the target in the bytes"
        );
        assert_eq!(Symlink::of(&md(&[(SYMLINK_MARKER_KEY, "false")])), None);
        let ours = Symlink::metadata("b/c");
        assert_eq!(Symlink::of(&ours), Some(Symlink::Target("b/c".into())));
        assert_eq!(
            ours.get(SYMLINK_MARKER_KEY).map(String::as_str),
            Some("true")
        );
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
