//! Client write path against the in-process emulator: appends with flushes, close and
//! takeover, fencing of the first writer, resuming through cuts, redirects and
//! UNAVAILABLE with nothing lost or duplicated, and whole-object uploads that replace their
//! object only once complete.

mod client_common;

use bytes::Bytes;
use client_common::*;
use futures::StreamExt;
use rapidfs::emulator::Faults;
use rapidfs::gcs::{Client, Error};
use std::time::Duration;

async fn read_all(c: &Client, name: &str) -> Vec<u8> {
    let r = c.open_reader(BUCKET, name, None).await.unwrap();
    let mut out = Vec::with_capacity(r.metadata().size as usize);
    let mut s = Box::pin(r.read_stream(0, r.metadata().size));
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_with_flushes_then_finalize() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let mut w = c.create_appendable(BUCKET, "log", Some(0)).await.unwrap();
    assert!(w.generation() > 0);
    let src = data(9 * MIB + 123, 7);
    let mut off = 0;
    for len in [1usize, 4096, 3 * MIB, 5 * MIB, 100] {
        w.append(src.slice(off..off + len)).await.unwrap();
        off += len;
        assert_eq!(w.flush().await.unwrap(), off as u64);
        assert_eq!(w.persisted(), off as u64);
        // Readable while unfinalized, up to what is persisted.
        let m = c.get_object(BUCKET, "log").await.unwrap();
        assert_eq!((m.size, m.finalized), (off as u64, false));
    }
    w.append(src.slice(off..)).await.unwrap();
    assert_eq!(w.written(), src.len() as u64);
    let m = w.finalize().await.unwrap();
    assert!(m.finalized);
    assert_eq!(m.size, src.len() as u64);
    assert_eq!(m.crc32c, Some(crc32c::crc32c(&src)));
    assert!(read_all(&c, "log").await == src);
    // Create-only refuses an existing object.
    assert!(matches!(
        c.create_appendable(BUCKET, "log", Some(0)).await,
        Err(Error::PreconditionFailed(_))
    ));
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_keeps_the_object_appendable_for_a_later_writer() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let a = data(3 * MIB, 8);
    let b = data(MIB + 7, 9);
    let mut w = c.create_appendable(BUCKET, "f", None).await.unwrap();
    let generation = w.generation();
    w.append(a.clone()).await.unwrap();
    let m = w.close().await.unwrap();
    assert_eq!(
        (m.size, m.finalized, m.generation),
        (a.len() as u64, false, generation)
    );

    let mut w = c.open_appendable(BUCKET, "f", generation).await.unwrap();
    assert_eq!(w.written(), a.len() as u64);
    assert_eq!(w.persisted(), a.len() as u64);
    w.append(b.clone()).await.unwrap();
    let m = w.finalize().await.unwrap();
    assert_eq!(m.size, (a.len() + b.len()) as u64);
    let mut want = a.to_vec();
    want.extend_from_slice(&b);
    assert!(read_all(&c, "f").await == want);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_fences_the_first_writer() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let mut w1 = c.create_appendable(BUCKET, "t", None).await.unwrap();
    w1.append(Bytes::from_static(b"first ")).await.unwrap();
    w1.flush().await.unwrap();

    let mut w2 = c
        .open_appendable(BUCKET, "t", w1.generation())
        .await
        .unwrap();
    assert_eq!(w2.written(), 6);

    let fenced = async {
        w1.append(Bytes::from_static(b"stale")).await?;
        w1.flush().await
    }
    .await;
    assert!(matches!(&fenced, Err(Error::Fenced(_))), "{fenced:?}");
    // And it stays fenced.
    assert!(matches!(w1.flush().await, Err(Error::Fenced(_))));

    w2.append(Bytes::from_static(b"second")).await.unwrap();
    w2.finalize().await.unwrap();
    assert_eq!(read_all(&c, "t").await, b"first second");
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_every_5_mib_while_256_mib_are_appended() {
    let emu = emulator(Faults {
        cut_write_after_bytes: Some(5 * MIB as u64),
        ..Faults::default()
    })
    .await;
    let c = client(&emu).await;
    let size = 256 * MIB;
    let src = data(size, 10);
    let mut w = c.create_appendable(BUCKET, "cut", None).await.unwrap();
    for piece in src.chunks(MIB) {
        w.append(src.slice_ref(piece)).await.unwrap();
    }
    let m = w.finalize().await.unwrap();
    assert_eq!(m.size, size as u64);
    assert_eq!(m.crc32c, Some(crc32c::crc32c(&src)));

    let st = emu.stats();
    let cuts = st.write_streams - 1;
    assert!(cuts >= 50, "{cuts} cuts for 256 MiB at 5 MiB each");
    assert!(
        st.bytes_received <= (size + cuts as usize * 2 * MIB) as u64,
        "received {} bytes for {size} with {cuts} cuts",
        st.bytes_received
    );
    assert!(read_all(&c, "cut").await == src);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_survive_redirects_and_unavailable() {
    let emu = emulator(Faults {
        cut_write_after_bytes: Some(3 * MIB as u64),
        redirect_every: Some(3),
        unavailable_every: Some(4),
        ..Faults::default()
    })
    .await;
    let c = client(&emu).await;
    let src = data(40 * MIB + 5, 11);
    let mut w = c.create_appendable(BUCKET, "r", None).await.unwrap();
    for (i, piece) in src.chunks(700_000).enumerate() {
        w.append(src.slice_ref(piece)).await.unwrap();
        if i % 9 == 0 {
            assert_eq!(w.flush().await.unwrap(), w.written());
        }
    }
    let m = w.close().await.unwrap();
    assert_eq!(m.size, src.len() as u64);
    emu.set_faults(Faults::default());
    assert!(read_all(&c, "r").await == src);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_object_uploads_follow_redirects() {
    let emu = emulator(Faults {
        redirect_every: Some(1),
        ..Faults::default()
    })
    .await;
    let c = client(&emu).await;
    let src = data(3 * MIB + 7, 5);
    let m = c
        .put_object(BUCKET, "u", src.clone(), Default::default(), None)
        .await
        .unwrap();
    assert_eq!(m.size, src.len() as u64);
    emu.set_faults(Faults::default());
    assert!(read_all(&c, "u").await == src);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

/// Every object name in the bucket.
async fn names(c: &Client) -> Vec<String> {
    let page = c
        .list_page(BUCKET, &rapidfs::gcs::ListRequest::default())
        .await
        .unwrap();
    page.objects.into_iter().map(|o| o.name).collect()
}

/// A zonal bucket takes only appendable objects, which are live from their first byte: a
/// whole-object upload over an existing object still replaces it at once, complete. While
/// the new version's bytes crawl in over a slow link the name keeps serving the old one;
/// then it serves the new one, and nothing else is left in the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_object_upload_replaces_its_object_only_once_complete() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let old = c
        .put_object(BUCKET, "d/v", data(100, 1), Default::default(), Some(0))
        .await
        .unwrap();
    emu.set_faults(Faults {
        write_kib_per_s: Some(2048),
        ..Faults::default()
    });
    let new = data(2 * MIB, 2);
    let upload = {
        let (c, new) = (c.clone(), new.clone());
        tokio::spawn(async move {
            c.put_object(BUCKET, "d/v", new, Default::default(), Some(old.generation))
                .await
        })
    };
    // The move may land before the upload's task hears of it: a look then sees the new
    // version, complete. Anything else is a partial object.
    let mut old_seen = 0;
    while !upload.is_finished() {
        let live = c.get_object(BUCKET, "d/v").await.unwrap();
        if live.generation == old.generation {
            assert_eq!(live.size, 100);
            old_seen += 1;
        } else {
            assert!(live.finalized && live.size == new.len() as u64, "{live:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(old_seen >= 5, "only {old_seen} looks during the upload");
    let done = upload.await.unwrap().unwrap();
    emu.set_faults(Faults::default());
    assert_eq!(done.size, new.len() as u64);
    assert!(done.finalized);
    assert!(read_all(&c, "d/v").await == new);
    assert_eq!(names(&c).await, ["d/v"]);
}

/// A server that refuses to replace an unfinalized object (as some do, moves included)
/// still gets the new version: that generation is deleted, then the new one moved onto the
/// free name. Another generation is not deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_over_an_unfinalized_object_a_server_refuses_to_replace_still_lands() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let mut w = c.create_appendable(BUCKET, "log", None).await.unwrap();
    w.append(data(1000, 1)).await.unwrap();
    let open = w.close().await.unwrap();
    assert!(!open.finalized);
    emu.set_faults(Faults {
        refuse_replace_unfinalized: true,
        ..Faults::default()
    });
    let stale = c
        .put_object(
            BUCKET,
            "log",
            data(10, 2),
            Default::default(),
            Some(open.generation + 1),
        )
        .await;
    assert!(
        matches!(stale, Err(Error::PreconditionFailed(_))),
        "{stale:?}"
    );
    assert_eq!(
        c.get_object(BUCKET, "log").await.unwrap().generation,
        open.generation
    );
    let new = data(3 * MIB, 3);
    let done = c
        .put_object(
            BUCKET,
            "log",
            new.clone(),
            Default::default(),
            Some(open.generation),
        )
        .await
        .unwrap();
    assert!(
        emu.stats().faults_injected >= 1,
        "the move was refused first"
    );
    emu.set_faults(Faults::default());
    assert!(done.finalized);
    assert!(read_all(&c, "log").await == new);
    assert_eq!(names(&c).await, ["log"]);
}

/// An upload whose generation precondition fails changes nothing, and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_precondition_fails_leaves_nothing_behind() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let old = c
        .put_object(BUCKET, "v", data(100, 1), Default::default(), None)
        .await
        .unwrap();
    let refused = c
        .put_object(
            BUCKET,
            "v",
            data(200, 2),
            Default::default(),
            Some(old.generation + 1),
        )
        .await;
    assert!(
        matches!(refused, Err(Error::PreconditionFailed(_))),
        "{refused:?}"
    );
    let created_twice = c
        .put_object(BUCKET, "v", data(200, 2), Default::default(), Some(0))
        .await;
    assert!(
        matches!(created_twice, Err(Error::PreconditionFailed(_))),
        "{created_twice:?}"
    );
    assert_eq!(
        c.get_object(BUCKET, "v").await.unwrap().generation,
        old.generation
    );
    assert!(read_all(&c, "v").await == data(100, 1));
    assert_eq!(names(&c).await, ["v"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_or_delete_whose_answer_was_lost_is_reported_done() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let a = c
        .put_object(BUCKET, "a", data(100, 1), Default::default(), None)
        .await
        .unwrap();
    c.put_object(BUCKET, "b", data(100, 2), Default::default(), None)
        .await
        .unwrap();
    emu.set_faults(Faults {
        lose_answer_every: Some(1),
        ..Faults::default()
    });
    let moved = c
        .move_object(BUCKET, "a", "a2", Some((&a).into()), Some(0))
        .await
        .expect("the lost move is found done");
    // The service creates the moved object anew: it is known by its bytes, not its generation.
    assert_ne!(moved.generation, a.generation);
    assert_eq!((moved.size, moved.crc32c), (a.size, a.crc32c));
    assert!(matches!(
        c.get_object(BUCKET, "a").await,
        Err(Error::NotFound(_))
    ));
    // Without the source's generation a lost answer cannot be told from a missing source.
    let unknown = c.move_object(BUCKET, "b", "b2", None, None).await;
    assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    c.delete_object(BUCKET, "a2", Some(moved.generation))
        .await
        .expect("the lost delete is found done");
    emu.set_faults(Faults::default());
    assert!(matches!(
        c.get_object(BUCKET, "a2").await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(c.get_object(BUCKET, "b2").await.unwrap().size, 100);
    assert_eq!(emu.stats().faults_injected, 3);
}

/// A retried move that finds its source gone is not taken for done because the destination
/// holds the same bytes: an object that was there before the move was sent is not what the
/// source became.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_whose_source_vanished_is_not_mistaken_for_done() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let a = c
        .put_object(BUCKET, "a", data(100, 1), Default::default(), None)
        .await
        .unwrap();
    c.put_object(BUCKET, "b", data(100, 1), Default::default(), None)
        .await
        .unwrap();
    c.delete_object(BUCKET, "a", None).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every second call fails: the move's first attempt does, so its retry finds no source.
    emu.set_faults(Faults {
        unavailable_every: Some(2),
        ..Faults::default()
    });
    c.get_object(BUCKET, "b").await.unwrap();
    let moved = c
        .move_object(BUCKET, "a", "b", Some((&a).into()), None)
        .await;
    assert!(matches!(moved, Err(Error::NotFound(_))), "{moved:?}");
    assert!(emu.stats().faults_injected >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpersisted_bytes_stay_within_the_write_buffer() {
    let emu = emulator(Faults {
        latency_us: 2_000,
        ..Faults::default()
    })
    .await;
    let mut cfg = config(emu.endpoint());
    cfg.write_buffer_kb = 4 * 1024;
    let cap = cfg.write_buffer_kb * 1024;
    let c = Client::connect(&cfg).await.unwrap();
    let src = data(40 * MIB, 12);
    let mut w = c.create_appendable(BUCKET, "bounded", None).await.unwrap();
    for piece in src.chunks(MIB) {
        w.append(src.slice_ref(piece)).await.unwrap();
        assert!(
            w.written() - w.persisted() <= cap,
            "{} unpersisted bytes, cap {cap}",
            w.written() - w.persisted()
        );
    }
    assert!(w.persisted() > 0, "the writer learned progress on its own");
    let m = w.close().await.unwrap();
    assert_eq!(m.size, src.len() as u64);
    assert!(read_all(&c, "bounded").await == src);
}

/// Against narrow flow-control windows, sending a message waits for capacity and takes in
/// the answers that arrive meanwhile, among them the one a flush (here the full write
/// buffer's) counted on: the flush must then ask again, not wait for an answer that was
/// never asked for (a stall, then a reconnect). The race needs many such waits: with the
/// bug, 512 MiB reopened the stream in five runs of five, 256 MiB in four of seven.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_against_narrow_windows_keeps_its_one_stream() {
    let emu = emulator(Faults {
        flow_window_kib: Some(256),
        ..Faults::default()
    })
    .await;
    let mut cfg = config(emu.endpoint());
    cfg.write_buffer_kb = 2 * 1024;
    cfg.stall_timeout_ms = 1_000;
    let c = Client::connect(&cfg).await.unwrap();
    let src = data(512 * MIB, 13);
    let mut w = c.create_appendable(BUCKET, "narrow", None).await.unwrap();
    for piece in src.chunks(100 * 1024) {
        w.append(src.slice_ref(piece)).await.unwrap();
    }
    let m = w.close().await.unwrap();
    assert_eq!(m.size, src.len() as u64);
    assert_eq!(
        emu.stats().write_streams,
        1,
        "a stalled flush reopened the stream"
    );
    let stored = c.get_object(BUCKET, "narrow").await.unwrap();
    assert_eq!(
        stored.crc32c,
        Some(crc32c::crc32c(&src)),
        "the bytes stored"
    );
}

/// A create that does not wait for its answer sends nothing of its own: a small file's
/// create, bytes and closing flush go out together at its close, while a file past the
/// first 256 KiB streams its bytes (and its create) before any flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_create_goes_out_with_the_first_bytes_sent() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let small = data(64 * 1024, 3);
    let mut w = c.create_appendable_unanswered(BUCKET, "small");
    w.append(small.clone()).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert_eq!(
        emu.stats().write_streams,
        0,
        "nothing sent before the close"
    );
    assert!(c.get_object(BUCKET, "small").await.is_err());
    let m = w.close().await.unwrap();
    assert_eq!(m.size, small.len() as u64);
    assert_eq!(emu.stats().write_streams, 1);
    assert!(read_all(&c, "small").await == small);

    let big = data(MIB, 4);
    let mut w = c.create_appendable_unanswered(BUCKET, "big");
    w.append(big.clone()).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while emu.stats().bytes_received < (small.len() + big.len()) as u64 {
        assert!(
            std::time::Instant::now() < deadline,
            "the bytes stream before any flush"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(emu.stats().write_streams, 2);
    w.close().await.unwrap();
    assert!(read_all(&c, "big").await == big);
}

/// A flush sends the bytes it waits for with its flush + state_lookup on their message: the
/// create's answer and the lookup's can come in one read, and the flush must not wait for a
/// third answer that was never asked for. Each flush returns promptly on the one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_whose_lookup_rides_on_the_bytes_return_at_once() {
    let emu = emulator(Faults::default()).await;
    let c = client(&emu).await;
    let mut w = c.create_appendable_unanswered(BUCKET, "flushed");
    let mut want = Vec::new();
    for (i, part) in [&b"one\n"[..], b"two\n", b"three\n"]
        .into_iter()
        .enumerate()
    {
        w.append(Bytes::from_static(part)).await.unwrap();
        want.extend_from_slice(part);
        let flushed = tokio::time::timeout(std::time::Duration::from_secs(5), w.flush()).await;
        let persisted = flushed
            .unwrap_or_else(|_| panic!("flush {i} waited for an answer that never came"))
            .unwrap();
        assert_eq!(persisted, want.len() as u64);
    }
    let m = w.close().await.unwrap();
    assert_eq!(m.size, want.len() as u64);
    assert_eq!(emu.stats().write_streams, 1, "one stream for every flush");
    assert!(read_all(&c, "flushed").await == want);
}

/// A whole-object upload hears nothing back until its last byte is in, however long the bytes
/// take: only a wait in which no byte goes out either is a stall. With one deadline for the
/// whole answer (`call_timeout_ms` + `stall_timeout_ms`), an upload that took longer failed
/// every time it was retried: a staged file of some GiB against a distant service never got
/// in. The deadline here is twice what 16 MiB take in this build on this machine (h2 may
/// still hold that much when the last byte is queued), and the upload is 128 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_longer_than_the_answer_deadline_completes() {
    let emu = emulator(Faults {
        flow_window_kib: Some(8),
        ..Faults::default()
    })
    .await;
    let started = std::time::Instant::now();
    client(&emu)
        .await
        .put_object(
            BUCKET,
            "gauge",
            data(16 * MIB, 22),
            Default::default(),
            None,
        )
        .await
        .unwrap();
    let gauge_ms = started.elapsed().as_millis() as u64 + 1;
    let mut cfg = config(emu.endpoint());
    cfg.call_timeout_ms = gauge_ms;
    cfg.stall_timeout_ms = gauge_ms;
    cfg.retry_deadline_ms = 20 * gauge_ms;
    let deadline = std::time::Duration::from_millis(cfg.call_timeout_ms + cfg.stall_timeout_ms);
    let c = Client::connect(&cfg).await.unwrap();
    let src = data(128 * MIB, 23);
    let started = std::time::Instant::now();
    let m = c
        .put_object(BUCKET, "long", src.clone(), Default::default(), None)
        .await
        .unwrap();
    assert!(
        started.elapsed() > deadline,
        "the upload took {:?}: too short to outlast the {deadline:?} deadline",
        started.elapsed()
    );
    assert_eq!(m.size, src.len() as u64);
    assert_eq!(m.crc32c, Some(crc32c::crc32c(&src)), "the bytes stored");
}

/// A service that stops reading a stream mid-write grants no more room to send and answers
/// nothing: a stall as surely as an unanswered lookup. The writer must give that stream up
/// and send what was not persisted on a new one; it waited for the room for ever before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_stream_stops_reading_goes_on_on_a_new_one() {
    let emu = emulator(Faults {
        flow_window_kib: Some(256),
        stall_new_write_after_bytes: Some(4 * MIB as u64),
        ..Faults::default()
    })
    .await;
    let mut cfg = config(emu.endpoint());
    cfg.stall_timeout_ms = 500;
    let c = Client::connect(&cfg).await.unwrap();
    let src = data(40 * MIB, 29);
    let closed = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        let mut w = c.create_appendable(BUCKET, "stuck", None).await.unwrap();
        for piece in src.chunks(MIB) {
            w.append(src.slice_ref(piece)).await.unwrap();
        }
        w.close().await.unwrap()
    })
    .await
    .expect("the writer waited for ever on a stream that stopped reading");
    assert_eq!(closed.size, src.len() as u64);
    assert!(
        emu.stats().write_streams >= 2,
        "the stalled stream was kept"
    );
    let stored = c.get_object(BUCKET, "stuck").await.unwrap();
    assert_eq!(
        stored.crc32c,
        Some(crc32c::crc32c(&src)),
        "the bytes stored"
    );
}

/// Over a slow link the bytes a flush or close waits for may still be queued on this side
/// when its answer wait begins. They took the answer for a stopped service, gave the stream
/// up and sent the bytes again on a new one; the wait now grows with what is unpersisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_over_a_slow_link_waits_for_its_bytes_to_arrive() {
    let emu = emulator(Faults {
        write_kib_per_s: Some(8 * 1024),
        ..Faults::default()
    })
    .await;
    let mut cfg = config(emu.endpoint());
    cfg.stall_timeout_ms = 400;
    let stall = std::time::Duration::from_millis(cfg.stall_timeout_ms);
    let c = Client::connect(&cfg).await.unwrap();
    let src = data(16 * MIB, 31);
    let (first, second) = src.split_at(8 * MIB);
    let mut w = c.create_appendable(BUCKET, "slow", None).await.unwrap();
    w.append(src.slice_ref(first)).await.unwrap();
    let started = std::time::Instant::now();
    assert_eq!(w.flush().await.unwrap(), first.len() as u64);
    assert!(
        started.elapsed() > stall,
        "the flush took {:?}: too short to outlast a {stall:?} stall",
        started.elapsed()
    );
    w.append(src.slice_ref(second)).await.unwrap();
    let closed = w.close().await.unwrap();
    assert_eq!(closed.size, src.len() as u64);
    assert_eq!(
        emu.stats().write_streams,
        1,
        "a slow answer was taken for a stall and the bytes sent again"
    );
    let stored = c.get_object(BUCKET, "slow").await.unwrap();
    assert_eq!(
        stored.crc32c,
        Some(crc32c::crc32c(&src)),
        "the bytes stored"
    );
}

/// A close whose last data message (which carries its flush, lookup and half-close) is cut:
/// the writer reopens the object and sends that message again, and the close returns only
/// once the service holds every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_whose_last_message_is_cut_sends_it_again() {
    let emu = emulator(Faults {
        cut_write_after_bytes: Some(2 * MIB as u64 + 50 * 1024),
        ..Faults::default()
    })
    .await;
    let c = client(&emu).await;
    let src = data(2 * MIB + 100 * 1024, 31);
    let mut w = c.create_appendable(BUCKET, "tail", None).await.unwrap();
    w.append(src.slice(..2 * MIB)).await.unwrap();
    w.append(src.slice(2 * MIB..)).await.unwrap();
    let m = w.close().await.unwrap();
    assert_eq!(m.size, src.len() as u64);
    let st = emu.stats();
    assert_eq!(
        (st.write_streams, st.faults_injected),
        (2, 1),
        "one cut, one reopen"
    );
    assert!(read_all(&c, "tail").await == src);
}
