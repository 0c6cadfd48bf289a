//! The emulator's own serving rate: one and four concurrent BidiReadObject streams reading a
//! 1 GiB in-memory object with a raw tonic client, next to a plain TCP copy of the same bytes
//! over loopback (the baseline, measured in the same run). Prints a table and writes JSON
//! (cores, kernel, configuration) under target/bench-results/.
//!
//! Run: `cargo bench --bench emulator` (RAPIDFS_BENCH_RUNS=N to change the number of runs).

use bytes::Bytes;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::proto::storage::storage_client::StorageClient;
use rapidfs::proto::storage::{BidiReadObjectRequest, BidiReadObjectSpec, ReadRange};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Channel, Endpoint};

const SIZE: usize = 1 << 30;
const BUCKET: &str = "bench";
const OBJECT: &str = "one-gib";

/// 1 GiB of non-constant bytes, made quickly.
fn payload() -> Bytes {
    let mut v = vec![0u8; SIZE];
    for (i, w) in v.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).to_le_bytes());
    }
    Bytes::from(v)
}

async fn channel(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint")
        .initial_stream_window_size(32 << 20)
        .initial_connection_window_size(64 << 20)
        .max_frame_size((1 << 20) - 1)
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect")
}

/// Reads the whole object on one BidiReadObject stream; returns the payload bytes received.
async fn read_stream(ch: Channel) -> u64 {
    let mut c = StorageClient::new(ch).max_decoding_message_size(16 << 20);
    let first = BidiReadObjectRequest {
        read_object_spec: Some(BidiReadObjectSpec {
            bucket: format!("projects/_/buckets/{BUCKET}"),
            object: OBJECT.into(),
            ..Default::default()
        }),
        read_ranges: vec![ReadRange {
            read_offset: 0,
            read_length: 0,
            read_id: 1,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(first).await.expect("send");
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    req.metadata_mut().insert(
        "x-goog-request-params",
        format!("bucket=projects/_/buckets/{BUCKET}")
            .parse()
            .expect("header"),
    );
    let mut s = c.bidi_read_object(req).await.expect("open").into_inner();
    let mut got = 0u64;
    'outer: while let Some(m) = s.message().await.expect("read") {
        for d in m.object_data_ranges {
            got += d.checksummed_data.map_or(0, |c| c.content.len() as u64);
            if d.range_end {
                break 'outer;
            }
        }
    }
    drop(tx);
    got
}

/// `n` streams (one connection each) reading the whole object at once: GiB/s in total.
async fn emulator_run(endpoint: &str, n: usize) -> f64 {
    let mut chans = Vec::new();
    for _ in 0..n {
        chans.push(channel(endpoint).await);
    }
    let t = Instant::now();
    let tasks: Vec<_> = chans
        .into_iter()
        .map(|ch| tokio::spawn(read_stream(ch)))
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, (n * SIZE) as u64);
    gib_per_s(total, t.elapsed())
}

/// `n` plain TCP connections over loopback each copying the same bytes: GiB/s in total.
async fn tcp_run(data: &Bytes, n: usize) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let data = data.clone();
    let server = tokio::spawn(async move {
        let mut writers = Vec::new();
        for _ in 0..n {
            let (mut sock, _) = listener.accept().await.expect("accept");
            sock.set_nodelay(true).expect("nodelay");
            let data = data.clone();
            writers.push(tokio::spawn(async move {
                for chunk in data.chunks(2 << 20) {
                    sock.write_all(chunk).await.expect("write");
                }
            }));
        }
        for w in writers {
            w.await.expect("writer");
        }
    });
    let mut socks = Vec::new();
    for _ in 0..n {
        let s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        socks.push(s);
    }
    let t = Instant::now();
    let readers: Vec<_> = socks
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 2 << 20];
                let mut got = 0u64;
                loop {
                    let k = s.read(&mut buf).await.expect("read");
                    if k == 0 {
                        break got;
                    }
                    got += k as u64;
                }
            })
        })
        .collect();
    let mut total = 0;
    for r in readers {
        total += r.await.expect("reader");
    }
    server.await.expect("server");
    assert_eq!(total, (n * SIZE) as u64);
    gib_per_s(total, t.elapsed())
}

fn gib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / d.as_secs_f64()
}

/// (median, min, max).
fn summary(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let runs: usize = std::env::var("RAPIDFS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let data = payload();
        let emu = Emulator::start(
            EmulatorOptions {
                root: None,
                memory: true,
                zone: "us-central1-a".into(),
                faults: Faults::default(),
            },
            "127.0.0.1:0".parse().expect("addr"),
        )
        .await
        .expect("emulator");
        emu.create_bucket(BUCKET).expect("bucket");
        emu.put_object(BUCKET, OBJECT, data.clone()).expect("put");
        let endpoint = emu.endpoint();
        // Warm-up: one read of each kind.
        emulator_run(&endpoint, 1).await;
        tcp_run(&data, 1).await;

        let mut rows = Vec::new();
        for n in [1usize, 4] {
            let mut emu_rates = Vec::new();
            let mut tcp_rates = Vec::new();
            for _ in 0..runs {
                tcp_rates.push(tcp_run(&data, n).await);
                emu_rates.push(emulator_run(&endpoint, n).await);
            }
            rows.push((n, summary(emu_rates), summary(tcp_rates)));
        }
        let stats = emu.stats();
        emu.shutdown().await;

        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!("emulator serving rate, 1 GiB in-memory object, {runs} runs, {cores} cores, kernel {}", kernel());
        println!("{:<8} {:>26} {:>26} {:>10}", "streams", "emulator GiB/s med [min-max]", "TCP GiB/s med [min-max]", "emu/TCP");
        let mut json_rows = Vec::new();
        for (n, (em, emin, emax), (tm, tmin, tmax)) in &rows {
            println!(
                "{:<8} {:>12.2} [{:.2}-{:.2}] {:>12.2} [{:.2}-{:.2}] {:>10.2}",
                n, em, emin, emax, tm, tmin, tmax, em / tm
            );
            json_rows.push(format!(
                "{{\"streams\":{n},\"emulator_gib_s\":{{\"median\":{em:.4},\"min\":{emin:.4},\"max\":{emax:.4}}},\"tcp_gib_s\":{{\"median\":{tm:.4},\"min\":{tmin:.4},\"max\":{tmax:.4}}},\"ratio_vs_tcp\":{:.4}}}",
                em / tm
            ));
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let json = format!(
            "{{\"bench\":\"emulator\",\"unix_time\":{stamp},\"cores\":{cores},\"kernel\":\"{}\",\"config\":{{\"object_bytes\":{SIZE},\"runs\":{runs},\"backend\":\"memory\",\"chunk_bytes\":2097152,\"client\":\"raw tonic, one connection per stream, 32/64 MiB windows, 1 MiB frames\",\"baseline\":\"tokio TCP copy over loopback, 2 MiB writes\"}},\"bytes_sent\":{},\"rows\":[{}]}}",
            kernel(),
            stats.bytes_sent,
            json_rows.join(",")
        );
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
        std::fs::create_dir_all(&dir).expect("results dir");
        let path = dir.join(format!("emulator-{stamp}.json"));
        std::fs::write(&path, json).expect("write results");
        println!("results: {}", path.display());
    });
}
