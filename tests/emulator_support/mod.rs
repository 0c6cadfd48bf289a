//! Shared helpers of the emulator tests: start an in-process emulator on 127.0.0.1:0 and talk
//! to it with the generated tonic clients over real gRPC, adding the routing header.

#![allow(dead_code)]

use bytes::Bytes;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::proto::control::storage_control_client::StorageControlClient;
use rapidfs::proto::storage::bidi_write_object_request::{Data, FirstMessage};
use rapidfs::proto::storage::storage_client::StorageClient;
use rapidfs::proto::storage::{
    AppendObjectSpec, BidiReadObjectRequest, BidiReadObjectResponse, BidiReadObjectSpec,
    BidiWriteHandle, BidiWriteObjectRequest, BidiWriteObjectResponse, ChecksummedData, Object,
    ObjectChecksums, ReadRange, WriteObjectSpec,
};
use std::collections::HashMap;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Status, Streaming};

/// The wire name of a bucket.
pub fn bpath(bucket: &str) -> String {
    format!("projects/_/buckets/{bucket}")
}

/// A memory emulator with bucket "b".
pub async fn memory() -> Emulator {
    let emu = Emulator::start(
        EmulatorOptions {
            root: None,
            memory: true,
            zone: "us-central1-a".into(),
            faults: Faults::default(),
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    emu.create_bucket("b").unwrap();
    emu
}

/// A directory emulator over `root`.
pub async fn directory(root: &std::path::Path) -> Emulator {
    Emulator::start(
        EmulatorOptions {
            root: Some(root.to_path_buf()),
            memory: false,
            zone: "us-central1-a".into(),
            faults: Faults::default(),
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
}

/// A raw client.
pub async fn client(emu: &Emulator) -> StorageClient<Channel> {
    StorageClient::connect(emu.endpoint())
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// A raw control client.
pub async fn control(emu: &Emulator) -> StorageControlClient<Channel> {
    StorageControlClient::connect(emu.endpoint()).await.unwrap()
}

/// `msg` with the routing header for `bucket`.
pub fn routed<T>(bucket: &str, msg: T) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert(
        "x-goog-request-params",
        format!("bucket={}", bpath(bucket)).parse().unwrap(),
    );
    r
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u32).wrapping_mul(2654435761).wrapping_shr(13) as u8 ^ seed)
            .collect::<Vec<u8>>(),
    )
}

/// An open read stream: a sender of request messages and the response stream.
pub struct ReadSession {
    pub tx: mpsc::Sender<BidiReadObjectRequest>,
    pub rx: Streaming<BidiReadObjectResponse>,
    pub first: BidiReadObjectResponse,
}

/// Opens a BidiReadObject stream with `spec` and returns it after its first response.
pub async fn open_read(
    c: &mut StorageClient<Channel>,
    spec: BidiReadObjectSpec,
    ranges: Vec<ReadRange>,
) -> Result<ReadSession, Status> {
    let bucket = spec
        .bucket
        .trim_start_matches("projects/_/buckets/")
        .to_string();
    let (tx, rx) = mpsc::channel(16);
    tx.send(BidiReadObjectRequest {
        read_object_spec: Some(spec),
        read_ranges: ranges,
    })
    .await
    .unwrap();
    let mut rx = c
        .bidi_read_object(routed(&bucket, ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let first = rx
        .message()
        .await?
        .ok_or_else(|| Status::internal("stream ended before its first response"))?;
    Ok(ReadSession { tx, rx, first })
}

/// A spec for `bucket/object`.
pub fn spec(bucket: &str, object: &str) -> BidiReadObjectSpec {
    BidiReadObjectSpec {
        bucket: bpath(bucket),
        object: object.into(),
        ..Default::default()
    }
}

/// A range.
pub fn range(read_id: i64, offset: i64, len: i64) -> ReadRange {
    ReadRange {
        read_offset: offset,
        read_length: len,
        read_id,
    }
}

/// Everything received per read_id until every id in `ids` has seen range_end; checks
/// the CRC32C and the offsets of every chunk. Returns the bytes and the order of read_ids
/// as chunks arrived.
pub async fn collect(
    s: &mut ReadSession,
    ids: &[i64],
) -> Result<(HashMap<i64, Vec<u8>>, Vec<i64>), Status> {
    let mut out: HashMap<i64, Vec<u8>> = HashMap::new();
    let mut start: HashMap<i64, i64> = HashMap::new();
    let mut order = Vec::new();
    let mut open: std::collections::HashSet<i64> = ids.iter().copied().collect();
    // Ranges asked for in the first message may start in the first response.
    let mut first = std::mem::take(&mut s.first.object_data_ranges);
    while !open.is_empty() {
        let data = if first.is_empty() {
            s.rx.message()
                .await?
                .ok_or_else(|| Status::internal("stream ended early"))?
                .object_data_ranges
        } else {
            std::mem::take(&mut first)
        };
        for d in data {
            let rr = d.read_range.unwrap();
            if !open.contains(&rr.read_id) {
                assert!(
                    d.checksummed_data
                        .as_ref()
                        .is_none_or(|c| c.content.is_empty()),
                    "data for a finished read_id"
                );
                continue;
            }
            let cd = d.checksummed_data.unwrap_or_default();
            assert_eq!(cd.crc32c, Some(crc32c::crc32c(&cd.content)), "chunk crc32c");
            assert!(cd.content.len() <= 2 << 20, "chunk over 2 MiB");
            assert_eq!(rr.read_length as usize, cd.content.len());
            let buf = out.entry(rr.read_id).or_default();
            let first = *start.entry(rr.read_id).or_insert(rr.read_offset);
            assert_eq!(rr.read_offset, first + buf.len() as i64, "chunks in order");
            buf.extend_from_slice(&cd.content);
            order.push(rr.read_id);
            if d.range_end {
                open.remove(&rr.read_id);
            }
        }
    }
    Ok((out, order))
}

/// An open write stream.
pub struct WriteSession {
    pub tx: mpsc::Sender<BidiWriteObjectRequest>,
    pub rx: Streaming<BidiWriteObjectResponse>,
    pub first: Option<BidiWriteObjectResponse>,
}

/// A data message at `offset`.
pub fn data_msg(offset: u64, data: Bytes) -> BidiWriteObjectRequest {
    BidiWriteObjectRequest {
        write_offset: offset as i64,
        data: Some(Data::ChecksummedData(ChecksummedData {
            crc32c: Some(crc32c::crc32c(&data)),
            content: data,
        })),
        ..Default::default()
    }
}

impl WriteSession {
    /// Half-closes the request side (drops the only sender).
    pub fn half_close(&mut self) {
        self.tx = mpsc::channel(1).0;
    }
}

/// Opens a BidiWriteObject stream with `first` and waits for its first response when
/// `appendable`.
pub async fn open_write(
    c: &mut StorageClient<Channel>,
    bucket: &str,
    first: BidiWriteObjectRequest,
    appendable: bool,
) -> Result<WriteSession, Status> {
    let (tx, rx) = mpsc::channel(64);
    tx.send(first).await.unwrap();
    let mut rx = c
        .bidi_write_object(routed(bucket, ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let first = if appendable {
        Some(
            rx.message()
                .await?
                .ok_or_else(|| Status::internal("no first response"))?,
        )
    } else {
        None
    };
    Ok(WriteSession { tx, rx, first })
}

/// Sends `msgs` on one write stream whose every message, and its half-close, is queued
/// before the call starts (a small file's whole upload, as a mount sends it), and collects
/// the answers until the stream ends.
pub async fn upload_at_once(
    c: &mut StorageClient<Channel>,
    bucket: &str,
    msgs: Vec<BidiWriteObjectRequest>,
) -> Result<Vec<BidiWriteObjectResponse>, Status> {
    let (tx, rx) = mpsc::channel(msgs.len().max(1));
    for m in msgs {
        tx.send(m).await.unwrap();
    }
    drop(tx);
    let mut answers = c
        .bidi_write_object(routed(bucket, ReceiverStream::new(rx)))
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(r) = answers.message().await? {
        out.push(r);
    }
    Ok(out)
}

/// `upload_at_once` of `data` (`whole_upload_msgs`) to `BASE-0`, `BASE-1`, ... until the
/// emulator stores one in one step (its `whole_uploads` counter moves): whether the last
/// message has come in when the first is read depends on the machine's load. Returns the
/// name it took and its answers; fails after five streamed ones.
pub async fn upload_taken_whole(
    emu: &Emulator,
    c: &mut StorageClient<Channel>,
    base: &str,
    data: &Bytes,
    finish: bool,
) -> (String, Vec<BidiWriteObjectResponse>) {
    for k in 0..5 {
        let name = format!("{base}-{k}");
        let before = emu.stats().whole_uploads;
        let msgs = whole_upload_msgs("b", &name, data, finish);
        let answers = upload_at_once(c, "b", msgs).await.unwrap();
        if emu.stats().whole_uploads > before {
            return (name, answers);
        }
    }
    panic!("none of five uploads of {base} was taken in whole");
}

/// The messages of an upload of `data` to a new object `name`, sent whole: the create
/// carrying the first bytes, the rest with a flush and lookup, and a finish if `finish`.
pub fn whole_upload_msgs(
    bucket: &str,
    name: &str,
    data: &Bytes,
    finish: bool,
) -> Vec<BidiWriteObjectRequest> {
    let split = data.len() / 2;
    let mut first = create_msg(bucket, name, Some(0));
    first.data = data_msg(0, data.slice(..split)).data;
    let mut rest = data_msg(split as u64, data.slice(split..));
    (rest.flush, rest.state_lookup) = (!finish, !finish);
    let mut msgs = vec![first, rest];
    if finish {
        msgs.push(finish_msg(data.len() as u64, crc32c::crc32c(data)));
    }
    msgs
}

/// First message creating an appendable object.
pub fn create_msg(
    bucket: &str,
    name: &str,
    if_generation_match: Option<i64>,
) -> BidiWriteObjectRequest {
    BidiWriteObjectRequest {
        first_message: Some(FirstMessage::WriteObjectSpec(WriteObjectSpec {
            resource: Some(Object {
                name: name.into(),
                bucket: bpath(bucket),
                ..Default::default()
            }),
            if_generation_match,
            appendable: Some(true),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// First message taking over (no handle) or reconnecting (handle) to an appendable object.
pub fn append_msg(
    bucket: &str,
    name: &str,
    generation: i64,
    handle: Option<Bytes>,
    offset: u64,
) -> BidiWriteObjectRequest {
    BidiWriteObjectRequest {
        first_message: Some(FirstMessage::AppendObjectSpec(AppendObjectSpec {
            bucket: bpath(bucket),
            object: name.into(),
            generation,
            write_handle: handle.map(|h| BidiWriteHandle { handle: h }),
            ..Default::default()
        })),
        write_offset: offset as i64,
        ..Default::default()
    }
}

/// A finish message with the whole-object CRC32C.
pub fn finish_msg(offset: u64, crc: u32) -> BidiWriteObjectRequest {
    BidiWriteObjectRequest {
        write_offset: offset as i64,
        finish_write: true,
        object_checksums: Some(ObjectChecksums {
            crc32c: Some(crc),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A flush + state_lookup message.
pub fn lookup_msg(offset: u64) -> BidiWriteObjectRequest {
    BidiWriteObjectRequest {
        write_offset: offset as i64,
        flush: true,
        state_lookup: true,
        ..Default::default()
    }
}

/// The generation and write handle of a first write response.
pub fn resource_of(r: &BidiWriteObjectResponse) -> (Object, Bytes) {
    use rapidfs::proto::storage::bidi_write_object_response::WriteStatus;
    let obj = match &r.write_status {
        Some(WriteStatus::Resource(o)) => o.clone(),
        other => panic!("expected a resource, got {other:?}"),
    };
    (obj, r.write_handle.clone().unwrap().handle)
}

/// The persisted size of a response.
pub fn persisted_of(r: &BidiWriteObjectResponse) -> i64 {
    use rapidfs::proto::storage::bidi_write_object_response::WriteStatus;
    match &r.write_status {
        Some(WriteStatus::PersistedSize(n)) => *n,
        Some(WriteStatus::Resource(o)) => o.size,
        None => panic!("no write status in {r:?}"),
    }
}

/// Reads the whole live object in one range.
pub async fn read_all(c: &mut StorageClient<Channel>, bucket: &str, name: &str) -> Vec<u8> {
    let mut s = open_read(c, spec(bucket, name), vec![range(1, 0, 0)])
        .await
        .unwrap();
    let (mut got, _) = collect(&mut s, &[1]).await.unwrap();
    got.remove(&1).unwrap_or_default()
}

/// A `rapidfs emulator` child process and the endpoint it printed.
pub struct Spawned {
    pub child: std::process::Child,
    pub endpoint: String,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `rapidfs emulator ARGS` and waits (at most 20 s) for its endpoint line.
pub fn spawn_emulator(args: &[&str]) -> Spawned {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .arg("emulator")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rapidfs");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the emulator printed no endpoint line within 20 s");
    let endpoint = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no endpoint in {line:?}"))
        .to_string();
    Spawned { child, endpoint }
}
