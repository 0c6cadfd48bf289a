//! The unary calls of `Client` (GetObject, ListObjects as pages and as a stream of pages,
//! DeleteObject, MoveObject, UpdateObject of a modification time, GetBucket), each with the routing header, a per-call deadline
//! and the shared retry policy.

use super::meta::{is_mtime_key, mtime_value, ListPage, ListRequest, ObjectMeta, MTIME_KEY};
use super::{bucket_path, object_url, retry, routing, Client, Error, Result};
use crate::proto::control as pb_control;
use crate::proto::storage as pb;
use futures::Stream;
use std::time::{Duration, SystemTime};

/// What a bucket looks like to rapidfs (from GetBucket).
#[derive(Debug, Clone, PartialEq)]
pub struct BucketInfo {
    /// Bucket name (short form, without `projects/_/buckets/`).
    pub name: String,
    /// Location, e.g. `us-central1-a` for a zonal bucket.
    pub location: String,
    /// `zone` for Rapid (zonal) buckets; `region`, `dual-region`, `multi-region` otherwise.
    pub location_type: String,
    /// Storage class (`RAPID` for Rapid buckets).
    pub storage_class: String,
    /// Whether the hierarchical namespace is enabled.
    pub hierarchical_namespace: bool,
}

/// The version of a move's source the caller knows: its generation guards the move, and its
/// size and CRC32C (where known) recognise the moved object, which the service creates with
/// a new generation, should a retry find the source already gone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoveSource {
    /// The source's generation (the move's `if_source_generation_match`).
    pub generation: i64,
    /// The source's size in bytes.
    pub size: u64,
    /// The source's CRC32C, when known.
    pub crc32c: Option<u32>,
}

/// How far the service's clock may run behind ours when a moved object's creation time is
/// compared with the time its move was sent. Small on purpose: too small only turns a move
/// whose answer was lost into the error the retry saw, as before the check existed.
const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_millis(200);

/// How long a change of a modification time is retried (see `Client::mtime_config`).
const MTIME_RETRY: Duration = Duration::from_secs(2);

impl MoveSource {
    /// Whether `moved`, found at the destination, can be what this source became by a move
    /// sent at `sent`: a move keeps the bytes and creates the object anew (metageneration 1,
    /// created after the move was sent). An object already there, even with the same bytes,
    /// was created before. An unfinalized source may have grown since its size was learned.
    fn became(&self, moved: &ObjectMeta, sent: SystemTime) -> bool {
        let size_fits = moved.size == self.size
            || (!moved.finalized && self.crc32c.is_none() && moved.size > self.size);
        moved.metageneration == 1
            && size_fits
            && self.crc32c.is_none_or(|c| moved.crc32c == Some(c))
            && moved.create_time + CLOCK_SKEW_ALLOWANCE >= sent
    }
}

impl From<&ObjectMeta> for MoveSource {
    fn from(m: &ObjectMeta) -> Self {
        MoveSource {
            generation: m.generation,
            size: m.size,
            crc32c: m.crc32c,
        }
    }
}

/// Where a bucket's data lives (StorageControl.GetStorageLayout).
#[derive(Debug, Clone, PartialEq)]
pub struct StorageLayout {
    /// Location, e.g. `us-central1-a` for a zonal bucket.
    pub location: String,
    /// `zone` for Rapid (zonal) buckets.
    pub location_type: String,
    /// Whether the hierarchical namespace is enabled.
    pub hierarchical_namespace: bool,
    /// The custom placement's data locations (the zone of a Rapid bucket).
    pub data_locations: Vec<String>,
}

