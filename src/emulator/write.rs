//! BidiWriteObject: creating, appending to, taking over and finalizing appendable objects,
//! the only kind a zonal bucket holds (any other upload is refused). Checks
//! each chunk's CRC32C and the whole object's on finish, enforces one writer per object
//! (fencing by write handle), and answers only the first message, every state_lookup, and
//! once at close or finish. An upload that came in whole with its first message is stored in
//! one step (`write_burst`). Touches the store and the stream's own state.

use super::bucket_names::{bucket_path, parse_bucket};
use super::content::{Content, ContentWriter, Segments, MAX_CHUNK};
use super::object_proto::to_proto;
use super::preconditions::{preconditions_of, Preconditions};
use super::stats::add;
use super::store::{CustomMetadata, Entry};
use super::wire::{decode_handle, encode_handle, header_routing_token, status_with_detail, Outbox};
use super::write_burst::{whole_upload, Incoming};
use super::Service;
use crate::proto::storage::bidi_write_object_request::{Data, FirstMessage};
use crate::proto::storage::bidi_write_object_response::WriteStatus;
use crate::proto::storage::{
    BidiWriteHandle, BidiWriteObjectRedirectedError, BidiWriteObjectRequest,
    BidiWriteObjectResponse, ObjectChecksums,
};
use bytes::Bytes;
use std::time::Duration;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

/// Tag of write handles.
const WRITE_HANDLE_TAG: &str = "wh1";

/// The response stream type.
pub(crate) type WriteStream = ReceiverStream<Result<BidiWriteObjectResponse, Status>>;

/// The appendable object a stream writes, created or reopened by its first message: bytes
/// go straight to the store.
struct Target {
    entry: Entry,
    writer: ContentWriter,
}

impl Service {
    /// Handles one BidiWriteObject call.
    pub(crate) async fn bidi_write(
        &self,
        req: Request<Streaming<BidiWriteObjectRequest>>,
    ) -> Result<Response<WriteStream>, Status> {
        let opened = self.open_write_stream(req).await;
        if opened.is_err() {
            // A failed open is a response too: it comes after the injected latency.
            self.calls.delay().await;
        }
        opened
    }

