//! The generated tonic service traits, implemented by delegating each RPC to its module
//! (`read`, `write`, `unary`, `control`). No logic of its own.

use super::read::ReadStream;
use super::write::WriteStream;
use super::Service;
use crate::proto::control::storage_control_server::StorageControl;
use crate::proto::control::{
    CreateFolderRequest, DeleteFolderRequest, Folder, GetFolderRequest, GetStorageLayoutRequest,
    RenameFolderRequest, StorageLayout,
};
use crate::proto::longrunning::Operation;
use crate::proto::storage::storage_server::Storage;
use crate::proto::storage::{
    BidiReadObjectRequest, BidiWriteObjectRequest, Bucket, DeleteObjectRequest, GetBucketRequest,
    GetObjectRequest, ListObjectsRequest, ListObjectsResponse, MoveObjectRequest, Object,
    UpdateObjectRequest,
};
use tonic::{Request, Response, Status, Streaming};

#[tonic::async_trait]
impl Storage for Service {
    async fn delete_object(
        &self,
        req: Request<DeleteObjectRequest>,
    ) -> Result<Response<()>, Status> {
        self.delete_object_impl(req).await
    }

    async fn get_bucket(&self, req: Request<GetBucketRequest>) -> Result<Response<Bucket>, Status> {
        self.get_bucket_impl(req).await
    }

    async fn get_object(&self, req: Request<GetObjectRequest>) -> Result<Response<Object>, Status> {
        self.get_object_impl(req).await
    }

    type BidiReadObjectStream = ReadStream;

    async fn bidi_read_object(
        &self,
        req: Request<Streaming<BidiReadObjectRequest>>,
    ) -> Result<Response<ReadStream>, Status> {
        self.bidi_read(req).await
    }

    type BidiWriteObjectStream = WriteStream;

    async fn bidi_write_object(
        &self,
        req: Request<Streaming<BidiWriteObjectRequest>>,
    ) -> Result<Response<WriteStream>, Status> {
        self.bidi_write(req).await
    }

    async fn list_objects(
        &self,
        req: Request<ListObjectsRequest>,
    ) -> Result<Response<ListObjectsResponse>, Status> {
        self.list_objects_impl(req).await
    }

    async fn move_object(
        &self,
        req: Request<MoveObjectRequest>,
    ) -> Result<Response<Object>, Status> {
        self.move_object_impl(req).await
    }

    async fn update_object(
        &self,
        req: Request<UpdateObjectRequest>,
    ) -> Result<Response<Object>, Status> {
        self.update_object_impl(req).await
    }
}

#[tonic::async_trait]
impl StorageControl for Service {
    async fn create_folder(
        &self,
        req: Request<CreateFolderRequest>,
    ) -> Result<Response<Folder>, Status> {
        self.create_folder_impl(req).await
    }

    async fn delete_folder(
        &self,
        req: Request<DeleteFolderRequest>,
    ) -> Result<Response<()>, Status> {
        self.delete_folder_impl(req).await
    }

    async fn get_folder(&self, req: Request<GetFolderRequest>) -> Result<Response<Folder>, Status> {
        self.get_folder_impl(req).await
    }

    async fn rename_folder(
        &self,
        req: Request<RenameFolderRequest>,
    ) -> Result<Response<Operation>, Status> {
        self.rename_folder_impl(req).await
    }

    async fn get_storage_layout(
        &self,
        req: Request<GetStorageLayoutRequest>,
    ) -> Result<Response<StorageLayout>, Status> {
        self.get_storage_layout_impl(req).await
    }
}