impl Client {
    fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.config().call_timeout_ms)
    }

    /// Metadata of the live object.
    pub async fn get_object(&self, bucket: &str, object: &str) -> Result<ObjectMeta> {
        let what = object_url(bucket, object);
        let msg = pb::GetObjectRequest {
            bucket: bucket_path(bucket),
            object: object.to_string(),
            ..Default::default()
        };
        let o = retry::unary(self.config(), &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.get_object(req.map_err(to_status)?).await }
        })
        .await?;
        Ok(ObjectMeta::from(o.get_ref()))
    }

    /// One page of a listing.
    pub async fn list_page(&self, bucket: &str, req: &ListRequest) -> Result<ListPage> {
        let what = format!("list gs://{bucket}/{}*", req.prefix);
        let msg = req.to_proto(bucket);
        let r = retry::unary(self.config(), &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.list_objects(req.map_err(to_status)?).await }
        })
        .await?;
        Ok(ListPage::from(r.into_inner()))
    }

    /// All pages, one after the other; the stream ends after the last page or the first error.
    pub fn list(
        &self,
        bucket: &str,
        req: ListRequest,
    ) -> impl Stream<Item = Result<ListPage>> + Send + 'static {
        let state = Some((self.clone(), bucket.to_string(), req));
        futures::stream::unfold(state, |state| async move {
            let (client, bucket, mut req) = state?;
            match client.list_page(&bucket, &req).await {
                Ok(page) => {
                    let next = (!page.next_page_token.is_empty()).then(|| {
                        req.page_token = page.next_page_token.clone();
                        (client, bucket, req)
                    });
                    Some((Ok(page), next))
                }
                Err(e) => Some((Err(e), None)),
            }
        })
    }

    /// Deletes the object (`generation: None` = the live object).
    pub async fn delete_object(
        &self,
        bucket: &str,
        object: &str,
        generation: Option<i64>,
    ) -> Result<()> {
        let what = object_url(bucket, object);
        let msg = pb::DeleteObjectRequest {
            bucket: bucket_path(bucket),
            object: object.to_string(),
            generation: generation.unwrap_or(0),
            ..Default::default()
        };
        let r = retry::unary(self.config(), &what, |attempt| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move {
                match stub.delete_object(req.map_err(to_status)?).await {
                    // A retry that finds the object gone means an earlier attempt deleted it
                    // and only its answer was lost.
                    Err(s) if attempt > 0 && s.code() == tonic::Code::NotFound => Ok(()),
                    r => r.map(|_| ()),
                }
            }
        })
        .await;
        r
    }

    /// Atomically renames `source` to `destination` (MoveObject); the preconditions guard
    /// against renaming a changed source (`known`) or replacing an existing destination
    /// (`Some(0)`). Give the source's version where it is known: only then can a retry whose
    /// first attempt moved the object, and lost the answer, be told from a failure.
    pub async fn move_object(
        &self,
        bucket: &str,
        source: &str,
        destination: &str,
        known: Option<MoveSource>,
        if_generation_match: Option<i64>,
    ) -> Result<ObjectMeta> {
        let what = format!("move {} to {destination}", object_url(bucket, source));
        let msg = pb::MoveObjectRequest {
            bucket: bucket_path(bucket),
            source_object: source.to_string(),
            destination_object: destination.to_string(),
            if_source_generation_match: known.map(|k| k.generation),
            if_generation_match,
            ..Default::default()
        };
        let sent = SystemTime::now();
        let mut retried = false;
        let moved = retry::unary(self.config(), &what, |attempt| {
            retried |= attempt > 0;
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.move_object(req.map_err(to_status)?).await }
        })
        .await;
        match (moved, known) {
            (Ok(o), _) => Ok(ObjectMeta::from(o.get_ref())),
            // A retry that finds the source gone may follow an attempt that moved it and
            // lost only its answer. The moved object has a new generation, so it is known by
            // its bytes and its birth: a destination created since the move was sent, with
            // the source's size and checksum, is the state the move would have left. Without
            // a known source the error stands.
            (Err(e @ (Error::NotFound(_) | Error::PreconditionFailed(_))), Some(source))
                if retried =>
            {
                match self.get_object(bucket, destination).await {
                    Ok(m) if source.became(&m, sent) => Ok(m),
                    _ => Err(e),
                }
            }
            (Err(e), _) => Err(e),
        }
    }

    /// The settings for a best-effort change of a modification time: retried for at most
    /// `MTIME_RETRY`, since the service allows about one update a second of one object and
    /// the change is made inside a `close(2)` or `utimes(2)`.
    fn mtime_config(&self) -> crate::config::GcsConfig {
        let mut cfg = self.config().clone();
        cfg.retry_deadline_ms = cfg.retry_deadline_ms.min(MTIME_RETRY.as_millis() as u64);
        cfg
    }

    /// Records `mtime` as generation `generation` of `object`'s modification time, in the
    /// custom metadata key gcsfuse keeps it in (`MTIME_KEY`), leaving the object's other keys
    /// as they are (the `metadata.KEY` mask Google's clients patch one key with). Setting one
    /// key to one value is idempotent, so retries are safe; another generation fails the
    /// call (PreconditionFailed).
    pub async fn set_mtime(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
        mtime: SystemTime,
    ) -> Result<ObjectMeta> {
        let update = pb::Object {
            bucket: bucket_path(bucket),
            name: object.to_string(),
            metadata: [(MTIME_KEY.to_string(), mtime_value(mtime))].into(),
            ..Default::default()
        };
        let mask = format!("metadata.{MTIME_KEY}");
        self.update_metadata(bucket, update, mask, generation, None)
            .await
    }

    /// Makes generation `generation` of `object`'s modification time its update time again,
    /// and that time the present: the times recorded in its metadata (`MTIME_KEY`, and the
    /// one gcloud storage records) are removed by an update of the metadata, which advances
    /// the update time even when there was nothing to remove (`touch`). With `only_if`,
    /// nothing changes unless that is the time the object records: someone set another since.
    /// The map is written back under `if_metageneration_match`, so a key set between the
    /// read and the write is never lost (PreconditionFailed instead).
    pub async fn reset_mtime(
        &self,
        bucket: &str,
        object: &str,
        generation: i64,
        only_if: Option<SystemTime>,
    ) -> Result<ObjectMeta> {
        let what = object_url(bucket, object);
        let msg = pb::GetObjectRequest {
            bucket: bucket_path(bucket),
            object: object.to_string(),
            if_generation_match: Some(generation),
            ..Default::default()
        };
        let cfg = self.mtime_config();
        let now = retry::unary(&cfg, &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.get_object(req.map_err(to_status)?).await }
        })
        .await?
        .into_inner();
        if only_if.is_some() && ObjectMeta::from(&now).mtime != only_if {
            return Ok(ObjectMeta::from(now));
        }
        let mut metadata = now.metadata;
        metadata.retain(|k, _| !is_mtime_key(k));
        let update = pb::Object {
            bucket: bucket_path(bucket),
            name: object.to_string(),
            metadata,
            ..Default::default()
        };
        let mask = "metadata".to_string();
        self.update_metadata(bucket, update, mask, generation, Some(now.metageneration))
            .await
    }

    /// UpdateObject of `update`'s custom metadata under `mask`, for generation `generation`.
    async fn update_metadata(
        &self,
        bucket: &str,
        update: pb::Object,
        mask: String,
        generation: i64,
        if_metageneration: Option<i64>,
    ) -> Result<ObjectMeta> {
        let what = format!(
            "update the metadata of {}",
            object_url(bucket, &update.name)
        );
        let msg = pb::UpdateObjectRequest {
            object: Some(update),
            if_generation_match: Some(generation),
            if_metageneration_match: if_metageneration,
            update_mask: Some(prost_types::FieldMask { paths: vec![mask] }),
            ..Default::default()
        };
        let cfg = self.mtime_config();
        let o = retry::unary(&cfg, &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.update_object(req.map_err(to_status)?).await }
        })
        .await?;
        Ok(ObjectMeta::from(o.get_ref()))
    }

    /// Bucket facts (location type tells a zonal Rapid bucket apart).
    pub async fn get_bucket(&self, bucket: &str) -> Result<BucketInfo> {
        let what = format!("gs://{bucket}");
        let msg = pb::GetBucketRequest {
            name: bucket_path(bucket),
            ..Default::default()
        };
        let b = retry::unary(self.config(), &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.stub();
            async move { stub.get_bucket(req.map_err(to_status)?).await }
        })
        .await?
        .into_inner();
        Ok(BucketInfo {
            name: bucket.to_string(),
            location: b.location,
            location_type: b.location_type,
            storage_class: b.storage_class,
            hierarchical_namespace: b.hierarchical_namespace.is_some_and(|h| h.enabled),
        })
    }
}

