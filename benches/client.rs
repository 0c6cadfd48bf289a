//! Client benchmark (`cargo bench --bench client`): the gcs client against the in-process
//! memory emulator over loopback, each figure the median of several runs with min/max, and
//! a plain TCP copy of the same bytes measured in the same run as the baseline.
//!
//! - one BidiReadObject stream reading a 1 GiB object vs the TCP copy (target: >= 0.5)
//! - 4 KiB random ranges per second with 1 and 64 in flight on one stream
//! - append throughput (flush every 8 MiB)
//!
//! Prints a table and writes target/bench-results/client.json.

use bytes::Bytes;
use futures::StreamExt;
use rapidfs::config::GcsConfig;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::gcs::Client;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MIB: usize = 1024 * 1024;
const BIG: usize = 1024 * MIB;
const RUNS: usize = 5;
const BUCKET: &str = "bench";

/// Median, min and max of samples (higher is better).
struct Figure {
    name: &'static str,
    unit: &'static str,
    median: f64,
    min: f64,
    max: f64,
}

fn figure(name: &'static str, unit: &'static str, mut samples: Vec<f64>) -> Figure {
    samples.sort_by(|a, b| a.total_cmp(b));
    Figure {
        name,
        unit,
        median: samples[samples.len() / 2],
        min: samples[0],
        max: samples[samples.len() - 1],
    }
}

fn data(len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for c in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = c.len();
        c.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    Bytes::from(v)
}

/// CPU time (user + system) this process has used so far, in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Runs `f` and returns its result with the CPU seconds the whole process spent meanwhile.
async fn with_cpu<T>(f: impl std::future::Future<Output = T>) -> (T, f64) {
    let before = cpu_seconds();
    let out = f.await;
    (out, cpu_seconds() - before)
}

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

/// Baseline: the same bytes through one loopback TCP connection, 2 MiB writes and reads.
async fn tcp_copy(src: Bytes) -> f64 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        sock.set_nodelay(true).unwrap();
        for piece in src.chunks(2 * MIB) {
            sock.write_all(piece).await.unwrap();
        }
    });
    let start = Instant::now();
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = vec![0u8; 2 * MIB];
    let mut got = 0usize;
    loop {
        let n = sock.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    let d = start.elapsed();
    server.await.unwrap();
    assert_eq!(got, BIG);
    mib_per_s(got, d)
}

async fn stream_read(c: &Client) -> f64 {
    let r = c.open_reader(BUCKET, "big", None).await.unwrap();
    let start = Instant::now();
    let mut s = Box::pin(r.read_stream(0, BIG as u64));
    let mut got = 0usize;
    while let Some(chunk) = s.next().await {
        got += chunk.unwrap().len();
    }
    let d = start.elapsed();
    assert_eq!(got, BIG);
    mib_per_s(got, d)
}