    async fn open_write_stream(
        &self,
        req: Request<Streaming<BidiWriteObjectRequest>>,
    ) -> Result<Response<WriteStream>, Status> {
        add(&self.calls.stats.write_streams, 1);
        let header_token = header_routing_token(req.metadata());
        let meta = req.metadata().clone();
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("the stream ended before its first message"))?;
        let faults = self.calls.faults.get();
        let creates = matches!(first.first_message, Some(FirstMessage::WriteObjectSpec(_)));
        let stalls = faults.stall_new_write_after_bytes.is_some() && creates;
        let mut incoming = Incoming::new(first, stream);
        // The faults that act on each message as it comes keep the stream message by message.
        let whole_at_once = creates
            && faults.cut_write_after_bytes.is_none()
            && faults.write_kib_per_s.is_none()
            && !stalls;
        if whole_at_once {
            incoming.take_in_what_came();
        }
        let first = incoming.first();
        let (bucket, name, target) = match &first.first_message {
            Some(FirstMessage::WriteObjectSpec(spec)) => {
                let resource = spec.resource.as_ref().ok_or_else(|| {
                    Status::invalid_argument("write_object_spec.resource is required")
                })?;
                let bucket = parse_bucket(&resource.bucket)?;
                self.calls.begin(&meta, "bucket", &bucket_path(&bucket))?;
                // A zonal bucket holds only appendable objects: it refuses any other upload.
                if spec.appendable != Some(true) {
                    return Err(Status::invalid_argument(format!(
                        "{:?}: objects in a zonal bucket must be appendable (set write_object_spec.appendable)",
                        resource.name
                    )));
                }
                let pre = preconditions_of!(spec);
                let presented = header_token.clone();
                if let Some(token) = self.calls.faults.redirect(presented.as_deref()) {
                    return Err(self.redirect(token, None));
                }
                self.refuse_replacing_unfinalized(&bucket, &resource.name)?;
                let metadata: CustomMetadata = resource
                    .metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                if let Some(up) = whole_at_once.then(|| whole_upload(&incoming)).flatten() {
                    return self
                        .store_whole(&bucket, &resource.name, up, pre, metadata)
                        .await;
                }
                let (entry, writer) = self.store.create_appendable(
                    &bucket,
                    &resource.name,
                    pre,
                    metadata,
                    Segments::default(),
                )?;
                let target = Target { entry, writer };
                (bucket, resource.name.clone(), target)
            }
            Some(FirstMessage::AppendObjectSpec(spec)) => {
                let bucket = parse_bucket(&spec.bucket)?;
                self.calls.begin(&meta, "bucket", &bucket_path(&bucket))?;
                let handle_token = match spec.write_handle.as_ref().filter(|h| !h.handle.is_empty()) {
                    Some(h) => {
                        let parts = decode_handle(WRITE_HANDLE_TAG, &h.handle)?;
                        if parts.first().copied() != Some(spec.generation as u64) {
                            return Err(Status::invalid_argument(format!(
                                "the write handle is not for generation {}",
                                spec.generation
                            )));
                        }
                        Some(parts.get(1).copied().unwrap_or(0))
                    }
                    None => None,
                };
                let pre = Preconditions {
                    if_metageneration_match: spec.if_metageneration_match,
                    if_metageneration_not_match: spec.if_metageneration_not_match,
                    ..Preconditions::default()
                };
                let presented = spec.routing_token.clone().or(header_token);
                if let Some(token) = self.calls.faults.redirect(presented.as_deref()) {
                    // A redirected takeover still takes over: the handle we hand out is the new owner's.
                    let (_, writer) = self.store.open_appendable(
                        &bucket,
                        &spec.object,
                        spec.generation,
                        handle_token,
                        pre,
                    )?;
                    return Err(self.redirect(token, Some(&writer)));
                }
                let (entry, writer) = self.store.open_appendable(
                    &bucket,
                    &spec.object,
                    spec.generation,
                    handle_token,
                    pre,
                )?;
                (bucket, spec.object.clone(), Target { entry, writer })
            }
            Some(FirstMessage::UploadId(_)) => {
                return Err(Status::unimplemented(
                    "resumable uploads by upload_id are not supported by this emulator",
                ))
            }
            None => {
                return Err(Status::invalid_argument(
                    "the first BidiWriteObjectRequest must carry write_object_spec or append_object_spec",
                ))
            }
        };
        let (out, stream) = Outbox::new(self.calls.faults.latency());
        let session = Session {
            service: self.clone(),
            bucket,
            name,
            out,
            received: 0,
            cut: faults.cut_write_after_bytes,
            kib_per_s: faults.write_kib_per_s.filter(|&rate| rate > 0),
            stall: faults.stall_new_write_after_bytes.filter(|_| stalls),
        };
        tokio::spawn(session.run(target, incoming));
        Ok(Response::new(stream))
    }

    /// The `refuse_replace_unfinalized` fault: refuses (FAILED_PRECONDITION) a write or move
    /// onto `name` while its live object is unfinalized.
    pub(crate) fn refuse_replacing_unfinalized(
        &self,
        bucket: &str,
        name: &str,
    ) -> Result<(), Status> {
        if !self.calls.faults.get().refuse_replace_unfinalized {
            return Ok(());
        }
        let live = self.store.get(bucket, name, 0).ok();
        if live.is_some_and(|e| e.content.state().finalized.is_none()) {
            add(&self.calls.stats.faults_injected, 1);
            return Err(Status::failed_precondition(format!(
                "injected fault: {name:?} is an unfinalized appendable object and cannot be replaced; delete it first"
            )));
        }
        Ok(())
    }

    fn redirect(&self, token: String, writer: Option<&ContentWriter>) -> Status {
        add(&self.calls.stats.faults_injected, 1);
        let detail = BidiWriteObjectRedirectedError {
            routing_token: Some(token),
            write_handle: writer.map(|w| BidiWriteHandle {
                handle: write_handle(&w.content, w.token),
            }),
            generation: writer.map(|w| w.content.generation),
        };
        status_with_detail(
            Code::Aborted,
            "injected fault: redirected; reopen with the routing token (and write handle)".into(),
            "google.storage.v2.BidiWriteObjectRedirectedError",
            &detail,
        )
    }
}

pub(super) fn write_handle(content: &Content, token: u64) -> Bytes {
    encode_handle(WRITE_HANDLE_TAG, &[content.generation as u64, token])
}

/// The state of one write stream after it opened.
struct Session {
    service: Service,
    bucket: String,
    name: String,
    out: Outbox<BidiWriteObjectResponse>,
    received: u64,
    cut: Option<u64>,
    /// Take in payload no faster than this (`Faults`).
    kib_per_s: Option<u64>,
    /// Stop reading and answering past this many payload bytes (`Faults`).
    stall: Option<u64>,
}

/// How a message left the stream.
enum Next {
    /// Keep reading.
    More,
    /// The object was finalized; the stream is done.
    Finished,
    /// An injected stall: read and answer nothing more.
    Stalled,
}

