//! Raw gRPC tests of BidiWriteObject on the memory backend: appendable life cycle, response
//! rules, takeover fencing, checksums and preconditions.

mod emulator_support;

use bytes::Bytes;
use emulator_support::*;
use rapidfs::proto::storage::bidi_write_object_request::{Data, FirstMessage};
use rapidfs::proto::storage::bidi_write_object_response::WriteStatus;
use rapidfs::proto::storage::{BidiWriteObjectRequest, GetObjectRequest};
use std::time::Duration;
use tonic::Code;

/// The stream's next item, failing if it takes long (no reply expected = timeout).
async fn next(
    s: &mut WriteSession,
) -> Option<Result<rapidfs::proto::storage::BidiWriteObjectResponse, tonic::Status>> {
    match tokio::time::timeout(Duration::from_secs(5), s.rx.message()).await {
        Ok(r) => r.transpose(),
        Err(_) => panic!("no response within 5 s"),
    }
}

async fn expect_error(s: &mut WriteSession) -> tonic::Status {
    loop {
        match next(s).await {
            Some(Ok(_)) => continue,
            Some(Err(e)) => return e,
            None => panic!("stream ended without an error"),
        }
    }
}

#[tokio::test]
async fn appendable_life_cycle_with_takeover_and_finalize() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w = open_write(&mut c, "b", create_msg("b", "log", Some(0)), true)
        .await
        .unwrap();
    let (obj, handle1) = resource_of(w.first.as_ref().unwrap());
    assert_eq!(obj.size, 0);
    assert!(obj.finalize_time.is_none());
    let g = obj.generation;
    let data = pattern(5 << 20, 3);
    let mut off = 0;
    for chunk in data[..3 << 20].chunks(1 << 20) {
        w.tx.send(data_msg(off, Bytes::copy_from_slice(chunk)))
            .await
            .unwrap();
        off += chunk.len() as u64;
    }
    // A bare flush gets no reply; a state_lookup does.
    w.tx.send(BidiWriteObjectRequest {
        write_offset: off as i64,
        flush: true,
        ..Default::default()
    })
    .await
    .unwrap();
    w.tx.send(lookup_msg(off)).await.unwrap();
    let r = next(&mut w).await.unwrap().unwrap();
    assert_eq!(persisted_of(&r), 3 << 20);
    assert_eq!(
        r.persisted_data_checksums.unwrap().crc32c,
        Some(crc32c::crc32c(&data[..3 << 20]))
    );
    // Readable while unfinalized, up to the persisted size.
    assert_eq!(read_all(&mut c, "b", "log").await, data[..3 << 20]);
    // Half-close: exactly one response, then the end.
    w.half_close();
    let r = next(&mut w).await.unwrap().unwrap();
    assert_eq!(persisted_of(&r), 3 << 20);
    assert!(next(&mut w).await.is_none());

    // Take over by generation (no handle): fences the old handle.
    let mut w2 = open_write(&mut c, "b", append_msg("b", "log", g, None, 3 << 20), true)
        .await
        .unwrap();
    let (obj2, handle2) = resource_of(w2.first.as_ref().unwrap());
    assert_eq!(obj2.size, 3 << 20);
    assert_eq!(obj2.generation, g);
    assert_ne!(handle1, handle2);
    let stale = open_write(
        &mut c,
        "b",
        append_msg("b", "log", g, Some(handle1), 3 << 20),
        true,
    )
    .await;
    let e = stale.err().expect("a stale handle is refused");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("took over"), "{}", e.message());
    // Overlapping resend below the size is skipped.
    w2.tx
        .send(data_msg(
            (3 << 20) - 10,
            data.slice((3 << 20) - 10..4 << 20),
        ))
        .await
        .unwrap();
    w2.tx
        .send(data_msg(4 << 20, data.slice(4 << 20..)))
        .await
        .unwrap();
    w2.tx
        .send(finish_msg(5 << 20, crc32c::crc32c(&data)))
        .await
        .unwrap();
    let r = next(&mut w2).await.unwrap().unwrap();
    let (fin, _) = match &r.write_status {
        Some(rapidfs::proto::storage::bidi_write_object_response::WriteStatus::Resource(o)) => {
            (o.clone(), ())
        }
        other => panic!("expected resource, got {other:?}"),
    };
    assert_eq!(fin.size, 5 << 20);
    assert!(fin.finalize_time.is_some());
    assert_eq!(fin.checksums.unwrap().crc32c, Some(crc32c::crc32c(&data)));
    w2.half_close();
    assert!(next(&mut w2).await.is_none());
    assert_eq!(read_all(&mut c, "b", "log").await, data[..]);
    // Appending to a finalized object.
    let e = open_write(&mut c, "b", append_msg("b", "log", g, None, 5 << 20), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let st = emu.stats();
    assert_eq!(st.bytes_received, (5 << 20) + 10);
    assert_eq!(st.missing_routing_header, 0);
}

