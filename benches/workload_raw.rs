//! The raw-client row of the workload benchmark (`benches/workload.py` runs it): this
//! crate's gcs client reads a list of whole objects from one process, `--concurrency` of
//! them in flight, each in one BidiReadObject stream whose first message already asks for
//! the bytes: the ceiling of the read path without FUSE.
//!
//! Usage: `workload_raw --endpoint URL --bucket B --names FILE [--concurrency N] [--batch N]`
//! where FILE holds one `SIZE NAME` per line in the order to read. Prints one JSON line:
//! `{"seconds", "bytes", "files", "first_batch_seconds"}` (the first batch is the time until
//! the first `--batch` files, in order, have arrived).

use anyhow::Context;
use futures::StreamExt;
use rapidfs::config::GcsConfig;
use rapidfs::gcs::Client;
use std::time::Instant;

struct Args {
    endpoint: String,
    bucket: String,
    names: String,
    concurrency: usize,
    batch: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args {
        endpoint: String::new(),
        bucket: String::new(),
        names: String::new(),
        concurrency: 32,
        batch: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--endpoint" => a.endpoint = value()?,
            "--bucket" => a.bucket = value()?,
            "--names" => a.names = value()?,
            "--concurrency" => a.concurrency = value()?.parse().context("--concurrency")?,
            "--batch" => a.batch = value()?.parse().context("--batch")?,
            "--bench" => {}
            other => anyhow::bail!("unknown flag {other:?}"),
        }
    }
    anyhow::ensure!(
        !a.endpoint.is_empty() && !a.bucket.is_empty() && !a.names.is_empty(),
        "usage: workload_raw --endpoint URL --bucket B --names FILE [--concurrency N] [--batch N]"
    );
    Ok(a)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("workload_raw: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let a = parse_args()?;
    let text = std::fs::read_to_string(&a.names).with_context(|| format!("read {}", a.names))?;
    let mut objects = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let (size, name) = line
            .split_once(' ')
            .with_context(|| format!("bad line {line:?}"))?;
        objects.push((name.to_string(), size.parse::<u64>().context("size")?));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let cfg = GcsConfig {
            endpoint: a.endpoint.clone(),
            ..GcsConfig::default()
        };
        let client = Client::connect(&cfg).await?;
        let t0 = Instant::now();
        let bucket = a.bucket.as_str();
        let reads = futures::stream::iter(objects.iter().map(|(name, size)| {
            let client = client.clone();
            async move {
                let (_reader, pending) = client
                    .open_reader_reading(bucket, name, None, 0, *size)
                    .await?;
                let bytes = pending.bytes().await?;
                anyhow::ensure!(bytes.len() as u64 == *size, "{name}: short read");
                anyhow::Ok(bytes.len() as u64)
            }
        }))
        .buffered(a.concurrency.max(1));
        tokio::pin!(reads);
        let (mut total, mut files, mut first) = (0u64, 0usize, None);
        while let Some(n) = reads.next().await {
            total += n?;
            files += 1;
            if files == a.batch.min(objects.len()) {
                first = Some(t0.elapsed().as_secs_f64());
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "seconds": secs,
                "bytes": total,
                "files": files,
                "first_batch_seconds": first.unwrap_or(secs),
            })
        );
        anyhow::Ok(())
    })
}
