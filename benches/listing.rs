//! Listing benchmark (`cargo bench --bench listing`): one directory of 1,000,000 objects in
//! the in-process memory emulator with 5 ms of latency on every call, listed through the
//! filesystem (`Fs::readdir`, the code a mount runs) by the parallel lister against one
//! page-by-page lister (`parallel_list_workers = 1`) in the same run, on evenly spread
//! (hash-like) names and on names that all share one long prefix. Target: parallel >= 5x.
//!
//! Each figure is the median of 3 runs (min and max printed), each run on a fresh `Fs`.
//! Prints a table and writes target/bench-results/listing.json (cores, kernel, config).
//!
//! Flags (after `--`): `--objects N` (default 1000000), `--latency-us N` (5000),
//! `--workers N` (16), `--runs N` (3), `--names spread|shared` (both). The emulator, the client and the lister share the
//! machine's cores: the figures say what the listing costs here, not on a real service.

use anyhow::Context;
use rapidfs::config::Config;
use rapidfs::emulator::{Emulator, EmulatorOptions, Faults};
use rapidfs::fs::{Fs, ROOT_INO};
use rapidfs::gcs::Client;
use std::time::Instant;

const BUCKET: &str = "bench";
/// The name shapes listed (see `name`).
const SHAPES: [&str; 2] = ["spread", "shared"];

struct Args {
    objects: usize,
    latency_us: u64,
    workers: u32,
    runs: usize,
    shapes: Vec<&'static str>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        objects: 1_000_000,
        latency_us: 5_000,
        workers: 16,
        runs: 3,
        shapes: SHAPES.to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> anyhow::Result<u64> {
            let v = it.next().with_context(|| format!("{name} needs a value"))?;
            v.parse()
                .with_context(|| format!("{name}: not a number: {v:?}"))
        };
        match flag.as_str() {
            "--objects" => a.objects = value("--objects")? as usize,
            "--latency-us" => a.latency_us = value("--latency-us")?,
            "--workers" => a.workers = value("--workers")? as u32,
            "--runs" => a.runs = (value("--runs")? as usize).max(1),
            "--names" => {
                let v = it.next().context("--names needs a value")?;
                let shape = SHAPES.iter().find(|s| **s == v);
                a.shapes = vec![*shape.with_context(|| format!("--names: not one of {SHAPES:?}"))?];
            }
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => {
                anyhow::bail!("unknown flag {other:?} (see the doc comment of benches/listing.rs)")
            }
        }
    }
    Ok(a)
}

/// The two name shapes: hash-like names spread over the key space, and one long shared prefix.
fn name(shape: &str, i: usize) -> String {
    match shape {
        "spread" => {
            let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            format!("{h:016x}.jpg")
        }
        _ => {
            format!("train_images_from_the_one_camera_of_the_project_shard_0000_sample_{i:08}.jpg")
        }
    }
}

/// Lists `dir` once through a fresh `Fs`: seconds, entry count, and whether it was in order.
async fn list_once(cfg: &Config, dir: &str) -> anyhow::Result<(f64, usize, bool)> {
    let client = Client::connect(&cfg.gcs).await?;
    let fs = Fs::new(client, BUCKET, cfg);
    let ino = fs
        .lookup(ROOT_INO, dir)
        .await
        .map_err(|e| anyhow::anyhow!("lookup {dir}: {e:?}"))?
        .attr
        .ino;
    let fh = fs
        .opendir(ino)
        .map_err(|e| anyhow::anyhow!("opendir: {e:?}"))?;
    let t0 = Instant::now();
    let (mut count, mut ordered, mut last) = (0, true, String::new());
    fs.readdir(fh, 2, |item| {
        ordered &= count == 0 || last.as_str() < item.name;
        last.clear();
        last.push_str(item.name);
        count += 1;
        false
    })
    .await
    .map_err(|e| anyhow::anyhow!("readdir: {e:?}"))?;
    let secs = t0.elapsed().as_secs_f64();
    fs.releasedir(fh);
    Ok((secs, count, ordered))
}

