//! Client read path against the in-process emulator: metadata and listing calls, many
//! ranges on one stream under chaos, a 1 GiB stream through redirects, cuts and
//! UNAVAILABLE, bounded read-ahead of `read_stream`, and a server that is gone for good.

mod client_common;

use client_common::*;
use futures::{StreamExt, TryStreamExt};
use rapidfs::emulator::{Emulator, Faults};
use rapidfs::gcs::{Client, Error, ListRequest};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_list_delete_and_not_found() {
    let emu = emulator(Faults::default()).await;
    for name in ["a/1", "a/2", "a/b/3", "c", "d"] {
        emu.put_object(BUCKET, name, data(100, 1)).unwrap();
    }
    let c = client(&emu).await;
    let m = c.get_object(BUCKET, "a/1").await.unwrap();
    assert_eq!((m.name.as_str(), m.size, m.finalized), ("a/1", 100, true));

    let req = ListRequest {
        prefix: "a/".into(),
        delimiter: Some("/".into()),
        ..Default::default()
    };
    let page = c.list_page(BUCKET, &req).await.unwrap();
    let names: Vec<_> = page.objects.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["a/1", "a/2"]);
    assert_eq!(page.prefixes, ["a/b/"]);

    let all = ListRequest {
        page_size: 2,
        ..Default::default()
    };
    let pages: Vec<_> = c.list(BUCKET, all).try_collect().await.unwrap();
    assert!(pages.len() >= 3, "{} pages", pages.len());
    let n: usize = pages.iter().map(|p| p.objects.len()).sum();
    assert_eq!(n, 5);

    c.delete_object(BUCKET, "c", None).await.unwrap();
    assert!(matches!(
        c.get_object(BUCKET, "c").await,
        Err(Error::NotFound(m)) if m.contains("gs://bkt/c")
    ));
    assert!(matches!(
        c.open_reader(BUCKET, "c", None).await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_calls_retry_through_unavailable() {
    let emu = emulator(Faults {
        unavailable_every: Some(2),
        ..Faults::default()
    })
    .await;
    emu.put_object(BUCKET, "x", data(10, 2)).unwrap();
    let c = client(&emu).await;
    for _ in 0..6 {
        assert_eq!(c.get_object(BUCKET, "x").await.unwrap().size, 10);
    }
    let st = emu.stats();
    assert!(
        st.calls >= 11 && st.faults_injected >= 5,
        "every other call failed and was retried: {st:?}"
    );
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_ranges_in_flight_on_one_stream_under_chaos() {
    let emu = emulator(Faults {
        chaos: true,
        ..Faults::default()
    })
    .await;
    let src = data(24 * MIB, 3);
    emu.put_object(BUCKET, "obj", src.clone()).unwrap();
    let c = client(&emu).await;
    let r = c.open_reader(BUCKET, "obj", None).await.unwrap();
    assert_eq!(r.metadata().size, src.len() as u64);
    emu.reset_stats();

    let ranges: Vec<(u64, u64)> = (0..100u64)
        .map(|i| {
            let off = (i * 7_919 * 2_971) % src.len() as u64;
            let len = [1, 4096, 100_000, 3 * MIB as u64, 5 * MIB as u64][i as usize % 5];
            (off, len)
        })
        .collect();
    let reads = ranges.iter().map(|&(off, len)| {
        let r = r.clone();
        async move { (off, len, r.read(off, len).await) }
    });
    let results = futures::future::join_all(reads).await;
    for (off, len, got) in results {
        let got = got.unwrap();
        let end = (off + len).min(src.len() as u64);
        assert!(
            got == src.slice(off as usize..end as usize),
            "range {off}+{len} differs"
        );
    }
    let s = emu.stats();
    assert_eq!(
        s.read_streams, 0,
        "all ranges went over the one open stream"
    );
    assert_eq!(s.ranges_requested, 100);
    assert_eq!(r.in_flight(), 0);
    assert_eq!(r.reconnects(), 0);
    // Past the end: empty, and the stream is still fine.
    assert!(r.read(src.len() as u64 + 5, 10).await.unwrap().is_empty());
    assert_eq!(r.read(0, 3).await.unwrap(), src.slice(0..3));
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_streams_through_redirect_cuts_and_unavailable() {
    let emu = emulator(Faults::default()).await;
    let size = 1024 * MIB;
    let src = data(size, 4);
    emu.put_object(BUCKET, "big", src.clone()).unwrap();
    let c = client(&emu).await;
    emu.set_faults(Faults {
        cut_read_after_bytes: Some(7 * MIB as u64),
        unavailable_every: Some(10),
        redirect_every: Some(5),
        ..Faults::default()
    });
    emu.reset_stats();
    let r = c.open_reader(BUCKET, "big", None).await.unwrap();
    let mut pos = 0usize;
    let mut s = Box::pin(r.read_stream(0, size as u64));
    while let Some(chunk) = s.next().await {
        let chunk = chunk.unwrap();
        assert!(
            chunk == src.slice(pos..pos + chunk.len()),
            "bytes at {pos} differ"
        );
        pos += chunk.len();
    }
    assert_eq!(pos, size);

    let st = emu.stats();
    let reconnects = r.reconnects();
    assert!(
        reconnects >= 140,
        "a cut every 7 MiB: {reconnects} reconnects"
    );
    assert!(st.read_streams > reconnects, "{st:?}");
    let window = rapidfs::config::GcsConfig::default().read_stream_window_kb * 1024;
    let chunk = 2 * MIB as u64;
    let extra_requested = st.bytes_requested - size as u64;
    assert!(
        extra_requested <= st.read_streams * (window + chunk),
        "re-requested {extra_requested} bytes over {} streams",
        st.read_streams
    );
    assert!(
        st.bytes_sent <= size as u64 + st.read_streams * chunk,
        "sent {} for {size}: delivered bytes were asked for again",
        st.bytes_sent
    );
    assert_eq!(st.missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_stream_requests_at_most_its_window_ahead() {
    let emu = emulator(Faults::default()).await;
    let src = data(64 * MIB, 5);
    emu.put_object(BUCKET, "o", src.clone()).unwrap();
    let mut cfg = config(emu.endpoint());
    cfg.read_stream_window_kb = 4 * 1024;
    let c = Client::connect(&cfg).await.unwrap();
    let r = c.open_reader(BUCKET, "o", None).await.unwrap();
    emu.reset_stats();
    let mut s = Box::pin(r.read_stream(0, src.len() as u64));
    let first = s.next().await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = emu.stats().bytes_requested;
    assert!(
        asked <= 4 * MIB as u64 + first.len() as u64,
        "a stalled consumer let {asked} bytes be requested"
    );
    let mut got = first.to_vec();
    while let Some(c) = s.next().await {
        got.extend_from_slice(&c.unwrap());
    }
    assert!(got == src, "content differs");
}

#[test]
fn a_server_gone_for_good_fails_reads_within_the_deadline() {
    // The emulator runs on its own runtime so it can die like a crashed process: every
    // connection and the listener vanish at once.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let emu = server_rt.block_on(emulator(Faults::default()));
    emu.put_object(BUCKET, "gone", data(MIB, 6)).unwrap();
    let endpoint = emu.endpoint();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut cfg = config(endpoint);
        cfg.retry_deadline_ms = 1_500;
        cfg.stall_timeout_ms = 500;
        cfg.call_timeout_ms = 500;
        let c = Client::connect(&cfg).await.unwrap();
        let r = c.open_reader(BUCKET, "gone", None).await.unwrap();
        assert_eq!(r.read(0, 10).await.unwrap().len(), 10);

        server_rt.shutdown_background();
        drop(emu);

        let start = Instant::now();
        let e = r.read(100, 1000).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(&e, Error::Unavailable(m) if m.contains("gs://bkt/gone")),
            "{e}"
        );
        assert!(took < Duration::from_secs(5), "gave up after {took:?}");
        assert!(r.is_broken());
        assert!(matches!(r.read(0, 1).await, Err(Error::Unavailable(_))));
        let start = Instant::now();
        assert!(matches!(
            c.get_object(BUCKET, "gone").await,
            Err(Error::Unavailable(_))
        ));
        assert!(start.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn reads_go_on_after_the_server_restarts_on_the_same_address() {
    // Each emulator runs on its own runtime so it can die like a crashed process.
    let server = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first_rt = server();
    let emu = first_rt.block_on(emulator(Faults::default()));
    let src = data(MIB, 9);
    emu.put_object(BUCKET, "obj", src.clone()).unwrap();
    let addr = emu.addr();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let c = rt
        .block_on(Client::connect(&config(emu.endpoint())))
        .unwrap();
    let read_all = |c: Client| async move {
        let generation = c.get_object(BUCKET, "obj").await?.generation;
        let once = c.read_once(BUCKET, "obj", generation, 0, MIB as u64).await;
        let r = c.open_reader(BUCKET, "obj", None).await?;
        Ok::<_, Error>((once, r.read(0, MIB as u64).await?))
    };
    let (once, streamed) = rt.block_on(read_all(c.clone())).unwrap();
    assert_eq!(once.unwrap(), src);
    assert_eq!(streamed, src);

    first_rt.shutdown_background();
    drop(emu);
    let second_rt = server();
    let emu = second_rt.block_on(async {
        // The dead runtime lets go of its listener in the background.
        let started = Instant::now();
        let emu = loop {
            match Emulator::start(options(Faults::default()), addr).await {
                Ok(emu) => break emu,
                Err(e) if started.elapsed() > Duration::from_secs(10) => {
                    panic!("no new emulator on {addr}: {e:#}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        emu.create_bucket(BUCKET).unwrap();
        emu
    });
    let src = data(MIB, 10);
    emu.put_object(BUCKET, "obj", src.clone()).unwrap();
    // The first call on each dead connection may fail; the reader's own retries and the
    // next calls go through on new ones.
    let streamed = rt.block_on(async {
        for _ in 0..4 {
            if let Ok((_, got)) = read_all(c.clone()).await {
                return got;
            }
        }
        panic!("no read went through after the restart");
    });
    assert_eq!(streamed, src);
    let (once, _) = rt.block_on(read_all(c)).unwrap();
    assert_eq!(once.unwrap(), src);
    second_rt.shutdown_background();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_replaced_and_the_read_completes() {
    let emu = emulator(Faults::default()).await;
    let src = data(4 * MIB, 7);
    emu.put_object(BUCKET, "slow", src.clone()).unwrap();
    let mut cfg = config(emu.endpoint());
    cfg.stall_timeout_ms = 200;
    let c = Client::connect(&cfg).await.unwrap();
    // The stream opened now keeps a 2.5 s delay on every message; later streams have none.
    emu.set_faults(Faults {
        latency_us: 2_500_000,
        ..Faults::default()
    });
    let r = c.open_reader(BUCKET, "slow", None).await.unwrap();
    emu.set_faults(Faults::default());
    let start = Instant::now();
    let got = r.read(0, src.len() as u64).await.unwrap();
    assert!(got == src);
    assert!(r.reconnects() >= 1, "the stalled stream was replaced");
    assert!(
        start.elapsed() < Duration::from_millis(2_000),
        "took {:?}: waited for the slow stream",
        start.elapsed()
    );
    assert_eq!(emu.stats().missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_100_queued_ranges_are_split_into_several_messages() {
    let emu = emulator(Faults::default()).await;
    let src = data(MIB, 8);
    emu.put_object(BUCKET, "many", src.clone()).unwrap();
    let c = client(&emu).await;
    let r = c.open_reader(BUCKET, "many", None).await.unwrap();
    emu.reset_stats();
    let reads = (0..250u64).map(|i| {
        let r = r.clone();
        async move { (i, r.read(i * 4000, 1000).await) }
    });
    for (i, got) in futures::future::join_all(reads).await {
        let off = (i * 4000) as usize;
        assert!(got.unwrap() == src.slice(off..off + 1000), "range {i}");
    }
    let st = emu.stats();
    assert_eq!(st.ranges_requested, 250);
    assert_eq!(st.read_streams, 0);
    assert_eq!(st.missing_routing_header, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_interleaved_ranges_resume_through_cuts_redirects_and_unavailable() {
    let emu = emulator(Faults::default()).await;
    let src = data(32 * MIB, 9);
    emu.put_object(BUCKET, "mix", src.clone()).unwrap();
    let c = client(&emu).await;
    emu.set_faults(Faults {
        chaos: true,
        cut_read_after_bytes: Some(3 * MIB as u64),
        redirect_every: Some(4),
        unavailable_every: Some(7),
        ..Faults::default()
    });
    let r = c.open_reader(BUCKET, "mix", None).await.unwrap();
    let reads = (0..100u64).map(|i| {
        let r = r.clone();
        let off = (i * 331_337) % src.len() as u64;
        let len = 1 + (i * 77_777) % (3 * MIB as u64);
        async move { (off, len, r.read(off, len).await) }
    });
    for (off, len, got) in futures::future::join_all(reads).await {
        let end = (off + len).min(src.len() as u64) as usize;
        assert!(
            got.unwrap() == src.slice(off as usize..end),
            "range {off}+{len}"
        );
    }
    assert!(r.reconnects() > 10, "{} reconnects", r.reconnects());
    assert_eq!(r.in_flight(), 0);
    assert!(!r.is_broken());
    assert_eq!(emu.stats().missing_routing_header, 0);
}

/// Waits up to 10 s for every read stream the emulator opened to have ended.
async fn all_read_streams_end(emu: &rapidfs::emulator::Emulator) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while emu.stats().read_streams_ended < emu.stats().read_streams && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let st = emu.stats();
    assert_eq!(
        st.read_streams_ended, st.read_streams,
        "read streams still open at the emulator"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_once_returns_the_range_and_releases_its_stream() {
    for chaos in [false, true] {
        let emu = emulator(Faults {
            chaos,
            ..Faults::default()
        })
        .await;
        let want = data(5 * MIB + 123, 7);
        emu.put_object(BUCKET, "o", want.clone()).unwrap();
        let c = client(&emu).await;
        let generation = c.get_object(BUCKET, "o").await.unwrap().generation;
        for (offset, len) in [
            (0, want.len()),
            (0, MIB),
            (MIB, MIB),
            (MIB - 10, 3 * MIB + 20),
            (want.len() - 5, 5),
            (MIB, 0),
        ] {
            let got = c
                .read_once(BUCKET, "o", generation, offset as u64, len as u64)
                .await
                .unwrap();
            assert!(
                got == want.slice(offset..offset + len),
                "chaos {chaos}: [{offset}, +{len})"
            );
        }
        all_read_streams_end(&emu).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_once_fails_rather_than_return_a_cut_range() {
    let emu = emulator(Faults {
        cut_read_after_bytes: Some(100_000),
        ..Faults::default()
    })
    .await;
    emu.put_object(BUCKET, "o", data(MIB, 3)).unwrap();
    let c = client(&emu).await;
    let generation = c.get_object(BUCKET, "o").await.unwrap().generation;
    let got = c.read_once(BUCKET, "o", generation, 0, MIB as u64).await;
    assert!(matches!(got, Err(Error::Unavailable(_))), "{got:?}");
    assert!(emu.stats().faults_injected >= 1);
    let gone = c.read_once(BUCKET, "o", generation + 1, 0, 10).await;
    assert!(matches!(gone, Err(Error::NotFound(_))), "{gone:?}");
}