impl Session {
    async fn run(mut self, mut target: Target, mut incoming: Incoming) {
        let resp = BidiWriteObjectResponse {
            write_status: Some(WriteStatus::Resource(to_proto(
                &self.bucket,
                &self.name,
                &target.entry,
            ))),
            write_handle: Some(BidiWriteHandle {
                handle: write_handle(&target.writer.content, target.writer.token),
            }),
            persisted_data_checksums: None,
        };
        if !self.out.send(Ok(resp)).await {
            self.end(&mut target);
            return;
        }
        loop {
            let m = match incoming.next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => {
                    self.end(&mut target);
                    return;
                }
            };
            self.carry(&m).await;
            match self.handle(m, &mut target).await {
                Ok(Next::More) => {}
                Ok(Next::Finished) => return,
                Ok(Next::Stalled) => {
                    self.out.closed().await;
                    self.end(&mut target);
                    return;
                }
                Err(status) => {
                    self.end(&mut target);
                    self.out.send(Err(status)).await;
                    return;
                }
            }
        }
        // Half-closed without finish_write: make it durable and report the size once.
        let resp = match self.sync(&mut target.writer) {
            Ok(()) => Ok(persisted_response(&target.writer.content)),
            Err(e) => Err(e),
        };
        self.out.send(resp).await;
    }

    /// Waits as long as a link of the injected rate takes to carry `m`'s payload.
    async fn carry(&self, m: &BidiWriteObjectRequest) {
        let (Some(rate), Some(Data::ChecksummedData(d))) = (self.kib_per_s, &m.data) else {
            return;
        };
        let secs = d.content.len() as f64 / (rate as f64 * 1024.0);
        tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    }

    /// Makes what was written durable whatever way the stream ends.
    fn end(&mut self, target: &mut Target) {
        if let Err(e) = self.sync(&mut target.writer) {
            tracing::warn!("sync at stream end failed: {}", e.message());
        }
    }

    /// Makes the bytes written durable and, when that grew the object, records its new
    /// size without a sync of its own (see `Store::grown`).
    fn sync(&self, writer: &mut ContentWriter) -> Result<(), Status> {
        self.service.store.check_healthy()?;
        if writer.sync()? {
            self.service.store.grown(&self.bucket, &self.name)?;
        }
        Ok(())
    }

    async fn handle(
        &mut self,
        m: BidiWriteObjectRequest,
        target: &mut Target,
    ) -> Result<Next, Status> {
        let stats = self.service.calls.stats.clone();
        let data = m.data.map(|Data::ChecksummedData(d)| d);
        if let Some(d) = &data {
            let len = d.content.len() as u64;
            if self.stall.is_some_and(|stall| self.received + len > stall) {
                add(&stats.faults_injected, 1);
                return Ok(Next::Stalled);
            }
            add(&stats.bytes_received, len);
            if let Some(cut) = self.cut {
                if self.received + len > cut {
                    add(&stats.faults_injected, 1);
                    return Err(Status::unavailable(format!(
                        "injected fault: write stream cut after {} of at most {cut} payload bytes",
                        self.received
                    )));
                }
            }
            self.received += len;
            if d.content.len() > MAX_CHUNK {
                return Err(Status::invalid_argument(format!(
                    "a chunk of {} bytes exceeds the limit of {MAX_CHUNK}",
                    d.content.len()
                )));
            }
            if let Some(crc) = d.crc32c {
                let actual = crate::gcs::crc32c(&d.content);
                if actual != crc {
                    return Err(Status::invalid_argument(format!(
                        "chunk crc32c mismatch at write_offset {}: the client sent {crc:#010x}, the {} bytes have {actual:#010x}",
                        m.write_offset,
                        d.content.len()
                    )));
                }
            }
        }
        if m.write_offset < 0 {
            return Err(Status::invalid_argument("write_offset is negative"));
        }
        let offset = m.write_offset as u64;
        let expected_crc = m.object_checksums.as_ref().and_then(|c| c.crc32c);
        let writer = &mut target.writer;
        writer.check()?;
        if let Some(d) = data {
            // A CRC32C the chunk came with was checked against its bytes above.
            writer.append(offset, d.content, d.crc32c)?;
        }
        if m.finish_write {
            self.service.store.check_healthy()?;
            writer.finalize(expected_crc)?;
            self.service
                .store
                .persist(&self.bucket, &self.name, &writer.content)?;
            let entry =
                self.service
                    .store
                    .get(&self.bucket, &self.name, writer.content.generation)?;
            let resp = BidiWriteObjectResponse {
                write_status: Some(WriteStatus::Resource(to_proto(
                    &self.bucket,
                    &self.name,
                    &entry,
                ))),
                write_handle: None,
                persisted_data_checksums: None,
            };
            self.out.send(Ok(resp)).await;
            return Ok(Next::Finished);
        }
        if m.flush || m.state_lookup {
            self.sync(writer)?;
        }
        if m.state_lookup {
            let resp = persisted_response(&writer.content);
            self.out.send(Ok(resp)).await;
        }
        Ok(Next::More)
    }
}

/// The persisted size of an appendable object with the CRC32C of those bytes.
pub(super) fn persisted_response(content: &Content) -> BidiWriteObjectResponse {
    let (size, crc) = {
        let st = content.state();
        (st.persisted, st.persisted_crc)
    };
    size_response(size, Some(crc))
}

fn size_response(size: u64, crc: Option<u32>) -> BidiWriteObjectResponse {
    BidiWriteObjectResponse {
        write_status: Some(WriteStatus::PersistedSize(size as i64)),
        write_handle: None,
        persisted_data_checksums: crc.map(|c| ObjectChecksums {
            crc32c: Some(c),
            md5_hash: Bytes::new(),
        }),
    }
}
