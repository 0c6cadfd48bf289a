//! Parallel listing through a real FUSE mount: a directory past `[fs] parallel_list_threshold`
//! is listed by concurrent ListObjects calls over split key ranges, and the merged listing is
//! complete, ordered, equal to a page-by-page listing, keeps the name rules, and fills the
//! caches so that `ls -l` afterwards costs no call at all.

mod mount_support;

use mount_support::Env;
use rapidfs::config::Config;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

const BUCKET: &str = "plist";
const PAGE: u32 = 50;

/// What a directory should show: name -> Some(size) for files, None for directories.
type Expected = BTreeMap<String, Option<u64>>;

fn cfg(env: &Env, workers: u32) -> Config {
    let mut cfg = env.config();
    cfg.fs.list_page_size = PAGE;
    cfg.fs.parallel_list_threshold = 120;
    cfg.fs.parallel_list_workers = workers;
    cfg
}

/// The entries of `dir` in the order readdir returns them, with sizes of files.
fn listing(dir: &std::path::Path) -> Vec<(String, Option<u64>)> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            let e = e.expect("entry");
            let name = e.file_name().to_string_lossy().into_owned();
            let md = e.metadata().expect("stat");
            (name, (!md.is_dir()).then(|| md.size()))
        })
        .collect()
}

/// Fills directory `dir` with `n` files named by `name(i)`, a subdirectory every 97 files
/// (spread through the key space, each with two objects so its prefix recurs) and names POSIX
/// cannot show.
fn fill(env: &Env, dir: &str, n: usize, name: impl Fn(usize) -> String) -> Expected {
    let mut want = Expected::new();
    for i in 0..n {
        let leaf = name(i);
        let size = (i % 300) as u64;
        env.put(BUCKET, &format!("{dir}/{leaf}"), &vec![b'x'; size as usize]);
        want.insert(leaf.clone(), Some(size));
        if i % 97 == 0 {
            let sub = format!("{leaf}.d");
            for inner in ["a", "b/c"] {
                env.put(BUCKET, &format!("{dir}/{sub}/{inner}"), b"in");
            }
            want.insert(sub, None);
        }
    }
    // Names POSIX cannot show stay hidden.
    env.put(BUCKET, &format!("{dir}//empty-component"), b"odd");
    env.put(BUCKET, &format!("{dir}/{}", "n".repeat(256)), b"too long");
    want
}

fn check_parallel_listing(dir: &str, n: usize, name: impl Fn(usize) -> String) {
    let env = Env::new(BUCKET);
    let want = fill(&env, dir, n, name);
    let want_vec: Vec<_> = want.clone().into_iter().collect();

    let sequential = env.mount(BUCKET, &cfg(&env, 1));
    // Looking the directory itself up costs a call or two; only its listing is counted.
    assert!(sequential.p(dir).is_dir());
    env.emu().reset_stats();
    let seq = listing(&sequential.p(dir));
    let seq_calls = env.emu().stats().list_calls;
    sequential.unmount();
    assert_eq!(seq, want_vec, "page-by-page listing of {dir}");

    let m = env.mount(BUCKET, &cfg(&env, 8));
    assert!(m.p(dir).is_dir());
    env.emu().reset_stats();
    let got = listing(&m.p(dir));
    let s = env.emu().stats();
    eprintln!(
        "{dir}: {} entries, {} list calls in parallel, {seq_calls} page by page",
        got.len(),
        s.list_calls
    );
    assert_eq!(got.len(), want_vec.len(), "entries of {dir}");
    assert_eq!(
        got, seq,
        "parallel listing of {dir} equals the page-by-page one"
    );
    let pages = (want_vec.len() as u64).div_ceil(u64::from(PAGE));
    assert!(
        s.list_calls > pages && s.list_calls >= 8,
        "{dir}: the parallel listing made {} list calls for {pages} pages \
         (page by page: {seq_calls}): it did not split the range",
        s.list_calls
    );
    assert!(
        s.list_calls < 3 * seq_calls,
        "{dir}: {} list calls against {seq_calls} page by page: splitting wastes calls",
        s.list_calls
    );
    assert_eq!(s.get_object_calls, 0, "{dir}: listing fetched objects");

    // `ls -l` now: every lookup and stat comes from the caches the listing filled.
    env.emu().reset_stats();
    let out = Command::new("ls")
        .arg("-l")
        .arg(m.p(dir))
        .output()
        .expect("run ls");
    assert!(out.status.success(), "ls -l: {:?}", out);
    let lines = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(
        lines,
        want.len() + 1,
        "ls -l prints a total and every entry"
    );
    let s = env.emu().stats();
    assert_eq!(
        (s.get_object_calls, s.list_calls),
        (0, 0),
        "ls -l after the listing went to the service"
    );
    // Subdirectories found by the listing are real directories with their own entries.
    let sub = format!("{}.d", (name_of_first(&want)));
    assert_eq!(
        listing(&m.p(&format!("{dir}/{sub}"))),
        vec![("a".to_string(), Some(2)), ("b".to_string(), None)]
    );
}