impl Client {
    /// The bucket's storage layout: `location_type == "zone"` marks a Rapid bucket.
    pub async fn get_storage_layout(&self, bucket: &str) -> Result<StorageLayout> {
        let what = format!("gs://{bucket}");
        let msg = pb_control::GetStorageLayoutRequest {
            name: format!("{}/storageLayout", bucket_path(bucket)),
            prefix: String::new(),
            request_id: request_id(),
        };
        let l = retry::unary(self.config(), &what, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.call_timeout()));
            let mut stub = self.control_stub();
            async move { stub.get_storage_layout(req.map_err(to_status)?).await }
        })
        .await?
        .into_inner();
        Ok(StorageLayout {
            location: l.location,
            location_type: l.location_type,
            hierarchical_namespace: l.hierarchical_namespace.is_some_and(|h| h.enabled),
            data_locations: l
                .custom_placement_config
                .map(|c| c.data_locations)
                .unwrap_or_default(),
        })
    }
}

/// A random UUID4, so a retried control call is recognised as the same request.
pub(crate) fn request_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let variant = ["8", "9", "a", "b"][usize::from(b[8] >> 6)];
    format!(
        "{}-{}-4{}-{variant}{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// A request that cannot even be built fails like a bad argument from the server would.
pub(crate) fn to_status(e: Error) -> tonic::Status {
    tonic::Status::invalid_argument(e.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn request_ids_are_uuid4() {
        let id = super::request_id();
        assert_eq!(id.len(), 36);
        let parts: Vec<_> = id.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&id[14..15], "4");
        assert!("89ab".contains(&id[19..20]));
        assert_ne!(id, super::request_id());
    }
}
