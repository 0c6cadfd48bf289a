//! Raw gRPC tests of every RPC of the emulator (memory backend): semantics and error statuses.

mod emulator_support;

use bytes::Bytes;
use emulator_support::*;
use rapidfs::proto::control::{
    CreateFolderRequest, DeleteFolderRequest, GetFolderRequest, GetStorageLayoutRequest,
    RenameFolderRequest,
};
use rapidfs::proto::storage::{
    BidiReadHandle, BidiReadObjectRequest, DeleteObjectRequest, GetBucketRequest, GetObjectRequest,
    ListObjectsRequest, MoveObjectRequest, Object, UpdateObjectRequest,
};
use tonic::Code;

#[tokio::test]
async fn bucket_and_layout_report_a_zonal_bucket() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut r = tonic::Request::new(GetBucketRequest {
        name: bpath("b"),
        ..Default::default()
    });
    r.metadata_mut().insert(
        "x-goog-request-params",
        "name=projects/_/buckets/b".parse().unwrap(),
    );
    let b = c.get_bucket(r).await.unwrap().into_inner();
    assert_eq!(b.location_type, "zone");
    assert_eq!(b.storage_class, "RAPID");
    assert!(b.hierarchical_namespace.unwrap().enabled);

    let mut ctl = control(&emu).await;
    let layout = ctl
        .get_storage_layout(routed(
            "b",
            GetStorageLayoutRequest {
                name: format!("{}/storageLayout", bpath("b")),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(layout.location_type, "zone");
    assert_eq!(layout.location, "US-CENTRAL1");
    assert_eq!(
        layout.custom_placement_config.unwrap().data_locations,
        vec!["us-central1-a".to_string()]
    );
    let missing = ctl
        .get_storage_layout(routed(
            "nope",
            GetStorageLayoutRequest {
                name: format!("{}/storageLayout", bpath("nope")),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test]
async fn get_object_reports_generation_size_and_checksum() {
    let emu = memory().await;
    let data = pattern(1000, 1);
    let g = emu.put_object("b", "dir/x", data.clone()).unwrap();
    let mut c = client(&emu).await;
    let o = c
        .get_object(routed(
            "b",
            GetObjectRequest {
                bucket: bpath("b"),
                object: "dir/x".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(o.generation, g);
    assert_eq!(o.size, 1000);
    assert!(o.finalize_time.is_some());
    assert_eq!(o.checksums.unwrap().crc32c, Some(crc32c::crc32c(&data)));

    let get = |object: &str, generation: i64, m: Option<i64>| GetObjectRequest {
        bucket: bpath("b"),
        object: object.into(),
        generation,
        if_generation_match: m,
        ..Default::default()
    };
    let e = c
        .get_object(routed("b", get("nope", 0, None)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .get_object(routed("b", get("dir/x", g + 1, None)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .get_object(routed("b", get("dir/x", 0, Some(g + 1))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let e = c
        .get_object(routed(
            "zz",
            GetObjectRequest {
                bucket: bpath("zz"),
                object: "x".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(emu.stats().get_object_calls, 5);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test]
async fn a_call_without_routing_header_is_counted() {
    let emu = memory().await;
    emu.put_object("b", "x", Bytes::from_static(b"x")).unwrap();
    let mut c = client(&emu).await;
    c.get_object(GetObjectRequest {
        bucket: bpath("b"),
        object: "x".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(emu.stats().missing_routing_header, 1);
    let mut r = tonic::Request::new(GetObjectRequest {
        bucket: bpath("b"),
        object: "x".into(),
        ..Default::default()
    });
    r.metadata_mut().insert(
        "x-goog-request-params",
        "bucket=projects%2F_%2Fbuckets%2Fb".parse().unwrap(),
    );
    c.get_object(r).await.unwrap();
    assert_eq!(
        emu.stats().missing_routing_header,
        1,
        "encoded header accepted"
    );
}

#[tokio::test]
async fn bidi_read_serves_many_ranges_on_one_stream() {
    let emu = memory().await;
    let data = pattern(5 << 20, 7);
    let g = emu.put_object("b", "obj", data.clone()).unwrap();
    let mut c = client(&emu).await;
    let mut s = open_read(&mut c, spec("b", "obj"), vec![]).await.unwrap();
    let meta = s
        .first
        .metadata
        .clone()
        .expect("metadata in the first response");
    assert_eq!(meta.generation, g);
    assert_eq!(meta.size, 5 << 20);
    let handle = s.first.read_handle.clone().expect("read handle");
    assert!(s.first.object_data_ranges.is_empty());

    s.tx.send(BidiReadObjectRequest {
        read_object_spec: None,
        read_ranges: vec![
            range(10, 0, 100),
            range(11, 1 << 20, 3 << 20),
            range(12, -10, 0),
            range(13, (5 << 20) - 5, 100),
            range(14, 0, 0),
            range(15, 5 << 20, 0),
        ],
    })
    .await
    .unwrap();
    let (got, _) = collect(&mut s, &[10, 11, 12, 13, 14, 15]).await.unwrap();
    assert_eq!(got[&10], data[..100]);
    assert_eq!(got[&11], data[1 << 20..4 << 20]);
    assert_eq!(got[&12], data[data.len() - 10..]);
    assert_eq!(got[&13], data[data.len() - 5..]);
    assert_eq!(got[&14], data[..]);
    assert!(got.get(&15).is_none_or(|v| v.is_empty()));
    // A second batch on the same stream, reusing finished read_ids.
    s.tx.send(BidiReadObjectRequest {
        read_object_spec: None,
        read_ranges: vec![range(10, 7, 9)],
    })
    .await
    .unwrap();
    let (got, _) = collect(&mut s, &[10]).await.unwrap();
    assert_eq!(got[&10], data[7..16]);
    drop(s.tx);
    assert!(
        s.rx.message().await.unwrap().is_none(),
        "half-close ends the stream"
    );

    // Reopen with the read handle: no metadata this time, same generation.
    let mut sp = spec("b", "obj");
    sp.read_handle = Some(BidiReadHandle {
        handle: handle.handle,
    });
    let s2 = open_read(&mut c, sp, vec![]).await.unwrap();
    assert!(s2.first.metadata.is_none());
    assert!(s2.first.read_handle.is_some());
    let st = emu.stats();
    assert_eq!(st.ranges_requested, 7);
    assert_eq!(st.bytes_requested, 100 + (3 << 20) + 10 + 5 + (5 << 20) + 9);
    assert_eq!(st.bytes_sent, st.bytes_requested);
    assert_eq!(st.read_streams, 2);
    assert_eq!(st.missing_routing_header, 0);
}

async fn read_error(
    emu: &rapidfs::emulator::Emulator,
    ranges: Vec<rapidfs::proto::storage::ReadRange>,
) -> tonic::Status {
    let mut c = client(emu).await;
    let mut s = open_read(&mut c, spec("b", "obj"), vec![]).await.unwrap();
    s.tx.send(BidiReadObjectRequest {
        read_object_spec: None,
        read_ranges: ranges,
    })
    .await
    .unwrap();
    loop {
        match s.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without an error"),
            Err(e) => return e,
        }
    }
}

#[tokio::test]
async fn bidi_read_errors_have_real_statuses() {
    let emu = memory().await;
    emu.put_object("b", "obj", pattern(1000, 1)).unwrap();
    let e = read_error(&emu, vec![range(1, 1001, 1)]).await;
    assert_eq!(e.code(), Code::OutOfRange);
    assert!(!e.details().is_empty(), "BidiReadObjectError details");
    let e = read_error(&emu, vec![range(1, 0, -1)]).await;
    assert_eq!(e.code(), Code::OutOfRange);
    let many = (0..101).map(|i| range(i, 0, 1)).collect();
    let e = read_error(&emu, many).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = read_error(&emu, vec![range(1, 0, 0), range(1, 0, 0)]).await;
    assert_eq!(e.code(), Code::InvalidArgument);
    // exactly 100 is fine
    let mut c = client(&emu).await;
    let hundred: Vec<_> = (0..100).map(|i| range(i, i, 1)).collect();
    let mut s = open_read(&mut c, spec("b", "obj"), hundred).await.unwrap();
    let ids: Vec<i64> = (0..100).collect();
    collect(&mut s, &ids).await.unwrap();
    // spec on a later message
    let mut s = open_read(&mut c, spec("b", "obj"), vec![]).await.unwrap();
    s.tx.send(BidiReadObjectRequest {
        read_object_spec: Some(spec("b", "obj")),
        read_ranges: vec![],
    })
    .await
    .unwrap();
    let e = loop {
        match s.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no error"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.code(), Code::InvalidArgument);
    // missing object, missing bucket, wrong generation
    let e = open_read(&mut c, spec("b", "nope"), vec![])
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let e = open_read(&mut c, spec("zz", "obj"), vec![])
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let mut sp = spec("b", "obj");
    sp.generation = 1;
    let e = open_read(&mut c, sp, vec![]).await.err().unwrap();
    assert_eq!(e.code(), Code::NotFound);
}

fn list_req(prefix: &str, delimiter: &str) -> ListObjectsRequest {
    ListObjectsRequest {
        parent: bpath("b"),
        prefix: prefix.into(),
        delimiter: delimiter.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn list_objects_prefix_delimiter_pages_and_folders() {
    let emu = memory().await;
    for n in ["a/1", "a/2", "a/sub/3", "b", "c/4", "d"] {
        emu.put_object("b", n, Bytes::from_static(b"x")).unwrap();
    }
    let mut c = client(&emu).await;
    let mut ctl = control(&emu).await;
    ctl.create_folder(routed(
        "b",
        CreateFolderRequest {
            parent: bpath("b"),
            folder_id: "empty/".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let names = |r: &rapidfs::proto::storage::ListObjectsResponse| {
        r.objects.iter().map(|o| o.name.clone()).collect::<Vec<_>>()
    };
    let r = c
        .list_objects(routed("b", list_req("", "/")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&r), ["b", "d"]);
    assert_eq!(r.prefixes, ["a/", "c/"]);
    let mut q = list_req("", "/");
    q.include_folders_as_prefixes = true;
    let r = c.list_objects(routed("b", q)).await.unwrap().into_inner();
    assert_eq!(r.prefixes, ["a/", "c/", "empty/"]);
    let r = c
        .list_objects(routed("b", list_req("a/", "/")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&r), ["a/1", "a/2"]);
    assert_eq!(r.prefixes, ["a/sub/"]);
    let r = c
        .list_objects(routed("b", list_req("a/", "")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(names(&r), ["a/1", "a/2", "a/sub/3"]);
    // pages of 2, without delimiter then with one
    for (delim, want) in [
        ("", vec!["a/1", "a/2", "a/sub/3", "b", "c/4", "d"]),
        ("/", vec!["a/", "b", "c/", "d"]),
    ] {
        let mut seen = Vec::new();
        let mut token = String::new();
        let mut pages = 0;
        loop {
            let mut q = list_req("", delim);
            q.page_size = 2;
            q.page_token = token.clone();
            let r = c.list_objects(routed("b", q)).await.unwrap().into_inner();
            assert!(r.objects.len() + r.prefixes.len() <= 2);
            let mut items: Vec<String> = names(&r);
            items.extend(r.prefixes.clone());
            items.sort();
            seen.extend(items);
            pages += 1;
            if r.next_page_token.is_empty() {
                break;
            }
            token = r.next_page_token;
        }
        assert_eq!(seen, want);
        assert_eq!(pages, want.len().div_ceil(2));
    }
    let mut q = list_req("", "");
    q.lexicographic_start = "a/2".into();
    q.lexicographic_end = "c/4".into();
    let r = c.list_objects(routed("b", q)).await.unwrap().into_inner();
    assert_eq!(names(&r), ["a/2", "a/sub/3", "b"]);
    let mut q = list_req("", "");
    q.page_token = "garbage".into();
    let e = c.list_objects(routed("b", q)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(emu.stats().list_calls, 11);
}

#[tokio::test]
async fn list_objects_sends_only_the_fields_a_read_mask_names() {
    let emu = memory().await;
    emu.put_object("b", "x", Bytes::from_static(b"hello"))
        .unwrap();
    let mut c = client(&emu).await;
    let full = c
        .list_objects(routed("b", list_req("", "")))
        .await
        .unwrap()
        .into_inner();
    let o = &full.objects[0];
    assert_eq!((o.name.as_str(), o.size), ("x", 5));
    assert!(!o.bucket.is_empty() && !o.etag.is_empty() && o.update_time.is_some());
    let mut q = list_req("", "");
    q.read_mask = Some(prost_types::FieldMask {
        paths: vec!["size".into(), "generation".into()],
    });
    let masked = c.list_objects(routed("b", q)).await.unwrap().into_inner();
    let m = &masked.objects[0];
    // The name always comes; nothing the mask leaves out does.
    assert_eq!(
        (m.name.as_str(), m.size, m.generation),
        ("x", 5, o.generation)
    );
    assert!(m.bucket.is_empty() && m.etag.is_empty() && m.storage_class.is_empty());
    assert!(m.update_time.is_none() && m.checksums.is_none());
    let mut q = list_req("", "");
    q.read_mask = Some(prost_types::FieldMask {
        paths: vec!["*".into()],
    });
    let star = c.list_objects(routed("b", q)).await.unwrap().into_inner();
    assert_eq!(star.objects, full.objects);
}

#[tokio::test]
async fn delete_and_move_follow_preconditions() {
    let emu = memory().await;
    let g = emu
        .put_object("b", "x", Bytes::from_static(b"hello"))
        .unwrap();
    let mut c = client(&emu).await;
    let del = |gm: Option<i64>| DeleteObjectRequest {
        bucket: bpath("b"),
        object: "x".into(),
        if_generation_match: gm,
        ..Default::default()
    };
    let e = c
        .delete_object(routed("b", del(Some(g + 1))))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let mv = MoveObjectRequest {
        bucket: bpath("b"),
        source_object: "x".into(),
        destination_object: "dir/y".into(),
        if_generation_match: Some(0),
        ..Default::default()
    };
    let o = c
        .move_object(routed("b", mv.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(o.name, "dir/y");
    // As the service documents: the moved object is created anew.
    assert!(o.generation > g, "{} after {g}", o.generation);
    assert_eq!(o.metageneration, 1);
    assert_eq!(read_all(&mut c, "b", "dir/y").await, b"hello");
    let e = c.move_object(routed("b", mv)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    emu.put_object("b", "z", Bytes::from_static(b"z")).unwrap();
    let e = c
        .move_object(routed(
            "b",
            MoveObjectRequest {
                bucket: bpath("b"),
                source_object: "z".into(),
                destination_object: "dir/y".into(),
                if_generation_match: Some(0),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    c.delete_object(routed(
        "b",
        DeleteObjectRequest {
            bucket: bpath("b"),
            object: "dir/y".into(),
            if_generation_match: Some(o.generation),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let e = c.delete_object(routed("b", del(None))).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

/// UpdateObject of the custom metadata: one key (`metadata.KEY`, as Google's clients patch
/// it) or the whole map, of the live generation, under preconditions on generation and
/// metageneration, the bytes and the generation kept, a move keeping what it set; any other
/// field, and a key dropped alone, refused.
#[tokio::test]
async fn update_object_sets_custom_metadata_under_preconditions() {
    let emu = memory().await;
    let g = emu
        .put_object_with_metadata("b", "x", Bytes::from_static(b"hello"), &[("keep", "1")])
        .unwrap();
    let mut c = client(&emu).await;
    let update = |paths: &[&str], pairs: &[(&str, &str)], gm: Option<i64>, mm: Option<i64>| {
        UpdateObjectRequest {
            object: Some(Object {
                bucket: bpath("b"),
                name: "x".into(),
                metadata: pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            if_generation_match: gm,
            if_metageneration_match: mm,
            update_mask: Some(prost_types::FieldMask {
                paths: paths.iter().map(|p| p.to_string()).collect(),
            }),
            ..Default::default()
        }
    };
    let o = c
        .update_object(routed(
            "b",
            update(
                &["metadata.gcsfuse_mtime"],
                &[("gcsfuse_mtime", "t1")],
                Some(g),
                None,
            ),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((o.generation, o.metageneration, o.size), (g, 2, 5));
    assert_eq!(
        o.metadata.get("gcsfuse_mtime").map(String::as_str),
        Some("t1")
    );
    assert_eq!(o.metadata.get("keep").map(String::as_str), Some("1"));
    // Of another generation than the live one: none such.
    let mut other = update(&["metadata"], &[], None, None);
    other.object.as_mut().unwrap().generation = g + 1;
    let e = c.update_object(routed("b", other)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    for (req, code) in [
        (
            update(&["metadata"], &[], Some(g + 1), None),
            Code::FailedPrecondition,
        ),
        (
            update(&["metadata"], &[], None, Some(1)),
            Code::FailedPrecondition,
        ),
        (update(&[], &[], None, None), Code::InvalidArgument),
        (
            update(&["content_type"], &[], None, None),
            Code::InvalidArgument,
        ),
        // A key dropped alone: not documented for the service, refused here.
        (
            update(&["metadata.keep"], &[], None, None),
            Code::InvalidArgument,
        ),
    ] {
        let e = c.update_object(routed("b", req)).await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
    }
    // The whole map replaced.
    let o = c
        .update_object(routed(
            "b",
            update(&["metadata"], &[("a", "b")], Some(g), Some(2)),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(o.metadata.len(), 1);
    assert_eq!(read_all(&mut c, "b", "x").await, b"hello");
    let mv = MoveObjectRequest {
        bucket: bpath("b"),
        source_object: "x".into(),
        destination_object: "y".into(),
        ..Default::default()
    };
    let moved = c.move_object(routed("b", mv)).await.unwrap().into_inner();
    assert_eq!(moved.metadata.get("a").map(String::as_str), Some("b"));
    let e = c
        .update_object(routed("b", update(&["metadata"], &[], None, None)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn folders_create_get_rename_delete() {
    let emu = memory().await;
    let mut ctl = control(&emu).await;
    let fname = |f: &str| format!("{}/folders/{f}", bpath("b"));
    let create = |id: &str, recursive: bool| CreateFolderRequest {
        parent: bpath("b"),
        folder_id: id.into(),
        recursive,
        ..Default::default()
    };
    let e = ctl
        .create_folder(routed("b", create("p/q/", false)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let f = ctl
        .create_folder(routed("b", create("p/q/", true)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(f.name, fname("p/q/"));
    let e = ctl
        .create_folder(routed("b", create("p/q/", true)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    ctl.get_folder(routed(
        "b",
        GetFolderRequest {
            name: fname("p/"),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    emu.put_object("b", "p/q/file", Bytes::from_static(b"data"))
        .unwrap();
    let e = ctl
        .delete_folder(routed(
            "b",
            DeleteFolderRequest {
                name: fname("p/q/"),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let op = ctl
        .rename_folder(routed(
            "b",
            RenameFolderRequest {
                name: fname("p/"),
                destination_folder_id: "r/".into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(op.done);
    let mut c = client(&emu).await;
    assert_eq!(read_all(&mut c, "b", "r/q/file").await, b"data");
    let e = ctl
        .get_folder(routed(
            "b",
            GetFolderRequest {
                name: fname("p/"),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    c.delete_object(routed(
        "b",
        DeleteObjectRequest {
            bucket: bpath("b"),
            object: "r/q/file".into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    ctl.delete_folder(routed(
        "b",
        DeleteFolderRequest {
            name: fname("r/q/"),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    assert_eq!(emu.stats().missing_routing_header, 0);
}

/// Any name the service's naming rules allow, however unlike a path; not those they refuse.
#[tokio::test]
async fn memory_backend_holds_any_name_the_service_allows() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    // A bucket with a hierarchical namespace: folder names of at most 512 bytes (with the
    // slash), at most 50 folder levels.
    let folder_513 = format!("{}/x", "a".repeat(512));
    let levels_51 = format!("{}x", "d/".repeat(51));
    for name in [
        ".",
        "..",
        "a\nb",
        ".well-known/acme-challenge/t",
        &folder_513,
        &levels_51,
    ] {
        assert!(
            emu.put_object("b", name, Bytes::from_static(b"x")).is_err(),
            "{name:?}"
        );
    }
    let folder_512 = format!("{}/x", "a".repeat(511));
    let levels_50 = format!("{}x", "d/".repeat(50));
    for name in [
        "a//b",
        "../up",
        "/abs",
        "dir/",
        "./",
        ".well-known/x",
        &folder_512,
        &levels_50,
    ] {
        let g = emu
            .put_object("b", name, Bytes::from(name.as_bytes().to_vec()))
            .unwrap();
        let o = c
            .get_object(routed(
                "b",
                GetObjectRequest {
                    bucket: bpath("b"),
                    object: name.into(),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(o.generation, g);
        assert_eq!(read_all(&mut c, "b", name).await, name.as_bytes());
    }
}

#[tokio::test]
async fn memory_backend_preloads_a_directory_without_writing_back() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("data/x")).unwrap();
    std::fs::write(dir.path().join("data/x/f"), b"preloaded").unwrap();
    let emu = rapidfs::emulator::Emulator::start(
        rapidfs::emulator::EmulatorOptions {
            root: Some(dir.path().to_path_buf()),
            memory: true,
            zone: "us-central1-a".into(),
            faults: Default::default(),
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let mut c = client(&emu).await;
    assert_eq!(read_all(&mut c, "data", "x/f").await, b"preloaded");
    emu.put_object("data", "x/f", Bytes::from_static(b"changed"))
        .unwrap();
    assert_eq!(read_all(&mut c, "data", "x/f").await, b"changed");
    assert_eq!(
        std::fs::read(dir.path().join("data/x/f")).unwrap(),
        b"preloaded"
    );
    assert!(!dir.path().join(".rapidfs-emulator").exists());
}
