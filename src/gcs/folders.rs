//! The folder calls of the Storage Control API (hierarchical namespace): CreateFolder,
//! DeleteFolder, GetFolder and RenameFolder, each with the routing header, a per-call
//! deadline, a request id kept across retries (so the service can tell a retry from a new
//! request) and the shared retry policy. Folder names are prefixes ending in `/` ("a/b/").
//! Touches only its own calls.

use super::unary::{request_id, to_status};
use super::{bucket_path, retry, routing, Client, Error, Result};
use crate::proto::control as pb;
use crate::proto::longrunning::operation;
use std::time::Duration;
use tonic::Code;

/// `projects/_/buckets/B/folders/a/b/`, the name a folder goes by.
fn folder_name(bucket: &str, folder: &str) -> String {
    format!("{}/folders/{folder}", bucket_path(bucket))
}

fn what(bucket: &str, folder: &str) -> String {
    format!("folder gs://{bucket}/{folder}")
}

impl Client {
    fn control_timeout(&self) -> Duration {
        Duration::from_millis(self.config().call_timeout_ms)
    }

    /// Creates folder `folder` ("a/b/"); `recursive` creates missing parents too.
    /// `AlreadyExists` when it is there already.
    pub async fn create_folder(&self, bucket: &str, folder: &str, recursive: bool) -> Result<()> {
        let msg = pb::CreateFolderRequest {
            parent: bucket_path(bucket),
            folder: Some(pb::Folder::default()),
            folder_id: folder.to_string(),
            recursive,
            request_id: request_id(),
        };
        retry::unary(self.config(), &what(bucket, folder), |attempt| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.control_timeout()));
            let mut stub = self.control_stub();
            async move {
                match stub.create_folder(req.map_err(to_status)?).await {
                    // A retry that finds the folder means an earlier attempt made it and only
                    // its answer was lost.
                    Err(s) if attempt > 0 && s.code() == Code::AlreadyExists => Ok(()),
                    r => r.map(|_| ()),
                }
            }
        })
        .await
    }

    /// Deletes the empty folder `folder`; `PreconditionFailed` when it is not empty.
    pub async fn delete_folder(&self, bucket: &str, folder: &str) -> Result<()> {
        let msg = pb::DeleteFolderRequest {
            name: folder_name(bucket, folder),
            request_id: request_id(),
            ..Default::default()
        };
        retry::unary(self.config(), &what(bucket, folder), |attempt| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.control_timeout()));
            let mut stub = self.control_stub();
            async move {
                match stub.delete_folder(req.map_err(to_status)?).await {
                    Err(s) if attempt > 0 && s.code() == Code::NotFound => Ok(()),
                    r => r.map(|_| ()),
                }
            }
        })
        .await
    }

    /// Whether folder `folder` exists.
    pub async fn folder_exists(&self, bucket: &str, folder: &str) -> Result<bool> {
        let msg = pb::GetFolderRequest {
            name: folder_name(bucket, folder),
            request_id: request_id(),
            ..Default::default()
        };
        let r = retry::unary(self.config(), &what(bucket, folder), |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.control_timeout()));
            let mut stub = self.control_stub();
            async move { stub.get_folder(req.map_err(to_status)?).await }
        })
        .await;
        match r {
            Ok(_) => Ok(true),
            Err(Error::NotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Renames folder `from` with everything under it to `to` (both "a/b/"). The service
    /// answers with a long-running operation; when it is not done yet, this waits until the
    /// destination exists and the source is gone (GetFolder, with backoff, under the retry
    /// deadline) rather than polling the operations API.
    pub async fn rename_folder(&self, bucket: &str, from: &str, to: &str) -> Result<()> {
        let msg = pb::RenameFolderRequest {
            name: folder_name(bucket, from),
            destination_folder_id: to.to_string(),
            request_id: request_id(),
            ..Default::default()
        };
        let w = format!("rename {} to {to}", what(bucket, from));
        let op = retry::unary(self.config(), &w, |_| {
            let req = routing::request(msg.clone(), bucket, None, Some(self.control_timeout()));
            let mut stub = self.control_stub();
            async move { stub.rename_folder(req.map_err(to_status)?).await }
        })
        .await?
        .into_inner();
        if let Some(operation::Result::Error(s)) = &op.result {
            let status = tonic::Status::new(Code::from_i32(s.code), s.message.clone());
            return Err(retry::map_status(&status, &w));
        }
        if op.done {
            return Ok(());
        }
        let mut backoff = retry::Backoff::new(self.config());
        loop {
            if self.folder_exists(bucket, to).await? && !self.folder_exists(bucket, from).await? {
                return Ok(());
            }
            if !backoff.wait().await {
                return Err(Error::Unavailable(format!(
                    "{w}: operation {} not done within the retry deadline",
                    op.name
                )));
            }
        }
    }
}
