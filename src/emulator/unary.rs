//! The unary object calls: GetBucket, GetObject, ListObjects, DeleteObject, MoveObject,
//! UpdateObject (custom metadata only).
//! Each counts itself, checks the routing header, may fail by injected fault, and waits out
//! the injected latency. Touches the store.

use super::bucket_names::{bucket_path, parse_bucket};
use super::listing::list;
use super::object_proto::{lag_behind_appends, timestamp, to_proto};
use super::preconditions::{preconditions_of, Preconditions};
use super::stats::add;
use super::Service;
use crate::proto::storage::{
    bucket, Bucket, DeleteObjectRequest, GetBucketRequest, GetObjectRequest, ListObjectsRequest,
    ListObjectsResponse, MoveObjectRequest, Object, UpdateObjectRequest,
};
use tonic::{Request, Response, Status};

impl Service {
    /// Opens a unary call on `bucket_field` (a `projects/_/buckets/NAME`), returning NAME.
    async fn unary(
        &self,
        meta: &tonic::metadata::MetadataMap,
        key: &str,
        bucket_field: &str,
    ) -> Result<String, Status> {
        let bucket = parse_bucket(bucket_field);
        let full = bucket.as_deref().map(bucket_path).unwrap_or_default();
        self.calls.begin(meta, key, &full)?;
        self.calls.delay().await;
        bucket
    }

    /// GetBucket: a Rapid bucket in the configured zone.
    pub(crate) async fn get_bucket_impl(
        &self,
        req: Request<GetBucketRequest>,
    ) -> Result<Response<Bucket>, Status> {
        let name = self
            .unary(req.metadata(), "name", &req.get_ref().name)
            .await?;
        let created = self.store.bucket(&name)?;
        let r = req.get_ref();
        if r.if_metageneration_match.is_some_and(|m| m != 1) {
            return Err(Status::failed_precondition(
                "if_metageneration_match failed: the bucket is at metageneration 1",
            ));
        }
        if r.if_metageneration_not_match == Some(1) {
            return Err(Status::failed_precondition(
                "if_metageneration_not_match failed",
            ));
        }
        Ok(Response::new(Bucket {
            name: bucket_path(&name),
            bucket_id: name.clone(),
            etag: "1".to_string(),
            project: "projects/0".to_string(),
            metageneration: 1,
            location: self.region(),
            location_type: "zone".to_string(),
            storage_class: "RAPID".to_string(),
            create_time: Some(timestamp(created)),
            update_time: Some(timestamp(created)),
            custom_placement_config: Some(bucket::CustomPlacementConfig {
                data_locations: vec![self.zone.clone()],
            }),
            hierarchical_namespace: Some(bucket::HierarchicalNamespace { enabled: true }),
        }))
    }

    /// GetObject: the live object or a given generation.
    pub(crate) async fn get_object_impl(
        &self,
        req: Request<GetObjectRequest>,
    ) -> Result<Response<Object>, Status> {
        add(&self.calls.stats.get_object_calls, 1);
        let bucket = self
            .unary(req.metadata(), "bucket", &req.get_ref().bucket)
            .await?;
        let r = req.into_inner();
        if r.soft_deleted == Some(true) {
            return Err(Status::not_found(
                "soft-deleted objects are not kept by this emulator",
            ));
        }
        let e = self.store.get(&bucket, &r.object, r.generation)?;
        preconditions_of!(r).check(Some((e.content.generation, e.metageneration)))?;
        let mut o = to_proto(&bucket, &r.object, &e);
        if self.calls.faults.get().stale_unfinalized_size {
            lag_behind_appends(&mut o, &e);
        }
        Ok(Response::new(o))
    }