async fn random_4k(c: &Client, in_flight: usize) -> f64 {
    let r = c.open_reader(BUCKET, "big", None).await.unwrap();
    let n = if in_flight == 1 { 3_000 } else { 30_000 };
    let mut x = 12345u64;
    let offsets: Vec<u64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (BIG as u64 / 4096)) * 4096
        })
        .collect();
    let start = Instant::now();
    let results: Vec<_> = futures::stream::iter(offsets)
        .map(|off| {
            let r = r.clone();
            async move { r.read(off, 4096).await }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let d = start.elapsed();
    assert!(results
        .iter()
        .all(|b| matches!(b, Ok(b) if b.len() == 4096)));
    n as f64 / d.as_secs_f64()
}

async fn append(c: &Client, src: &Bytes, run: usize) -> f64 {
    let name = format!("append-{run}");
    let start = Instant::now();
    let mut w = c.create_appendable(BUCKET, &name, None).await.unwrap();
    for (i, piece) in src.chunks(MIB).enumerate() {
        w.append(src.slice_ref(piece)).await.unwrap();
        if (i + 1) % 8 == 0 {
            w.flush().await.unwrap();
        }
    }
    w.close().await.unwrap();
    let d = start.elapsed();
    c.delete_object(BUCKET, &name, None).await.unwrap();
    mib_per_s(src.len(), d)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let src = data(BIG);
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
    emu.create_bucket(BUCKET).unwrap();
    emu.put_object(BUCKET, "big", src.clone()).unwrap();
    let cfg = GcsConfig {
        endpoint: emu.endpoint(),
        ..GcsConfig::default()
    };
    let c = Client::connect(&cfg).await.unwrap();

    let mut tcp = Vec::new();
    let mut grpc = Vec::new();
    let mut tcp_cpu = Vec::new();
    let mut grpc_cpu = Vec::new();
    let gib = (BIG / 1024 / MIB) as f64;
    for _ in 0..RUNS {
        let (t, cpu) = with_cpu(tcp_copy(src.clone())).await;
        tcp.push(t);
        tcp_cpu.push(gib / cpu);
        let (g, cpu) = with_cpu(stream_read(&c)).await;
        grpc.push(g);
        grpc_cpu.push(gib / cpu);
    }
    let mut rand1 = Vec::new();
    let mut rand64 = Vec::new();
    for _ in 0..RUNS {
        rand1.push(random_4k(&c, 1).await);
        rand64.push(random_4k(&c, 64).await);
    }
    let wsrc = src.slice(0..256 * MIB);
    let mut app = Vec::new();
    for run in 0..RUNS {
        app.push(append(&c, &wsrc, run).await);
    }

    let tcp = figure("tcp copy 1 GiB (baseline)", "MiB/s", tcp);
    let base = tcp.median;
    let tcp_cpu = figure("tcp copy: GiB per CPU-second", "GiB/cpu-s", tcp_cpu);
    let grpc_cpu = figure("bidi read: GiB per CPU-second", "GiB/cpu-s", grpc_cpu);
    let cpu_base = tcp_cpu.median;
    let figures = [
        figure("bidi read_stream 1 GiB", "MiB/s", grpc),
        figure("4 KiB random reads, 1 in flight", "reads/s", rand1),
        figure("4 KiB random reads, 64 in flight", "reads/s", rand64),
        figure("append 256 MiB, flush every 8 MiB", "MiB/s", app),
        tcp_cpu,
        grpc_cpu,
    ];
    print_and_save(&tcp, &figures, (base, cpu_base), &cfg);
    emu.shutdown().await;
}

/// `base`: the TCP copy's MiB/s and GiB per CPU-second; figures in those units get a ratio.
fn print_and_save(tcp: &Figure, figures: &[Figure], base: (f64, f64), cfg: &GcsConfig) {
    let ratio = |f: &Figure| match f.unit {
        "MiB/s" => Some(f.median / base.0),
        "GiB/cpu-s" => Some(f.median / base.1),
        _ => None,
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    // Other work on the machine skews every figure; the load says how much.
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_string();
    println!(
        "\nclient benchmark ({cores} cores, kernel {kernel}, load {load}, median of {RUNS} runs)"
    );
    println!(
        "{:<40} {:>20} {:>10} {:>10} {:>8}",
        "case", "median", "min", "max", "vs tcp"
    );
    let mut json = Vec::new();
    for f in std::iter::once(tcp).chain(figures) {
        let shown = ratio(f).map_or("-".to_string(), |r| format!("{r:.2}"));
        println!(
            "{:<40} {:>10.2} {:<9} {:>10.2} {:>10.2} {:>8}",
            f.name, f.median, f.unit, f.min, f.max, shown
        );
        json.push(format!(
            "    {{\"case\": {:?}, \"unit\": {:?}, \"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}, \"ratio_to_tcp\": {}}}",
            f.name,
            f.unit,
            f.median,
            f.min,
            f.max,
            ratio(f).map_or("null".to_string(), |r| format!("{r:.3}"))
        ));
    }
    let text = format!(
        "{{\n  \"bench\": \"client\",\n  \"cores\": {cores},\n  \"kernel\": {kernel:?},\n  \"loadavg_1min_at_end\": {load:?},\n  \"runs\": {RUNS},\n  \"config\": {{\"connections\": {}, \"stream_window_kb\": {}, \"connection_window_kb\": {}, \"read_stream_window_kb\": {}, \"write_buffer_kb\": {}}},\n  \"results\": [\n{}\n  ]\n}}\n",
        cfg.connections,
        cfg.stream_window_kb,
        cfg.connection_window_kb,
        cfg.read_stream_window_kb,
        cfg.write_buffer_kb,
        json.join(",\n")
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("client.json");
    std::fs::write(&path, text).unwrap();
    println!("wrote {}", path.display());
}
