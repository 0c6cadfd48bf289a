//! Reads through a real FUSE mount of the in-process emulator: whole files (read and mmap),
//! random preads, many threads, and the efficiency the emulator's counters show.

mod mount_support;

use mount_support::{data, read_file, sha, Env};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

const MIB: usize = 1024 * 1024;
const BUCKET: &str = "data";

/// 300 files of mixed sizes in nested directories; returns name -> bytes.
fn three_hundred(env: &Env) -> BTreeMap<String, Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(300);
    let mut files = BTreeMap::new();
    for i in 0..300u64 {
        let size = match i % 6 {
            _ if i == 7 || i == 150 => 64 * MIB,
            0 => 0,
            1 => 1,
            2 => 4096,
            3 => MIB + 1,
            _ => rng.random_range(0..600 * 1024),
        };
        let name = format!("d{}/e{}/f{i:03}.bin", i % 5, i % 3);
        let bytes = data(i, size);
        env.put(BUCKET, &name, &bytes);
        files.insert(name, bytes);
    }
    files
}

/// Every regular file under `root`, relative names.
fn walk(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("read_dir") {
            let e = e.expect("entry");
            let ft = e.file_type().expect("file type");
            if ft.is_dir() {
                stack.push(e.path());
            } else {
                let rel = e
                    .path()
                    .strip_prefix(root)
                    .expect("under root")
                    .to_path_buf();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

fn mmap_sha(path: &Path) -> [u8; 32] {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open");
    let len = f.metadata().expect("stat").len() as usize;
    if len == 0 {
        return sha(&[]);
    }
    // SAFETY: a private read-only mapping of a file we keep open; unmapped before return.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap {}", path.display());
        let digest = sha(std::slice::from_raw_parts(p as *const u8, len));
        libc::munmap(p, len);
        digest
    }
}

#[test]
fn three_hundred_files_hash_equal_through_read_and_mmap() {
    let env = Env::new(BUCKET);
    let files = three_hundred(&env);
    let mut cfg = env.config();
    cfg.cache.memory_mb = 256;

    let m = env.mount(BUCKET, &cfg);
    let expected: Vec<String> = files.keys().cloned().collect();
    assert_eq!(walk(&m.path), expected, "the tree lists every file");
    env.emu().reset_stats();
    for (name, bytes) in &files {
        let got = read_file(&m.p(name));
        assert_eq!(got.len(), bytes.len(), "{name} size");
        assert!(sha(&got) == sha(bytes), "{name} content");
        let st = std::fs::metadata(m.p(name)).expect("stat");
        assert_eq!(st.len(), bytes.len() as u64);
    }
    let stats = env.emu().stats();
    let nonempty = files.values().filter(|b| !b.is_empty()).count() as u64;
    assert!(
        stats.read_streams <= nonempty,
        "one pass opened {} streams for {nonempty} non-empty files",
        stats.read_streams
    );
    let total: u64 = files.values().map(|b| b.len() as u64).sum();
    assert!(
        stats.bytes_sent <= total + total / 10,
        "one pass fetched {} bytes for {total}",
        stats.bytes_sent
    );
    m.unmount();

    // A fresh mount has a cold page cache: mmap faults go through FUSE.
    let m = env.mount(BUCKET, &cfg);
    for (name, bytes) in &files {
        assert!(mmap_sha(&m.p(name)) == sha(bytes), "{name} via mmap");
    }
}

/// A fresh mount over one 64 MiB object (plus a few small ones).
fn big_env() -> (Env, Vec<u8>) {
    let env = Env::new(BUCKET);
    let big = data(64, 64 * MIB);
    env.put(BUCKET, "big.bin", &big);
    for i in 0..8 {
        env.put(
            BUCKET,
            &format!("small/{i}"),
            &data(1000 + i, 300 * 1024 + i as usize),
        );
    }
    (env, big)
}

#[test]
fn sequential_read_fetches_the_file_once_and_the_second_pass_is_free() {
    let (env, big) = big_env();
    let m = env.mount(BUCKET, &env.config());
    env.emu().reset_stats();
    assert!(sha(&read_file(&m.p("big.bin"))) == sha(&big));
    let s = env.emu().stats();
    assert_eq!(
        s.bytes_sent,
        big.len() as u64,
        "64 MiB fetched exactly once"
    );
    assert!(s.read_streams <= 1, "{} streams", s.read_streams);

    env.emu().reset_stats();
    assert!(sha(&read_file(&m.p("big.bin"))) == sha(&big));
    assert_eq!(
        env.emu().stats().bytes_sent,
        0,
        "second pass served from the kernel page cache"
    );
}

#[test]
fn random_4k_reads_fetch_at_most_twice_what_they_ask() {
    let (env, big) = big_env();
    let m = env.mount(BUCKET, &env.config());
    let f = std::fs::File::open(m.p("big.bin")).expect("open");
    env.emu().reset_stats();
    let mut rng = rand::rngs::StdRng::seed_from_u64(4096);
    let n = 500u64;
    let mut buf = vec![0u8; 4096];
    for _ in 0..n {
        let off = rng.random_range(0..(big.len() - 4096)) as u64;
        f.read_exact_at(&mut buf, off).expect("pread");
        assert!(
            buf[..] == big[off as usize..off as usize + 4096],
            "bytes at {off}"
        );
    }
    let s = env.emu().stats();
    let asked = n * 4096;
    assert!(
        s.bytes_sent <= 2 * asked,
        "{n} random 4 KiB reads fetched {} bytes (asked {asked})",
        s.bytes_sent
    );
}

#[test]
fn two_thousand_random_preads_match_the_source() {
    let (env, big) = big_env();
    let m = env.mount(BUCKET, &env.config());
    let small: Vec<Vec<u8>> = (0..8)
        .map(|i| data(1000 + i, 300 * 1024 + i as usize))
        .collect();
    let big_f = std::fs::File::open(m.p("big.bin")).expect("open");
    let small_f: Vec<_> = (0..8)
        .map(|i| std::fs::File::open(m.p(&format!("small/{i}"))).expect("open"))
        .collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2000);
    for i in 0..2000 {
        let (f, src) = if i % 4 == 0 {
            let k = rng.random_range(0..8);
            (&small_f[k], &small[k])
        } else {
            (&big_f, &big)
        };
        let off = rng.random_range(0..src.len() + 100);
        let len = rng.random_range(1..=(256 * 1024));
        let mut buf = vec![0u8; len];
        let got = read_fully_at(f, &mut buf, off as u64);
        let want = &src[off.min(src.len())..(off + len).min(src.len())];
        assert_eq!(got, want.len(), "pread {i} length at {off}+{len}");
        assert!(buf[..got] == *want, "pread {i} bytes at {off}+{len}");
    }
}

/// Reads until `buf` is full or the end of the file; returns the bytes read.
fn read_fully_at(f: &std::fs::File, buf: &mut [u8], off: u64) -> usize {
    let mut done = 0;
    while done < buf.len() {
        let n = f
            .read_at(&mut buf[done..], off + done as u64)
            .expect("pread");
        if n == 0 {
            break;
        }
        done += n;
    }
    done
}

#[test]
fn sixteen_threads_read_the_same_and_different_files() {
    let (env, big) = big_env();
    let m = env.mount(BUCKET, &env.config());
    let small: Vec<Vec<u8>> = (0..8)
        .map(|i| data(1000 + i, 300 * 1024 + i as usize))
        .collect();
    std::thread::scope(|s| {
        for t in 0..16usize {
            let (path, want) = if t % 2 == 0 {
                (m.p("big.bin"), &big)
            } else {
                (m.p(&format!("small/{}", t / 2)), &small[t / 2])
            };
            s.spawn(move || {
                for _ in 0..2 {
                    assert!(sha(&read_file(&path)) == sha(want), "thread {t}");
                }
                let f = std::fs::File::open(&path).expect("open");
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut buf = vec![0u8; 64 * 1024];
                for _ in 0..50 {
                    let off = rng.random_range(0..want.len() as u64);
                    let got = read_fully_at(&f, &mut buf, off);
                    let end = (off as usize + got).min(want.len());
                    assert!(buf[..got] == want[off as usize..end], "thread {t} at {off}");
                }
            });
        }
    });
}
