//! Custom object metadata (`Object.metadata`) in the emulator: set by the first message of
//! the write that creates an object, returned by GetObject, ListObjects (when
//! the read mask asks for it) and the first BidiReadObject response, kept by MoveObject,
//! refused past the service's 8 KiB, and kept by the directory backend across a restart.

mod emulator_support;

use emulator_support::*;
use rapidfs::proto::storage::bidi_write_object_request::FirstMessage;
use rapidfs::proto::storage::storage_client::StorageClient;
use rapidfs::proto::storage::{GetObjectRequest, ListObjectsRequest, MoveObjectRequest, Object};
use std::collections::HashMap;
use tonic::transport::Channel;
use tonic::Code;

fn md(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Writes `data` as the new object `name` with `metadata` and finalizes it, in one stream;
/// the final resource.
async fn upload(
    c: &mut StorageClient<Channel>,
    name: &str,
    data: &'static [u8],
    metadata: HashMap<String, String>,
) -> Result<Object, tonic::Status> {
    let mut first = create_msg("b", name, None);
    if let Some(FirstMessage::WriteObjectSpec(spec)) = &mut first.first_message {
        spec.resource.as_mut().expect("a resource").metadata = metadata;
    }
    let mut w = open_write(c, "b", first, true).await?;
    let data = bytes::Bytes::from_static(data);
    w.tx.send(data_msg(0, data.clone())).await.unwrap();
    w.tx.send(finish_msg(data.len() as u64, crc32c::crc32c(&data)))
        .await
        .unwrap();
    let r = w.rx.message().await?.expect("a final response");
    Ok(resource_of_final(&r))
}

fn resource_of_final(r: &rapidfs::proto::storage::BidiWriteObjectResponse) -> Object {
    use rapidfs::proto::storage::bidi_write_object_response::WriteStatus;
    match &r.write_status {
        Some(WriteStatus::Resource(o)) => o.clone(),
        other => panic!("expected a resource, got {other:?}"),
    }
}

async fn get(c: &mut StorageClient<Channel>, name: &str) -> Object {
    c.get_object(routed(
        "b",
        GetObjectRequest {
            bucket: bpath("b"),
            object: name.into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

async fn list(c: &mut StorageClient<Channel>, mask: Option<&[&str]>) -> Vec<Object> {
    c.list_objects(routed(
        "b",
        ListObjectsRequest {
            parent: bpath("b"),
            read_mask: mask.map(|paths| prost_types::FieldMask {
                paths: paths.iter().map(|p| p.to_string()).collect(),
            }),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .objects
}

#[tokio::test]
async fn metadata_set_at_write_comes_back_from_every_call_and_follows_a_move() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let link = md(&[
        ("gcsfuse_symlink_target", "../blobs/abc"),
        ("goog-reserved-file-is-symlink", "true"),
    ]);
    let o = upload(&mut c, "snap/f", b"../blobs/abc", link.clone())
        .await
        .unwrap();
    assert_eq!(o.metadata, link, "the final resource carries it");
    assert_eq!(get(&mut c, "snap/f").await.metadata, link);

    // An appendable object keeps what its creating spec said.
    let mut create = create_msg("b", "log", Some(0));
    if let Some(FirstMessage::WriteObjectSpec(spec)) = &mut create.first_message {
        spec.resource.as_mut().unwrap().metadata = md(&[("k", "v")]);
    }
    let w = open_write(&mut c, "b", create, true).await.unwrap();
    let (first, _) = resource_of(w.first.as_ref().unwrap());
    assert_eq!(first.metadata, md(&[("k", "v")]));
    drop(w);

    let all = list(&mut c, None).await;
    let by_name = |objs: &[Object], n: &str| objs.iter().find(|o| o.name == n).cloned().unwrap();
    assert_eq!(by_name(&all, "snap/f").metadata, link);
    assert_eq!(by_name(&all, "log").metadata, md(&[("k", "v")]));
    let masked = list(&mut c, Some(&["size", "metadata"])).await;
    assert_eq!(by_name(&masked, "snap/f").metadata, link);
    let without = list(&mut c, Some(&["size"])).await;
    assert!(by_name(&without, "snap/f").metadata.is_empty());

    let s = open_read(&mut c, spec("b", "snap/f"), vec![])
        .await
        .unwrap();
    assert_eq!(s.first.metadata.unwrap().metadata, link);

    let moved = c
        .move_object(routed(
            "b",
            MoveObjectRequest {
                bucket: bpath("b"),
                source_object: "snap/f".into(),
                destination_object: "snap/g".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.metadata, link);
    assert_eq!(get(&mut c, "snap/g").await.metadata, link);

    // A new generation starts from what its own writer said.
    upload(&mut c, "snap/g", b"plain", HashMap::new())
        .await
        .unwrap();
    assert!(get(&mut c, "snap/g").await.metadata.is_empty());
}

#[tokio::test]
async fn metadata_past_8_kib_is_refused() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let big = md(&[("k", &"v".repeat(8 * 1024))]);
    let e = upload(&mut c, "big", b"x", big).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn the_directory_backend_keeps_metadata_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("b")).unwrap();
    let link = md(&[("gcsfuse_symlink_target", "target")]);
    let generation;
    {
        let emu = directory(dir.path()).await;
        let mut c = client(&emu).await;
        generation = upload(&mut c, "l", b"", link.clone())
            .await
            .unwrap()
            .generation;
        upload(&mut c, "plain", b"p", HashMap::new()).await.unwrap();
        emu.shutdown().await;
    }
    {
        // Back from the snapshot the first start wrote and the journal after it.
        let emu = directory(dir.path()).await;
        let mut c = client(&emu).await;
        let o = get(&mut c, "l").await;
        assert_eq!((o.generation, o.metadata), (generation, link.clone()));
        assert!(get(&mut c, "plain").await.metadata.is_empty());
        emu.shutdown().await;
    }
    // A restart of a restart: from the snapshot the second start folded it into.
    let emu = directory(dir.path()).await;
    let mut c = client(&emu).await;
    assert_eq!(get(&mut c, "l").await.metadata, link);
}