fn name_of_first(want: &Expected) -> String {
    want.iter()
        .find(|(_, v)| v.is_none())
        .and_then(|(k, _)| k.strip_suffix(".d"))
        .expect("a subdirectory")
        .to_string()
}

#[test]
fn evenly_spread_names_list_in_parallel_completely_and_in_order() {
    // Hash-like names spread over the whole key space.
    check_parallel_listing("spread", 3000, |i| {
        let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!("{h:016x}.jpg")
    });
}

#[test]
fn names_sharing_a_long_prefix_list_in_parallel_completely_and_in_order() {
    let prefix = "imagenet_train_shard_with_a_rather_long_common_prefix_".repeat(3);
    check_parallel_listing("shared", 3000, move |i| format!("{prefix}{i:06}.jpg"));
}

#[test]
fn lookups_by_path_list_a_small_directory_once() {
    let env = Env::new(BUCKET);
    for i in 0..200 {
        env.put(BUCKET, &format!("train/c1/{i:04}.jpg"), &vec![b'j'; i + 1]);
    }
    env.put(BUCKET, "train/c1/sub/inner", b"x");
    let m = env.mount(BUCKET, &env.config());
    env.emu().reset_stats();
    for i in (0..200).rev() {
        let md = std::fs::metadata(m.p(&format!("train/c1/{i:04}.jpg"))).expect("stat");
        assert_eq!(md.len(), (i + 1) as u64);
    }
    assert!(std::fs::metadata(m.p("train/c1/sub"))
        .expect("stat")
        .is_dir());
    assert!(std::fs::metadata(m.p("train/c1/missing.jpg")).is_err());
    let s = env.emu().stats();
    // The first lookup in each of the root and `train` lists it (beside one GetObject), as
    // does the first in `train/c1` (its 201 entries fit one page); the other lookups are
    // answered from those listings.
    assert!(
        s.list_calls <= 3 && s.get_object_calls <= 3,
        "201 lookups by path took {} list and {} get calls",
        s.list_calls,
        s.get_object_calls
    );
    // A directory larger than one page is still looked up name by name, one ListObjects
    // call a name (it finds the object and a folder of that name together), no GetObject.
    let m2 = env.mount(BUCKET, &cfg(&env, 8));
    env.emu().reset_stats();
    for i in 0..10 {
        assert!(m2.p(&format!("train/c1/{i:04}.jpg")).is_file());
    }
    assert!(m2.p("train/c1/sub").is_dir());
    let s = env.emu().stats();
    assert!(
        (11..=15).contains(&s.list_calls) && s.get_object_calls == 0,
        "with 50-entry pages train/c1 is large: 11 lookups took {} list and {} get calls",
        s.list_calls,
        s.get_object_calls
    );
}

/// A listing taken by a lookup answers for the names it holds for the listing TTL, but for a
/// name it lacks only as long as a negative entry would: an object created elsewhere after
/// the listing shows up once the negative TTL has passed, not the listing TTL.
#[test]
fn a_listing_hides_a_new_object_no_longer_than_the_negative_ttl() {
    let env = Env::new(BUCKET);
    env.put(BUCKET, "fresh/a", b"a");
    let mut cfg = env.config();
    cfg.fs.negative_ttl_ms = 300;
    cfg.fs.list_ttl_ms = 600_000;
    cfg.fs.kernel_entry_ttl_ms = 0;
    cfg.fs.kernel_attr_ttl_ms = 0;
    let m = env.mount(BUCKET, &cfg);
    assert!(m.p("fresh/a").is_file());
    assert!(!m.p("fresh/b").exists(), "not created yet");
    env.put(BUCKET, "fresh/b", b"bb");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let md = std::fs::metadata(m.p("fresh/b"))
        .expect("created elsewhere, visible after the negative TTL");
    assert_eq!(md.len(), 2);
    assert!(m.p("fresh/a").is_file());
}