#[tokio::test]
async fn a_resend_overlapping_stored_bytes_keeps_only_the_new_ones_and_their_crc() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w = open_write(&mut c, "b", create_msg("b", "o", None), true)
        .await
        .unwrap();
    let data = pattern(300, 5);
    w.tx.send(data_msg(0, Bytes::copy_from_slice(&data[..200])))
        .await
        .unwrap();
    // A client that resends from an older offset, its chunk's CRC32C covering all it sends.
    w.tx.send(data_msg(100, Bytes::copy_from_slice(&data[100..])))
        .await
        .unwrap();
    w.tx.send(lookup_msg(300)).await.unwrap();
    let r = next(&mut w).await.unwrap().unwrap();
    assert_eq!(persisted_of(&r), 300);
    assert_eq!(
        r.persisted_data_checksums.unwrap().crc32c,
        Some(crc32c::crc32c(&data))
    );
    w.tx.send(finish_msg(300, crc32c::crc32c(&data)))
        .await
        .unwrap();
    // The service checks the whole object's CRC32C as it finalizes.
    let done = next(&mut w).await.unwrap().unwrap();
    assert_eq!(persisted_of(&done), 300);
    assert_eq!(read_all(&mut c, "b", "o").await, data);
}

#[tokio::test]
async fn a_fenced_writer_fails_on_its_next_message() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w1 = open_write(&mut c, "b", create_msg("b", "x", None), true)
        .await
        .unwrap();
    let g = resource_of(w1.first.as_ref().unwrap()).0.generation;
    w1.tx
        .send(data_msg(0, Bytes::from_static(b"abc")))
        .await
        .unwrap();
    w1.tx.send(lookup_msg(3)).await.unwrap();
    assert_eq!(persisted_of(&next(&mut w1).await.unwrap().unwrap()), 3);
    let _w2 = open_write(&mut c, "b", append_msg("b", "x", g, None, 3), true)
        .await
        .unwrap();
    w1.tx
        .send(data_msg(3, Bytes::from_static(b"def")))
        .await
        .unwrap();
    let e = expect_error(&mut w1).await;
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("took over"));
    assert_eq!(read_all(&mut c, "b", "x").await, b"abc");
}

#[tokio::test]
async fn a_reconnect_with_the_current_handle_does_not_fence() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w1 = open_write(&mut c, "b", create_msg("b", "x", None), true)
        .await
        .unwrap();
    let (obj, h) = resource_of(w1.first.as_ref().unwrap());
    w1.tx
        .send(data_msg(0, Bytes::from_static(b"abc")))
        .await
        .unwrap();
    w1.tx.send(lookup_msg(3)).await.unwrap();
    next(&mut w1).await.unwrap().unwrap();
    let mut w2 = open_write(
        &mut c,
        "b",
        append_msg("b", "x", obj.generation, Some(h.clone()), 3),
        true,
    )
    .await
    .unwrap();
    assert_eq!(resource_of(w2.first.as_ref().unwrap()).1, h);
    w1.tx
        .send(data_msg(3, Bytes::from_static(b"d")))
        .await
        .unwrap();
    w1.tx.send(lookup_msg(4)).await.unwrap();
    assert_eq!(persisted_of(&next(&mut w1).await.unwrap().unwrap()), 4);
    w2.tx
        .send(data_msg(4, Bytes::from_static(b"e")))
        .await
        .unwrap();
    w2.tx.send(lookup_msg(5)).await.unwrap();
    assert_eq!(persisted_of(&next(&mut w2).await.unwrap().unwrap()), 5);
}