struct Row {
    shape: &'static str,
    lister: String,
    secs: Vec<f64>,
    list_calls: Vec<u64>,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

async fn bench_shape(shape: &'static str, a: &Args) -> anyhow::Result<Vec<Row>> {
    let opts = EmulatorOptions {
        memory: true,
        zone: "us-central1-a".to_string(),
        ..Default::default()
    };
    let emu = Emulator::start(opts, "127.0.0.1:0".parse()?).await?;
    emu.create_bucket(BUCKET)?;
    let t0 = Instant::now();
    let empty = bytes::Bytes::new();
    // In key order, as the emulator's own `--root` preload fills its index: the emulator's
    // per-key listing cost (charged to these shared cores, unlike a real service's) triples
    // when its index was filled in hash order and its keys lie scattered in memory.
    let mut names: Vec<String> = (0..a.objects)
        .map(|i| format!("{shape}/{}", name(shape, i)))
        .collect();
    names.sort_unstable();
    for n in &names {
        emu.put_object(BUCKET, n, empty.clone())?;
    }
    eprintln!(
        "[listing] {shape}: {} objects put in {:.1} s",
        a.objects,
        t0.elapsed().as_secs_f64()
    );
    emu.set_faults(Faults {
        latency_us: a.latency_us,
        ..Default::default()
    });
    let mut rows = Vec::new();
    for workers in [1, a.workers] {
        let mut cfg = Config::default();
        cfg.gcs.endpoint = emu.endpoint();
        cfg.fs.parallel_list_workers = workers;
        let mut row = Row {
            shape,
            lister: if workers == 1 {
                "page by page".to_string()
            } else {
                format!("parallel, {workers} workers")
            },
            secs: Vec::new(),
            list_calls: Vec::new(),
        };
        for run in 0..a.runs {
            emu.reset_stats();
            let (secs, n, ordered) = list_once(&cfg, shape).await?;
            anyhow::ensure!(
                n == a.objects && ordered,
                "{shape} with {workers} workers listed {n} of {} entries (ordered: {ordered})",
                a.objects
            );
            let calls = emu.stats().list_calls;
            eprintln!(
                "[listing] {shape} {} run {}: {secs:.2} s, {calls} list calls",
                row.lister,
                run + 1
            );
            row.secs.push(secs);
            row.list_calls.push(calls);
        }
        rows.push(row);
    }
    emu.shutdown().await;
    Ok(rows)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("listing bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let a = parse_args()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut rows = Vec::new();
    for &shape in &a.shapes {
        rows.extend(rt.block_on(bench_shape(shape, &a))?);
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    println!(
        "\nlisting benchmark: {} objects in one directory, {} us latency per call, \
         {cores} cores (emulator, client and lister share them), kernel {kernel}, median of {} runs",
        a.objects, a.latency_us, a.runs
    );
    println!(
        "{:<8} {:<22} {:>9} {:>9} {:>9} {:>11} {:>9} {:>7}",
        "names", "lister", "median s", "min s", "max s", "entries/s", "calls", "speedup"
    );
    let mut json_rows = Vec::new();
    for &shape in &a.shapes {
        let of: Vec<&Row> = rows.iter().filter(|r| r.shape == shape).collect();
        let base = median(&of[0].secs);
        for r in &of {
            let m = median(&r.secs);
            let min = r.secs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = r.secs.iter().copied().fold(0.0, f64::max);
            let speedup = base / m;
            println!(
                "{:<8} {:<22} {:>9.2} {:>9.2} {:>9.2} {:>11.0} {:>9} {:>6.1}x",
                r.shape,
                r.lister,
                m,
                min,
                max,
                a.objects as f64 / m,
                r.list_calls[r.list_calls.len() / 2],
                speedup
            );
            json_rows.push(serde_json::json!({
                "names": r.shape,
                "lister": r.lister,
                "seconds": r.secs,
                "median_seconds": m,
                "list_calls": r.list_calls,
                "speedup_vs_page_by_page": speedup,
            }));
        }
        let speedup = base / median(&of[of.len() - 1].secs);
        println!(
            "{shape}: parallel / page by page = {speedup:.1}x (target >= 5x: {})",
            if speedup >= 5.0 { "met" } else { "NOT met" }
        );
    }
    let json = serde_json::json!({
        "bench": "listing",
        "cores": cores,
        "kernel": kernel,
        "config": {
            "objects": a.objects,
            "latency_us": a.latency_us,
            "workers": a.workers,
            "runs": a.runs,
            "page_size": Config::default().fs.list_page_size,
            "parallel_list_threshold": Config::default().fs.parallel_list_threshold,
        },
        "results": json_rows,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("listing.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
