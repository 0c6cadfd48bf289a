//! StorageControl: GetStorageLayout (a zonal bucket with hierarchical namespace in the
//! configured zone) and the folder calls. Touches the store.

use super::bucket_names::{bucket_path, parse_bucket};
use super::object_proto::timestamp;
use super::stats::add;
use super::Service;
use crate::proto::control::{
    storage_layout, CreateFolderRequest, DeleteFolderRequest, Folder, GetFolderRequest,
    GetStorageLayoutRequest, RenameFolderRequest, StorageLayout,
};
use crate::proto::longrunning::{operation, Operation};
use prost::Message;
use std::time::{Duration, SystemTime};
use tonic::{Request, Response, Status};

/// Splits `projects/_/buckets/B/folders/a/b/` into ("B", "a/b/").
fn split_folder_name(name: &str) -> Result<(String, String), Status> {
    let (bucket, folder) = name.split_once("/folders/").ok_or_else(|| {
        Status::invalid_argument(format!(
            "invalid folder name {name:?}: expected projects/_/buckets/B/folders/PATH/"
        ))
    })?;
    Ok((parse_bucket(bucket)?, folder.to_string()))
}

fn folder_proto(bucket: &str, folder: &str, created: SystemTime) -> Folder {
    Folder {
        name: format!("{}/folders/{folder}", bucket_path(bucket)),
        metageneration: 1,
        create_time: Some(timestamp(created)),
        update_time: Some(timestamp(created)),
        pending_rename_info: None,
    }
}

/// Folder ids may come without the trailing slash.
fn with_slash(id: &str) -> String {
    if id.ends_with('/') {
        id.to_string()
    } else {
        format!("{id}/")
    }
}

impl Service {
    /// Counts a control call; the routing header may name the bucket under any key.
    async fn control(
        &self,
        meta: &tonic::metadata::MetadataMap,
        bucket: &str,
    ) -> Result<(), Status> {
        let full = bucket_path(bucket);
        let routed = super::wire::routing_params(meta)
            .iter()
            .any(|(_, v)| *v == full || v.starts_with(&format!("{full}/")));
        self.calls.begin_checked(routed)?;
        self.calls.delay().await;
        Ok(())
    }

    /// GetStorageLayout: location_type "zone" in the configured zone.
    pub(crate) async fn get_storage_layout_impl(
        &self,
        req: Request<GetStorageLayoutRequest>,
    ) -> Result<Response<StorageLayout>, Status> {
        let name = req.get_ref().name.clone();
        let bucket_field = name.strip_suffix("/storageLayout").ok_or_else(|| {
            Status::invalid_argument(format!(
                "invalid name {name:?}: expected projects/_/buckets/B/storageLayout"
            ))
        })?;
        let bucket = parse_bucket(bucket_field)?;
        self.control(req.metadata(), &bucket).await?;
        self.store.bucket(&bucket)?;
        Ok(Response::new(StorageLayout {
            name,
            location: self.region(),
            location_type: "zone".to_string(),
            custom_placement_config: Some(storage_layout::CustomPlacementConfig {
                data_locations: vec![self.zone.clone()],
            }),
            hierarchical_namespace: Some(storage_layout::HierarchicalNamespace { enabled: true }),
        }))
    }

    /// CreateFolder.
    pub(crate) async fn create_folder_impl(
        &self,
        req: Request<CreateFolderRequest>,
    ) -> Result<Response<Folder>, Status> {
        let bucket = parse_bucket(&req.get_ref().parent)?;
        self.control(req.metadata(), &bucket).await?;
        let r = req.into_inner();
        let folder = with_slash(&r.folder_id);
        let created = self.store.create_folder(&bucket, &folder, r.recursive)?;
        Ok(Response::new(folder_proto(&bucket, &folder, created)))
    }

    /// GetFolder.
    pub(crate) async fn get_folder_impl(
        &self,
        req: Request<GetFolderRequest>,
    ) -> Result<Response<Folder>, Status> {
        let (bucket, folder) = split_folder_name(&req.get_ref().name)?;
        self.control(req.metadata(), &bucket).await?;
        let created = self.store.get_folder(&bucket, &folder)?;
        let r = req.get_ref();
        if r.if_metageneration_match.is_some_and(|m| m != 1)
            || r.if_metageneration_not_match == Some(1)
        {
            return Err(Status::failed_precondition(
                "metageneration precondition failed: folders are at metageneration 1",
            ));
        }
        Ok(Response::new(folder_proto(&bucket, &folder, created)))
    }

    /// DeleteFolder: only an empty folder.
    pub(crate) async fn delete_folder_impl(
        &self,
        req: Request<DeleteFolderRequest>,
    ) -> Result<Response<()>, Status> {
        let (bucket, folder) = split_folder_name(&req.get_ref().name)?;
        self.control(req.metadata(), &bucket).await?;
        self.store.delete_folder(&bucket, &folder)?;
        Ok(Response::new(()))
    }

    /// RenameFolder: done at once; the operation comes back already done.
    pub(crate) async fn rename_folder_impl(
        &self,
        req: Request<RenameFolderRequest>,
    ) -> Result<Response<Operation>, Status> {
        let (bucket, folder) = split_folder_name(&req.get_ref().name)?;
        self.control(req.metadata(), &bucket).await?;
        let to = with_slash(&req.get_ref().destination_folder_id);
        let name = format!(
            "{}/operations/rename-{}",
            bucket_path(&bucket),
            rand::random::<u32>()
        );
        if let Some(ms) = self.calls.faults.get().rename_folder_pending_ms {
            self.store.check_rename_folder(&bucket, &folder, &to)?;
            add(&self.calls.stats.faults_injected, 1);
            let store = self.store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                if let Err(e) = store.rename_folder(&bucket, &folder, &to) {
                    tracing::warn!("a pending folder rename failed: {}", e.message());
                }
            });
            return Ok(Response::new(Operation {
                name,
                metadata: None,
                done: false,
                result: None,
            }));
        }
        let created = self.store.rename_folder(&bucket, &folder, &to)?;
        let result = folder_proto(&bucket, &to, created);
        Ok(Response::new(Operation {
            name,
            metadata: None,
            done: true,
            result: Some(operation::Result::Response(prost_types::Any {
                type_url: "type.googleapis.com/google.storage.control.v2.Folder".to_string(),
                value: result.encode_to_vec(),
            })),
        }))
    }
}