#[tokio::test]
async fn write_errors_have_real_statuses() {
    let emu = memory().await;
    emu.put_object("b", "exists", Bytes::from_static(b"e"))
        .unwrap();
    let mut c = client(&emu).await;
    // create-only on an existing object
    let e = open_write(&mut c, "b", create_msg("b", "exists", Some(0)), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::FailedPrecondition);
    // bad chunk checksum
    let mut w = open_write(&mut c, "b", create_msg("b", "x", None), true)
        .await
        .unwrap();
    let mut m = data_msg(0, Bytes::from_static(b"hello"));
    if let Some(rapidfs::proto::storage::bidi_write_object_request::Data::ChecksummedData(d)) =
        &mut m.data
    {
        d.crc32c = Some(1);
    }
    w.tx.send(m).await.unwrap();
    assert_eq!(expect_error(&mut w).await.code(), Code::InvalidArgument);
    // bad whole-object checksum
    let mut w = open_write(&mut c, "b", create_msg("b", "y", None), true)
        .await
        .unwrap();
    w.tx.send(data_msg(0, Bytes::from_static(b"hello")))
        .await
        .unwrap();
    w.tx.send(finish_msg(5, 12345)).await.unwrap();
    assert_eq!(expect_error(&mut w).await.code(), Code::InvalidArgument);
    // a gap in the offsets
    let mut w = open_write(&mut c, "b", create_msg("b", "z", None), true)
        .await
        .unwrap();
    w.tx.send(data_msg(10, Bytes::from_static(b"hello")))
        .await
        .unwrap();
    assert_eq!(expect_error(&mut w).await.code(), Code::InvalidArgument);
    // a wrong generation, a missing bucket, no first-message spec
    let e = open_write(&mut c, "b", append_msg("b", "z", 1, None, 0), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let e = open_write(&mut c, "nb", create_msg("nb", "z", None), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::NotFound);
    let e = open_write(&mut c, "b", BidiWriteObjectRequest::default(), true)
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    // names the service's naming rules refuse
    for name in ["a\nb", "a\rb", "..", ".well-known/acme-challenge/t"] {
        let e = open_write(&mut c, "b", create_msg("b", name, None), true)
            .await
            .err()
            .unwrap();
        assert_eq!(e.code(), Code::InvalidArgument, "{name:?}");
    }
}

/// A zonal bucket holds only appendable objects: an upload whose spec does not ask for one
/// is refused, and leaves nothing behind.
#[tokio::test]
async fn an_upload_that_is_not_appendable_is_refused() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut first = create_msg("b", "plain", None);
    if let Some(FirstMessage::WriteObjectSpec(spec)) = &mut first.first_message {
        spec.appendable = None;
    }
    let e = open_write(&mut c, "b", first, false).await.err().unwrap();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("appendable"), "{}", e.message());
    let get = GetObjectRequest {
        bucket: bpath("b"),
        object: "plain".into(),
        ..Default::default()
    };
    let e = c.get_object(routed("b", get)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

#[tokio::test]
async fn a_reader_follows_an_unfinalized_object_as_it_grows() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w = open_write(&mut c, "b", create_msg("b", "tail", None), true)
        .await
        .unwrap();
    let mut r = open_read(&mut c, spec("b", "tail"), vec![]).await.unwrap();
    assert_eq!(r.first.metadata.as_ref().unwrap().size, 0);
    let data = pattern(3000, 8);
    for i in 0..3u64 {
        let part = data.slice((i * 1000) as usize..((i + 1) * 1000) as usize);
        w.tx.send(data_msg(i * 1000, part.clone())).await.unwrap();
        w.tx.send(lookup_msg((i + 1) * 1000)).await.unwrap();
        assert_eq!(
            persisted_of(&next(&mut w).await.unwrap().unwrap()),
            ((i + 1) * 1000) as i64
        );
        // The new tail is readable on the stream opened when the object was empty.
        r.tx.send(rapidfs::proto::storage::BidiReadObjectRequest {
            read_object_spec: None,
            read_ranges: vec![range(i as i64, (i * 1000) as i64, 0)],
        })
        .await
        .unwrap();
        let (got, _) = collect(&mut r, &[i as i64]).await.unwrap();
        assert_eq!(got[&(i as i64)], part[..]);
    }
}