    /// ListObjects: see `listing`.
    pub(crate) async fn list_objects_impl(
        &self,
        req: Request<ListObjectsRequest>,
    ) -> Result<Response<ListObjectsResponse>, Status> {
        add(&self.calls.stats.list_calls, 1);
        let bucket = self
            .unary(req.metadata(), "bucket", &req.get_ref().parent)
            .await?;
        let r = req.into_inner();
        if r.versions {
            return Err(Status::invalid_argument(
                "listing versions is not supported: this emulator keeps only live generations",
            ));
        }
        if !r.match_glob.is_empty() {
            return Err(Status::invalid_argument(
                "match_glob is not supported by this emulator",
            ));
        }
        let faults = self.calls.faults.get();
        let resp = self
            .store
            .snapshot_for_list(&bucket, &r.prefix, |b| list(&bucket, b, &r, &faults))??;
        Ok(Response::new(resp))
    }

    /// DeleteObject: the live object or a given generation, with preconditions.
    pub(crate) async fn delete_object_impl(
        &self,
        req: Request<DeleteObjectRequest>,
    ) -> Result<Response<()>, Status> {
        let bucket = self
            .unary(req.metadata(), "bucket", &req.get_ref().bucket)
            .await?;
        let r = req.into_inner();
        self.store
            .delete(&bucket, &r.object, r.generation, preconditions_of!(r))?;
        self.calls.answer(Response::new(()))
    }

    /// MoveObject: an atomic rename within the bucket.
    pub(crate) async fn move_object_impl(
        &self,
        req: Request<MoveObjectRequest>,
    ) -> Result<Response<Object>, Status> {
        let bucket = self
            .unary(req.metadata(), "bucket", &req.get_ref().bucket)
            .await?;
        let r = req.into_inner();
        self.refuse_replacing_unfinalized(&bucket, &r.destination_object)?;
        let e = self.store.move_object(
            &bucket,
            &r.source_object,
            &r.destination_object,
            Preconditions {
                if_generation_match: r.if_source_generation_match,
                if_generation_not_match: r.if_source_generation_not_match,
                if_metageneration_match: r.if_source_metageneration_match,
                if_metageneration_not_match: r.if_source_metageneration_not_match,
            },
            preconditions_of!(r),
        )?;
        self.calls
            .answer(Response::new(to_proto(&bucket, &r.destination_object, &e)))
    }

    /// UpdateObject of the custom metadata, the one field rapidfs updates: `metadata` sets
    /// the whole map, `metadata.KEY` one key, of the live object or of the generation the
    /// request's object names. Any other field is refused, so a client relying on more fails
    /// loudly here.
    pub(crate) async fn update_object_impl(
        &self,
        req: Request<UpdateObjectRequest>,
    ) -> Result<Response<Object>, Status> {
        let bucket_field = req
            .get_ref()
            .object
            .as_ref()
            .map(|o| o.bucket.clone())
            .unwrap_or_default();
        let bucket = self.unary(req.metadata(), "bucket", &bucket_field).await?;
        let r = req.into_inner();
        let object = r
            .object
            .ok_or_else(|| Status::invalid_argument("UpdateObject needs an object"))?;
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        if paths.is_empty() {
            return Err(Status::invalid_argument(
                "UpdateObject needs an update_mask",
            ));
        }
        let whole = paths.iter().any(|p| p == "metadata");
        let mut keys = Vec::new();
        for p in &paths {
            match p.strip_prefix("metadata.") {
                Some(key) if !key.is_empty() => keys.push(key.to_string()),
                _ if p == "metadata" => {}
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "the emulator updates only metadata, not {p:?}"
                    )))
                }
            }
        }
        // Google's clients drop a key by sending the whole map without it; whether the
        // service drops one named alone is not documented, so the emulator refuses it.
        if let Some(k) = keys.iter().find(|k| !object.metadata.contains_key(*k)) {
            return Err(Status::invalid_argument(format!(
                "update_mask names metadata.{k}, which the object's map does not hold"
            )));
        }
        let e = self.store.update_metadata(
            &bucket,
            &object.name,
            object.generation,
            object.metadata.into_iter().collect(),
            (!whole).then_some(keys.as_slice()),
            preconditions_of!(r),
        )?;
        self.calls
            .answer(Response::new(to_proto(&bucket, &object.name, &e)))
    }
}
