//! Raw gRPC tests of every fault mode: latency, read and write cuts, UNAVAILABLE every k-th
//! call, redirects (read and write) and chaos (random chunks, interleaved read_ids,
//! trailing empty chunks).

mod emulator_support;

use bytes::Bytes;
use emulator_support::*;
use prost::Message;
use rapidfs::emulator::Faults;
use rapidfs::proto::storage::{
    BidiReadObjectRedirectedError, BidiReadObjectRequest, BidiWriteObjectRedirectedError,
    GetObjectRequest,
};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tonic::Code;

fn get(object: &str) -> GetObjectRequest {
    GetObjectRequest {
        bucket: bpath("b"),
        object: object.into(),
        ..Default::default()
    }
}

/// The one detail of a status, decoded as `M`, checking its type URL.
fn detail<M: Message + Default>(s: &tonic::Status, type_name: &str) -> M {
    let rpc = rapidfs::proto::rpc::Status::decode(s.details()).expect("google.rpc.Status details");
    assert_eq!(rpc.code, s.code() as i32);
    let any = rpc.details.first().expect("one detail");
    assert_eq!(any.type_url, format!("type.googleapis.com/{type_name}"));
    M::decode(any.value.as_slice()).unwrap()
}

#[tokio::test]
async fn latency_delays_each_message_without_capping_throughput() {
    let emu = memory().await;
    let data = pattern(40 << 20, 1);
    emu.put_object("b", "x", data.clone()).unwrap();
    emu.set_faults(Faults {
        latency_us: 200_000,
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    let t = Instant::now();
    c.get_object(routed("b", get("x"))).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "unary call delayed"
    );
    let t = Instant::now();
    let got = read_all(&mut c, "b", "x").await;
    let took = t.elapsed();
    assert_eq!(got, data[..]);
    // 21 messages (first response + 20 chunks): a per-message delay in series would take 4.2 s.
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(
        took < Duration::from_millis(3000),
        "latency must pipeline, took {took:?}"
    );
}

#[tokio::test]
async fn read_cut_ends_each_stream_after_n_bytes() {
    let emu = memory().await;
    let data = pattern(6 << 20, 2);
    emu.put_object("b", "x", data.clone()).unwrap();
    emu.set_faults(Faults {
        cut_read_after_bytes: Some(3 << 20),
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    for _ in 0..2 {
        let mut s = open_read(&mut c, spec("b", "x"), vec![range(1, 0, 0)])
            .await
            .unwrap();
        // The first response carries the first chunk with the metadata.
        let mut got = Vec::new();
        for d in std::mem::take(&mut s.first.object_data_ranges) {
            got.extend_from_slice(&d.checksummed_data.unwrap().content);
        }
        let err = loop {
            match s.rx.message().await {
                Ok(Some(m)) => {
                    for d in m.object_data_ranges {
                        got.extend_from_slice(&d.checksummed_data.unwrap().content);
                    }
                }
                Ok(None) => panic!("stream ended without the cut"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.code(), Code::Unavailable);
        assert_eq!(got.len(), 3 << 20);
        assert_eq!(got, data[..3 << 20]);
    }
    assert_eq!(emu.stats().faults_injected, 2);
}

#[tokio::test]
async fn write_cut_drops_the_crossing_message_and_keeps_the_rest() {
    let emu = memory().await;
    emu.set_faults(Faults {
        cut_write_after_bytes: Some(3 << 20),
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    let data = pattern(4 << 20, 3);
    let mut w = open_write(&mut c, "b", create_msg("b", "x", None), true)
        .await
        .unwrap();
    let (obj, handle) = resource_of(w.first.as_ref().unwrap());
    w.tx.send(data_msg(0, data.slice(..2 << 20))).await.unwrap();
    w.tx.send(data_msg(2 << 20, data.slice(2 << 20..)))
        .await
        .unwrap();
    let err = loop {
        match w.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("no cut"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(emu.stats().bytes_received, 4 << 20);
    // Resume from the persisted size with the handle.
    emu.set_faults(Faults::default());
    let mut w2 = open_write(
        &mut c,
        "b",
        append_msg("b", "x", obj.generation, Some(handle), 2 << 20),
        true,
    )
    .await
    .unwrap();
    assert_eq!(resource_of(w2.first.as_ref().unwrap()).0.size, 2 << 20);
    w2.tx
        .send(data_msg(2 << 20, data.slice(2 << 20..)))
        .await
        .unwrap();
    w2.tx
        .send(finish_msg(4 << 20, crc32c::crc32c(&data)))
        .await
        .unwrap();
    w2.rx.message().await.unwrap().unwrap();
    assert_eq!(read_all(&mut c, "b", "x").await, data[..]);
}

#[tokio::test]
async fn every_kth_call_is_unavailable() {
    let emu = memory().await;
    emu.put_object("b", "x", Bytes::from_static(b"x")).unwrap();
    emu.set_faults(Faults {
        unavailable_every: Some(3),
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(match c.get_object(routed("b", get("x"))).await {
            Ok(_) => Code::Ok,
            Err(e) => e.code(),
        });
    }
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::Ok,
            Code::Unavailable,
            Code::Ok,
            Code::Ok,
            Code::Unavailable
        ]
    );
    // Stream opens count too.
    let mut opens = Vec::new();
    for _ in 0..3 {
        opens.push(
            open_read(&mut c, spec("b", "x"), vec![])
                .await
                .err()
                .map(|e| e.code()),
        );
    }
    assert_eq!(opens, [None, None, Some(Code::Unavailable)]);
}

#[tokio::test]
async fn read_redirect_carries_token_and_handle_and_reopen_succeeds() {
    let emu = memory().await;
    let data = pattern(1000, 4);
    emu.put_object("b", "x", data.clone()).unwrap();
    emu.set_faults(Faults {
        redirect_every: Some(1),
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    let e = open_read(&mut c, spec("b", "x"), vec![])
        .await
        .err()
        .unwrap();
    assert_eq!(e.code(), Code::Aborted);
    let red: BidiReadObjectRedirectedError =
        detail(&e, "google.storage.v2.BidiReadObjectRedirectedError");
    let token = red.routing_token.unwrap();
    let mut sp = spec("b", "x");
    sp.read_handle = red.read_handle;
    sp.routing_token = Some(token.clone());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(BidiReadObjectRequest {
        read_object_spec: Some(sp),
        read_ranges: vec![range(1, 0, 0)],
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert(
        "x-goog-request-params",
        format!("bucket={}&routing_token={token}", bpath("b"))
            .parse()
            .unwrap(),
    );
    let mut rx = c.bidi_read_object(req).await.unwrap().into_inner();
    let first = rx.message().await.unwrap().unwrap();
    assert!(first.metadata.is_none(), "opened with a read handle");
    let mut s = ReadSession { tx, rx, first };
    let (got, _) = collect(&mut s, &[1]).await.unwrap();
    assert_eq!(got[&1], data[..]);
    assert_eq!(emu.stats().read_streams, 2);
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test]
async fn write_redirect_carries_token_handle_and_generation() {
    let emu = memory().await;
    let mut c = client(&emu).await;
    let mut w = open_write(&mut c, "b", create_msg("b", "x", None), true)
        .await
        .unwrap();
    let (obj, _) = resource_of(w.first.as_ref().unwrap());
    w.tx.send(data_msg(0, Bytes::from_static(b"abc")))
        .await
        .unwrap();
    w.half_close();
    w.rx.message().await.unwrap().unwrap();
    emu.set_faults(Faults {
        redirect_every: Some(1),
        ..Faults::default()
    });
    let e = open_write(
        &mut c,
        "b",
        append_msg("b", "x", obj.generation, None, 3),
        true,
    )
    .await
    .err()
    .unwrap();
    assert_eq!(e.code(), Code::Aborted);
    let red: BidiWriteObjectRedirectedError =
        detail(&e, "google.storage.v2.BidiWriteObjectRedirectedError");
    assert_eq!(red.generation, Some(obj.generation));
    let token = red.routing_token.unwrap();
    let mut first = append_msg(
        "b",
        "x",
        obj.generation,
        Some(red.write_handle.unwrap().handle),
        3,
    );
    if let Some(
        rapidfs::proto::storage::bidi_write_object_request::FirstMessage::AppendObjectSpec(a),
    ) = &mut first.first_message
    {
        a.routing_token = Some(token);
    }
    let mut w2 = open_write(&mut c, "b", first, true).await.unwrap();
    assert_eq!(resource_of(w2.first.as_ref().unwrap()).0.size, 3);
    w2.tx
        .send(data_msg(3, Bytes::from_static(b"def")))
        .await
        .unwrap();
    w2.tx
        .send(finish_msg(6, crc32c::crc32c(b"abcdef")))
        .await
        .unwrap();
    w2.rx.message().await.unwrap().unwrap();
    // A create is redirected with a token only; the retry with it in the header succeeds.
    let e = open_write(&mut c, "b", create_msg("b", "y", None), true)
        .await
        .err()
        .unwrap();
    let red: BidiWriteObjectRedirectedError =
        detail(&e, "google.storage.v2.BidiWriteObjectRedirectedError");
    assert!(red.write_handle.is_none() && red.generation.is_none());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(create_msg("b", "y", None)).await.unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert(
        "x-goog-request-params",
        format!(
            "bucket={}&routing_token={}",
            bpath("b"),
            red.routing_token.unwrap()
        )
        .parse()
        .unwrap(),
    );
    let mut rx = c.bidi_write_object(req).await.unwrap().into_inner();
    rx.message().await.unwrap().unwrap();
    drop(tx);
}

#[tokio::test]
async fn chaos_varies_chunks_interleaves_read_ids_and_trails_empty_chunks() {
    let emu = memory().await;
    let data = pattern(16 << 20, 5);
    emu.put_object("b", "x", data.clone()).unwrap();
    emu.set_faults(Faults {
        chaos: true,
        ..Faults::default()
    });
    let mut c = client(&emu).await;
    let mut ranges = vec![
        range(0, 0, 8 << 20),
        range(1, 8 << 20, 8 << 20),
        range(2, 1, 6 << 20),
    ];
    for i in 3..40 {
        ranges.push(range(i, i * 1000, 500));
    }
    let want: HashMap<i64, (usize, usize)> = ranges
        .iter()
        .map(|r| {
            (
                r.read_id,
                (
                    r.read_offset as usize,
                    (r.read_offset + r.read_length) as usize,
                ),
            )
        })
        .collect();
    let s = open_read(&mut c, spec("b", "x"), ranges).await.unwrap();
    let mut got: HashMap<i64, Vec<u8>> = HashMap::new();
    let mut open: HashSet<i64> = want.keys().copied().collect();
    let mut sizes = HashSet::new();
    let mut switches_while_open = 0;
    let mut last: Option<i64> = None;
    let mut trailing = 0;
    let (tx, mut rx, mut first) = (s.tx, s.rx, Some(s.first));
    drop(tx);
    // The first response carries the first chunk with the metadata.
    loop {
        let m = match first.take() {
            Some(m) => m,
            None => match rx.message().await.unwrap() {
                Some(m) => m,
                None => break,
            },
        };
        for d in m.object_data_ranges {
            let rr = d.read_range.unwrap();
            let cd = d.checksummed_data.unwrap_or_default();
            assert_eq!(cd.crc32c.unwrap_or(0), crc32c::crc32c(&cd.content));
            if !open.contains(&rr.read_id) {
                assert!(cd.content.is_empty(), "only empty chunks after range_end");
                trailing += 1;
                continue;
            }
            if let Some(l) = last {
                if l != rr.read_id && open.contains(&l) {
                    switches_while_open += 1;
                }
            }
            last = Some(rr.read_id);
            if !cd.content.is_empty() {
                sizes.insert(cd.content.len());
            }
            assert!(cd.content.len() <= 2 << 20);
            got.entry(rr.read_id)
                .or_default()
                .extend_from_slice(&cd.content);
            if d.range_end {
                open.remove(&rr.read_id);
            }
        }
    }
    assert!(open.is_empty(), "every range ended");
    for (id, (a, b)) in want {
        assert_eq!(got[&id], data[a..b], "read_id {id}");
    }
    assert!(sizes.len() > 5, "chunk sizes vary: {sizes:?}");
    assert!(
        switches_while_open > 3,
        "read_ids interleave ({switches_while_open})"
    );
    assert!(trailing > 0, "trailing empty chunks after range_end");
}