/// A small file's upload comes in one piece (the create with the first bytes, the rest with
/// a flush and lookup, the half-close): it is stored in one step, answered as a stream read
/// message by message is, and left appendable for its writer's handle.
#[tokio::test]
async fn an_upload_that_comes_whole_is_stored_at_once_and_answered_as_streamed() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let data = pattern(3_000, 4);
    let (name, answers) = upload_taken_whole(&emu, &mut c, "small", &data, false).await;
    assert_eq!(answers.len(), 3, "create, lookup, half-close: {answers:?}");
    let (created, handle) = resource_of(&answers[0]);
    assert_eq!((created.size, created.finalize_time), (0, None));
    for a in &answers[1..] {
        assert_eq!(persisted_of(a), 3_000);
        let crc = a.persisted_data_checksums.as_ref().unwrap().crc32c;
        assert_eq!(crc, Some(crc32c::crc32c(&data)));
    }
    assert_eq!(read_all(&mut c, "b", &name).await, data[..]);
    let first = append_msg("b", &name, created.generation, Some(handle), 3_000);
    let mut w = open_write(&mut c, "b", first, true).await.unwrap();
    assert_eq!(resource_of(w.first.as_ref().unwrap()).0.size, 3_000);
    let more = pattern(1000, 5);
    let whole = [&data[..], &more[..]].concat();
    w.tx.send(data_msg(3_000, more)).await.unwrap();
    w.tx.send(finish_msg(4_000, crc32c::crc32c(&whole)))
        .await
        .unwrap();
    assert_eq!(persisted_of(&next(&mut w).await.unwrap().unwrap()), 4_000);
    assert_eq!(read_all(&mut c, "b", &name).await, whole);
}

/// An upload finished in the piece it came in is stored finalized in one step; its first
/// answer still shows the object as created, empty.
#[tokio::test]
async fn an_upload_finished_in_the_piece_it_came_in_is_stored_final_at_once() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let data = pattern(2_000, 6);
    let (name, answers) = upload_taken_whole(&emu, &mut c, "done", &data, true).await;
    assert_eq!(answers.len(), 2, "create, finish: {answers:?}");
    let (created, _) = resource_of(&answers[0]);
    assert_eq!((created.size, created.finalize_time), (0, None));
    let done = match &answers[1].write_status {
        Some(WriteStatus::Resource(o)) => o.clone(),
        other => panic!("expected the finalized object, got {other:?}"),
    };
    assert_eq!((done.generation, done.size), (created.generation, 2_000));
    assert!(done.finalize_time.is_some());
    assert_eq!(done.checksums.unwrap().crc32c, Some(crc32c::crc32c(&data)));
    assert_eq!(read_all(&mut c, "b", &name).await, data[..]);
    // Its preconditions hold as a streamed create's do.
    let again = whole_upload_msgs("b", &name, &data, true);
    let refused = upload_at_once(&mut c, "b", again).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
}

/// A whole upload that a streamed one would refuse is refused the same way: a chunk or the
/// object off its checksum, a gap in the offsets.
#[tokio::test]
async fn a_whole_upload_with_a_bad_checksum_or_offset_is_refused_as_streamed() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let data = pattern(2_000, 7);
    let mut bad_chunk = whole_upload_msgs("b", "x", &data, true);
    if let Some(Data::ChecksummedData(d)) = &mut bad_chunk[1].data {
        d.crc32c = d.crc32c.map(|c| c ^ 1);
    }
    let mut bad_object = whole_upload_msgs("b", "y", &data, true);
    bad_object[2] = finish_msg(2_000, crc32c::crc32c(&data) ^ 1);
    let mut gap = whole_upload_msgs("b", "z", &data, false);
    gap[1].write_offset += 1;
    for msgs in [bad_chunk, bad_object, gap] {
        let e = match upload_at_once(&mut c, "b", msgs).await {
            Ok(answers) => panic!("accepted: {answers:?}"),
            Err(e) => e,
        };
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }
    assert_eq!(emu.stats().whole_uploads, 0);
}
