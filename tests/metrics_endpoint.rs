//! `--metrics-addr`: the daemon serves Prometheus text at /metrics. Two scrapes taken while
//! files are read through the mount must parse as the Prometheus text format (checked by a
//! strict parser below: names, labels, values, TYPE lines, histogram buckets) and the
//! counters must move between them. The request counts also show what the kernel sends a
//! read-only mount: reads, and no opens, flushes or releases past the first refusals.

mod mount_support;

use mount_support::{data, is_mounted, Env};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BUCKET: &str = "metrics";

/// One sample: metric name, labels (sorted) and value.
type Series = (String, BTreeMap<String, String>);

/// A parsed exposition: every sample, and the declared type of every family.
#[derive(Debug, Default)]
struct Scrape {
    samples: HashMap<Series, f64>,
    types: HashMap<String, String>,
}

impl Scrape {
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .get(&(name.to_string(), labels))
            .copied()
            .unwrap_or(0.0)
    }

    /// Sum over every series of `name` whose labels include `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|((n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(v))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse().map_err(|_| format!("bad value {s:?}")),
    }
}

/// `{a="x",b="y\"z"}` -> labels, and the rest of the line after `}`.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("labels must open with {")?;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = rest[..eq].trim();
        if !valid_name(name) || name.contains(':') {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        rest = rest.strip_prefix(',').unwrap_or(rest);
    }
}

/// The Prometheus text format, version 0.0.4, strictly.
fn parse(text: &str) -> Result<Scrape, String> {
    let mut out = Scrape::default();
    for (n, line) in text.lines().enumerate() {
        let err = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(c) = line.strip_prefix('#') {
            let words: Vec<&str> = c.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["TYPE", name, kind] => {
                    if !valid_name(name) {
                        return Err(err("bad family name".into()));
                    }
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(kind) {
                        return Err(err("bad type".into()));
                    }
                    if out
                        .types
                        .insert(name.to_string(), kind.to_string())
                        .is_some()
                    {
                        return Err(err("TYPE given twice".into()));
                    }
                }
                ["HELP", name, ..] if valid_name(name) => {}
                ["HELP", ..] => return Err(err("bad HELP".into())),
                _ => {}
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err("bad metric name".into()));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(err)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest.split_whitespace();
        let value =
            parse_value(fields.next().ok_or_else(|| err("no value".into()))?).map_err(err)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|_| err("bad timestamp".into()))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing text".into()));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| out.types.contains_key(*f)))
            .unwrap_or(name);
        if !out.types.contains_key(family) {
            return Err(err(format!("sample of {family} before its TYPE")));
        }
        if out
            .samples
            .insert((name.to_string(), labels), value)
            .is_some()
        {
            return Err(err("series given twice".into()));
        }
    }
    check_histograms(&out)?;
    Ok(out)
}

/// Every histogram's buckets grow with `le` and end with `+Inf` equal to `_count`.
fn check_histograms(s: &Scrape) -> Result<(), String> {
    for (family, kind) in &s.types {
        if kind != "histogram" {
            continue;
        }
        let bucket = format!("{family}_bucket");
        let mut by_series: HashMap<BTreeMap<String, String>, Vec<(f64, f64)>> = HashMap::new();
        for ((name, labels), v) in &s.samples {
            if *name != bucket {
                continue;
            }
            let mut rest = labels.clone();
            let le = rest.remove("le").ok_or(format!("{bucket} without le"))?;
            by_series
                .entry(rest)
                .or_default()
                .push((parse_value(&le)?, *v));
        }
        for (labels, mut buckets) in by_series {
            buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
                return Err(format!("{family}{labels:?}: buckets not cumulative"));
            }
            let last = buckets.last().ok_or("no buckets")?;
            let count = s
                .samples
                .get(&(format!("{family}_count"), labels.clone()))
                .ok_or(format!("{family}{labels:?} without _count"))?;
            if last.0 != f64::INFINITY || last.1 != *count {
                return Err(format!("{family}{labels:?}: +Inf bucket is not _count"));
            }
        }
    }
    Ok(())
}

/// GET /metrics over plain HTTP/1.1 (content-length or chunked).
fn scrape(addr: &str) -> String {
    let mut conn = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).expect("response");
    let raw = String::from_utf8(raw).expect("UTF-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("headers end");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: text/plain"), "{head}");
    if !head.contains("transfer-encoding: chunked") {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").expect("chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Reads a whole file, then drops its pages from the page cache (only this file's), so the
/// next round reaches the daemon again.
fn read_uncached(path: &Path) {
    use std::os::fd::AsRawFd;
    let mut f = std::fs::File::open(path).expect("open");
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).expect("read");
    // SAFETY: advice on a descriptor we own; no memory is passed.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

/// Starts `rapidfs mount` of the test bucket on `mnt` serving metrics on `addr`, with
/// `extra` arguments, and waits until it is mounted.
fn mount_daemon(env: &Env, mnt: &Path, addr: &str, extra: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET, "--foreground", "--memory-mb", "256"])
        .args(extra)
        .arg(mnt)
        .args(["--endpoint", &env.emu().endpoint(), "--metrics-addr", addr])
        .stdin(Stdio::null())
        .spawn()
        .expect("rapidfs runs");
    let start = Instant::now();
    while !is_mounted(mnt) {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("not mounted within 20 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Ends a daemon started by `mount_daemon` the way a user would, and checks it exits cleanly.
fn stop_daemon(mut child: Child) {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().expect("wait").success());
}

#[test]
fn a_scrape_during_reads_parses_and_counters_move() {
    let env = Env::new(BUCKET);
    for i in 0..32 {
        env.put(BUCKET, &format!("small/{i:02}.bin"), &data(i, 200_000));
    }
    env.put(BUCKET, "big.bin", &data(99, 48 * 1024 * 1024));
    let mnt = tempfile::tempdir().expect("tempdir");
    let addr = format!("127.0.0.1:{}", free_port());
    // No metadata caching: every round's lookups reach the service, so the gRPC series move
    // between the two scrapes however well the listings would answer them.
    let child = mount_daemon(&env, mnt.path(), &addr, &["--metadata-ttl-ms", "0"]);
    let stop = Arc::new(AtomicBool::new(false));
    let root = mnt.path().to_path_buf();
    let reader = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..32 {
                    read_uncached(&root.join(format!("small/{i:02}.bin")));
                }
                read_uncached(&root.join("big.bin"));
                let _ = std::fs::metadata(root.join(format!("missing-{rounds}")));
                rounds += 1;
            }
            rounds
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let first = scrape(&addr);
    std::thread::sleep(Duration::from_millis(1500));
    let second = scrape(&addr);
    stop.store(true, Ordering::Relaxed);
    let rounds = reader.join().expect("reader");
    stop_daemon(child);
    assert!(rounds >= 2, "only {rounds} rounds of reads");

    let a = parse(&first).unwrap_or_else(|e| panic!("first scrape: {e}\n{first}"));
    let b = parse(&second).unwrap_or_else(|e| panic!("second scrape: {e}\n{second}"));
    let moved = |name: &str, labels: &[(&str, &str)]| {
        let (x, y) = (a.sum(name, labels), b.sum(name, labels));
        assert!(y > x, "{name}{labels:?} did not move: {x} -> {y}\n{second}");
    };
    moved("rapidfs_fuse_requests_total", &[("op", "read")]);
    moved("rapidfs_fuse_bytes_total", &[("op", "read")]);
    moved("rapidfs_fuse_requests_total", &[("op", "lookup")]);
    moved(
        "rapidfs_fuse_errors_total",
        &[("op", "lookup"), ("errno", "ENOENT")],
    );
    moved("rapidfs_fuse_latency_seconds_count", &[("op", "read")]);
    moved("rapidfs_grpc_calls_total", &[]);
    moved("rapidfs_grpc_latency_seconds_count", &[]);
    // Every small file read whole is a lookup, a miss that goes to the service (the big file
    // follows the kernel's read-ahead, past the block cache).
    moved("rapidfs_cache_lookups_total", &[("result", "miss")]);
    assert!(b.sum("rapidfs_cache_lookups_total", &[("result", "miss")]) > 0.0);
    assert!(
        b.sum(
            "rapidfs_streams_total",
            &[("kind", "read"), ("event", "opened")]
        ) > 0.0
    );
    assert!(
        b.sum(
            "rapidfs_streams_total",
            &[("kind", "read"), ("event", "reused")]
        ) > 0.0
    );
    assert!(
        b.get(
            "rapidfs_grpc_calls_total",
            &[("method", "BidiReadObject"), ("code", "OK")]
        ) > 0.0
    );
    // Reading handles are opened with FOPEN_NOFLUSH: closing one costs no FLUSH round trip.
    assert!(b.sum("rapidfs_fuse_requests_total", &[("op", "open")]) > 0.0);
    assert_eq!(
        b.sum("rapidfs_fuse_requests_total", &[("op", "flush")]),
        0.0,
        "{second}"
    );
    assert_eq!(
        b.types
            .get("rapidfs_fuse_latency_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert_eq!(
        b.get("rapidfs_memory_budget_bytes", &[]),
        256.0 * 1024.0 * 1024.0
    );
    let rss = b.get("rapidfs_memory_in_use_bytes", &[]);
    assert!(rss > 1e6 && rss < 2e9, "memory in use {rss}");
}

/// On a read-only mount (`--read-only` or `-o ro`) the kernel reads files without opening
/// them: one `open` and one `flush` are answered ENOSYS, which the kernel remembers, and no
/// `release` ever comes. The files read back whole: small ones, a large one read by the
/// kernel's read-ahead, and the large one again through `O_DIRECT`, which the kernel sends as
/// it comes.
#[test]
fn a_read_only_mount_is_read_without_opens_flushes_or_releases() {
    let env = Env::new(BUCKET);
    let small: Vec<Vec<u8>> = (0..40)
        .map(|i| data(i, 150_000 + 977 * i as usize))
        .collect();
    for (i, bytes) in small.iter().enumerate() {
        env.put(BUCKET, &format!("small/{i:02}.bin"), bytes);
    }
    let big = data(77, 6 * 1024 * 1024 + 4096);
    env.put(BUCKET, "big.bin", &big);
    // `--read-only`, and `-o ro` as an fstab line gives it.
    for how in [&["--read-only"][..], &["-o", "ro"][..]] {
        let mnt = tempfile::tempdir().expect("tempdir");
        let addr = format!("127.0.0.1:{}", free_port());
        let child = mount_daemon(&env, mnt.path(), &addr, how);
        for (i, bytes) in small.iter().enumerate() {
            let got = std::fs::read(mnt.path().join(format!("small/{i:02}.bin"))).expect("read");
            assert!(got == *bytes, "{how:?}: small/{i:02}.bin differs");
        }
        assert!(std::fs::read(mnt.path().join("big.bin")).expect("read") == big);
        let direct = read_direct(&mnt.path().join("big.bin"));
        assert!(direct == big, "{how:?}: O_DIRECT read differs");
        let s = scrape(&addr);
        stop_daemon(child);

        let m = parse(&s).unwrap_or_else(|e| panic!("scrape: {e}\n{s}"));
        let requests = |op| m.sum("rapidfs_fuse_requests_total", &[("op", op)]);
        assert_eq!(requests("open"), 1.0, "{how:?}: {s}");
        assert_eq!(requests("flush"), 1.0, "{how:?}: {s}");
        assert_eq!(requests("release"), 0.0, "{how:?}: {s}");
        let refused = |op| {
            m.get(
                "rapidfs_fuse_errors_total",
                &[("op", op), ("errno", "ENOSYS")],
            )
        };
        assert_eq!(
            (refused("open"), refused("flush")),
            (1.0, 1.0),
            "{how:?}: {s}"
        );
        assert!(requests("read") >= 40.0 + 2.0 * 6.0, "{how:?}: {s}");
    }
}

/// Reads `path` whole with `O_DIRECT`, in aligned 1 MiB requests.
fn read_direct(path: &Path) -> Vec<u8> {
    use std::os::unix::fs::OpenOptionsExt;
    const CHUNK: usize = 1024 * 1024;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .expect("open O_DIRECT");
    // O_DIRECT wants the buffer aligned to the logical block (4 KiB covers every device).
    let mut raw = vec![0u8; CHUNK + 4096];
    let start = raw.as_ptr().align_offset(4096);
    let chunk = &mut raw[start..start + CHUNK];
    let mut out = Vec::new();
    loop {
        let n = f.read(chunk).expect("O_DIRECT read");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    out
}

#[test]
fn the_parser_rejects_broken_text() {
    for bad in [
        "rapidfs_x 1\n",
        "# TYPE x counter\nx{a=\"1\" 2\n",
        "# TYPE x counter\nx{a=1} 2\n",
        "# TYPE x counter\nx one\n",
        "# TYPE x counter\nx 1\nx 2\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\n",
        "# TYPE 9x counter\n",
    ] {
        assert!(parse(bad).is_err(), "accepted {bad:?}");
    }
    let good = "# HELP x a counter\n# TYPE x counter\nx{a=\"q\\\"\"} 1 1700000000\n";
    assert!(parse(good).is_ok());
}

#[test]
fn a_bad_metrics_address_is_one_clear_line() {
    let mnt = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_rapidfs"))
        .args(["mount", BUCKET])
        .arg(mnt.path())
        .args(["--metrics-addr", "nowhere"])
        .output()
        .expect("rapidfs runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("metrics address 'nowhere'"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
}
