//! Parallel listing of one large directory, as Dataflux does it: the key range still to list
//! is cut into pieces listed by concurrent `ListObjects` calls (`lexicographic_start` /
//! `lexicographic_end`), and a worker that runs out of work steals half of the largest range
//! left, cut at a key midway between that range's current position and its end.
//!
//! Midpoints are computed on the characters after the two keys' common prefix, as digits in
//! the alphabet of the names seen so far, so names that all share one long prefix split as
//! evenly as names spread over the whole key space. The open end of the first range is first
//! narrowed with a few one-entry probes (which prefix of the last key seen do all the names
//! left share?), since a midpoint towards "anything" would land past every real name.
//!
//! Hands each page, as it arrives, to the caller's conversion (on the worker that listed it,
//! so converting overlaps with the other workers' calls) and returns the converted pages in
//! no particular order, a prefix possibly on both sides of a cut; `dir::merge_runs` orders
//! and deduplicates them. Touches only `gcs::Client` listing calls.

use crate::gcs::{self, Client, ListPage, ListRequest};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

/// The request listing directory `prefix` (empty or ending in `/`), one page at a time.
pub fn list_request(prefix: &str, page_size: i32) -> ListRequest {
    ListRequest {
        prefix: prefix.to_string(),
        delimiter: Some("/".to_string()),
        page_size,
        include_folders_as_prefixes: true,
        ..Default::default()
    }
}

/// How a parallel listing runs.
#[derive(Debug, Clone, Copy)]
pub struct ParallelOptions {
    /// Concurrent ListObjects calls (at least 2 to be worth it).
    pub workers: usize,
    /// Entries per page.
    pub page_size: i32,
}

/// One piece of the key space: names in `[cur, end)` are still to be listed.
#[derive(Debug, Clone)]
struct Range {
    /// Next name to list from (inclusive).
    cur: String,
    /// Exclusive end; `None` = the end of the directory.
    end: Option<String>,
    /// The owner listed the whole range.
    done: bool,
    /// The owner's last page came back full since the range was last split: only such a
    /// range is worth splitting (so an idle worker never splits what is nearly empty, and
    /// every split is paid for by a page of names).
    dense: bool,
}

struct State {
    ranges: Vec<Range>,
}
/// What every worker shares.
struct Shared {
    client: Client,
    bucket: String,
    prefix: String,
    page_size: i32,
    alphabet: Vec<char>,
    state: Mutex<State>,
    /// Woken whenever a range gets a page or finishes, for workers waiting to steal.
    changed: tokio::sync::Notify,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another worker panicked mid-update of plain data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn request(&self, start: &str, end: Option<&str>, page_size: i32) -> ListRequest {
        let mut req = list_request(&self.prefix, page_size);
        req.lexicographic_start = start.to_string();
        req.lexicographic_end = end.unwrap_or_default().to_string();
        req
    }
}

/// The last key a page covers (object name or prefix), if it holds anything.
fn last_key(page: &ListPage) -> Option<&str> {
    let o = page.objects.last().map(|o| o.name.as_str());
    let p = page.prefixes.last().map(String::as_str);
    o.max(p)
}

/// Where listing resumes after `key`: after a prefix `d/`, past everything under it
/// (`d0`, as `0` follows `/`); after an object, at the object itself (it comes again and
/// the merge drops the copy: the exact successor of a name has no valid spelling).
pub fn resume_after(key: &str) -> String {
    match key.strip_suffix('/') {
        Some(dir) => format!("{dir}0"),
        None => key.to_string(),
    }
}

/// The characters of `names` after `prefix`: the digits midpoints are spelled in.
pub fn alphabet_of<'a>(prefix: &str, names: impl IntoIterator<Item = &'a str>) -> Vec<char> {
    let mut set = BTreeSet::new();
    for n in names {
        set.extend(n.strip_prefix(prefix).unwrap_or(n).chars());
    }
    set.into_iter().collect()
}

/// The smallest char greater than `c`, skipping surrogates.
fn next_char(c: char) -> Option<char> {
    let mut n = c as u32 + 1;
    if (0xD800..0xE000).contains(&n) {
        n = 0xE000;
    }
    char::from_u32(n)
}

/// Length in bytes of the common prefix of `a` and `b`, on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

/// A key strictly between `cur` and `end` (`None` = the end of directory `dir`), about
/// midway when both are read as numbers whose digits are the characters after their common
/// prefix, in `alphabet` (extended with the characters of the two keys); `None` when no such
/// key is found (the range is too narrow to split).
pub fn split_key(dir: &str, cur: &str, end: Option<&str>, alphabet: &[char]) -> Option<String> {
    let in_dir = if cur.starts_with(dir) { dir.len() } else { 0 };
    let common = end.map_or(in_dir, |e| common_prefix(cur, e).max(in_dir));
    let a: Vec<char> = cur[common..].chars().collect();
    let b: Option<Vec<char>> = end.map(|e| e[common..].chars().collect());
    let mut digits: BTreeSet<char> = alphabet.iter().copied().collect();
    digits.extend(a.iter().copied());
    digits.extend(b.iter().flatten().copied());
    if digits.len() < 2 {
        let first = digits.first().copied().unwrap_or('0');
        digits.extend(next_char(first));
    }
    let digits: Vec<char> = digits.into_iter().collect();
    let base = digits.len() as u64;
    let index = |c: &char| digits.binary_search(c).unwrap_or(0) as u64;
    // Two more digits than the longer key, so even adjacent keys have a midpoint.
    let k = a.len().max(b.as_ref().map_or(0, Vec::len)) + 2;
    // Numbers of k + 1 digits, most significant first; the extra leading digit holds the
    // unbounded end (base^k) and the carry of the sum.
    let as_number = |s: &[char]| {
        let mut n = vec![0u64; k + 1];
        for (i, c) in s.iter().enumerate() {
            n[i + 1] = index(c);
        }
        n
    };
    let x = as_number(&a);
    let y = match &b {
        Some(b) => as_number(b),
        None => {
            let mut n = vec![0u64; k + 1];
            n[0] = 1;
            n
        }
    };
    let mut sum = vec![0u64; k + 1];
    let mut carry = 0;
    for i in (0..=k).rev() {
        let s = x[i] + y[i] + carry;
        sum[i] = s % base;
        carry = s / base;
    }
    sum[0] += carry * base;
    let mut rem = 0;
    let mut half = vec![0u64; k + 1];
    for i in 0..=k {
        let v = rem * base + sum[i];
        half[i] = v / 2;
        rem = v % 2;
    }
    let mut mid: Vec<char> = half[1..].iter().map(|&d| digits[d as usize]).collect();
    while mid.len() > 1 && mid.last() == Some(&digits[0]) {
        mid.pop();
    }
    let key = format!("{}{}", &cur[..common], mid.into_iter().collect::<String>());
    let below_end = end.is_none_or(|e| key.as_str() < e);
    (key.as_str() > cur && below_end).then_some(key)
}

/// How much of the key space a range spans, for picking the largest: ranges whose keys part
/// earlier are larger; among those, the wider difference of their next few digits (the end of
/// directory `dir` counting as the top of the alphabet).
fn span(dir: &str, r: &Range, alphabet: &[char]) -> (std::cmp::Reverse<usize>, f64) {
    let in_dir = if r.cur.starts_with(dir) { dir.len() } else { 0 };
    let common = r
        .end
        .as_ref()
        .map_or(in_dir, |e| common_prefix(&r.cur, e).max(in_dir));
    let value = |s: &str| {
        let base = alphabet.len().max(2) as f64;
        let mut v = 0.0;
        let mut scale = 1.0;
        for c in s[common..].chars().take(8) {
            scale /= base;
            v += alphabet.partition_point(|x| *x < c) as f64 * scale;
        }
        v
    };
    let end = r.end.as_deref().map_or(1.0, value);
    let chars = r.cur[..common].chars().count();
    (std::cmp::Reverse(chars), end - value(&r.cur))
}

/// Lists directory `prefix` from `start` (inclusive) to its end with `opts.workers`
/// concurrent workers; `alphabet` spells the split keys (the characters of the names seen).
/// Every page is passed through `convert` as soon as it arrives.
pub async fn list_from<T, F>(
    client: &Client,
    bucket: &str,
    prefix: &str,
    start: String,
    alphabet: Vec<char>,
    opts: ParallelOptions,
    convert: F,
) -> gcs::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(ListPage) -> T + Send + Sync + 'static,
{
    let workers = opts.workers.max(1);
    let shared = Shared {
        client: client.clone(),
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
        // A page must hold more than the one entry a resumed request repeats.
        page_size: opts.page_size.max(2),
        alphabet,
        state: Mutex::new(State { ranges: Vec::new() }),
        changed: tokio::sync::Notify::new(),
    };
    let end = narrow_open_end(&shared, &start, workers).await?;
    shared.state().ranges = initial_ranges(&shared, start, end, workers);
    let shared = Arc::new(shared);
    let owned = shared.state().ranges.len();
    let convert = Arc::new(convert);
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..workers {
        let (shared, convert) = (shared.clone(), convert.clone());
        tasks.spawn(async move { worker(&shared, (w < owned).then_some(w), &*convert).await });
    }
    let mut pages = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(mut p)) => pages.append(&mut p),
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(gcs::Error::Other(format!("listing worker failed: {e}"))),
        }
    }
    Ok(pages)
}

/// The tightest end for the open range after `start`: the successor of the longest prefix of
/// `start` (beyond the directory) that every name left shares, found by searching the
/// candidate prefixes `workers` at a time with one-entry probes; `None` when names beyond
/// the directory's first character of `start` remain.
async fn narrow_open_end(
    shared: &Shared,
    start: &str,
    workers: usize,
) -> gcs::Result<Option<String>> {
    // Candidate j ends the names that share start's first j + 1 characters after the
    // directory: more names lie beyond a shorter prefix's end, so "nothing at or after
    // candidate j" is true for j up to some J and false after it.
    let base = shared.prefix.len().min(start.len());
    let candidates: Vec<String> = start[base..]
        .char_indices()
        .filter_map(|(i, c)| next_char(c).map(|n| format!("{}{n}", &start[..base + i])))
        .collect();
    let (mut lo, mut hi) = (0usize, candidates.len());
    let mut found = None;
    // Invariant: every candidate below lo is known empty (or lo = 0); hi and above non-empty.
    while lo < hi {
        let n = (hi - lo).min(workers.max(1));
        let picks: Vec<usize> = (1..=n).map(|i| lo + (hi - lo) * i / (n + 1)).collect();
        let probes = picks.iter().map(|&j| {
            let req = shared.request(&candidates[j], None, 1);
            async move {
                let page = shared.client.list_page(&shared.bucket, &req).await?;
                gcs::Result::Ok(page.objects.is_empty() && page.prefixes.is_empty())
            }
        });
        let empty = futures::future::try_join_all(probes).await?;
        let mut next_lo = lo;
        let mut next_hi = hi;
        for (&j, &e) in picks.iter().zip(&empty) {
            if e {
                found = Some(j).max(found);
                next_lo = next_lo.max(j + 1);
            } else {
                next_hi = next_hi.min(j);
            }
        }
        if (next_lo, next_hi) == (lo, hi) {
            break;
        }
        (lo, hi) = (next_lo, next_hi);
    }
    Ok(found.map(|j| candidates[j].clone()))
}

/// `[start, end)` cut into up to `n` pieces by splitting the largest piece again and again.
fn initial_ranges(shared: &Shared, start: String, end: Option<String>, n: usize) -> Vec<Range> {
    let mut ranges = vec![Range {
        cur: start,
        end,
        done: false,
        dense: true,
    }];
    while ranges.len() < n && split_largest(shared, &mut ranges).is_some() {
        // Nothing is listed yet: every piece may be split again.
        for r in &mut ranges {
            r.dense = true;
        }
    }
    for r in &mut ranges {
        r.dense = false;
    }
    ranges
}

/// One worker: lists its range page by page, then steals from the largest dense range left,
/// waiting while none is dense, until every range is listed.
async fn worker<T>(
    shared: &Shared,
    mut own: Option<usize>,
    convert: &(dyn Fn(ListPage) -> T + Sync),
) -> gcs::Result<Vec<T>> {
    let mut pages = Vec::new();
    loop {
        let r = match own.take() {
            Some(r) => r,
            None => {
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                // Registered before looking, so a change in between still wakes us.
                changed.as_mut().enable();
                let stolen = {
                    let mut st = shared.state();
                    if st.ranges.iter().all(|r| r.done) {
                        return Ok(pages);
                    }
                    split_largest(shared, &mut st.ranges)
                };
                match stolen {
                    Some(r) => r,
                    None => {
                        changed.await;
                        continue;
                    }
                }
            }
        };
        let listed = list_range(shared, r, &mut pages, convert).await;
        shared.changed.notify_waiters();
        listed?;
    }
}

/// Lists range `r` to its (possibly shrinking) end.
async fn list_range<T>(
    shared: &Shared,
    r: usize,
    pages: &mut Vec<T>,
    convert: &(dyn Fn(ListPage) -> T + Sync),
) -> gcs::Result<()> {
    loop {
        let (cur, end) = {
            let st = shared.state();
            (st.ranges[r].cur.clone(), st.ranges[r].end.clone())
        };
        let req = shared.request(&cur, end.as_deref(), shared.page_size);
        let mut page = shared.client.list_page(&shared.bucket, &req).await?;
        let mut st = shared.state();
        let range = &mut st.ranges[r];
        // A thief may have taken the upper part meanwhile: keep only what is still ours.
        let mut cut = false;
        if let Some(end) = &range.end {
            let before = page.objects.len() + page.prefixes.len();
            page.objects.retain(|o| o.name.as_str() < end.as_str());
            page.prefixes.retain(|p| p.as_str() < end.as_str());
            cut = page.objects.len() + page.prefixes.len() < before;
        }
        let next = last_key(&page).map(resume_after);
        let finished = cut
            || page.next_page_token.is_empty()
            || next.as_ref().is_none_or(|n| *n <= range.cur)
            || matches!((&next, &range.end), (Some(n), Some(e)) if n >= e);
        if let Some(n) = next {
            range.cur = n;
        }
        range.done = finished;
        range.dense = !finished;
        drop(st);
        shared.changed.notify_waiters();
        pages.push(convert(page));
        if finished {
            return Ok(());
        }
    }
}

/// Splits the largest dense unfinished range of `ranges` at its midpoint, appends the upper
/// part (neither part dense until its next full page) and returns its index; `None` when no
/// range can be split now.
fn split_largest(shared: &Shared, ranges: &mut Vec<Range>) -> Option<usize> {
    let mut candidates: Vec<usize> = (0..ranges.len())
        .filter(|&i| !ranges[i].done && ranges[i].dense)
        .collect();
    candidates.sort_by(|&a, &b| {
        let (sa, sb) = (
            span(&shared.prefix, &ranges[a], &shared.alphabet),
            span(&shared.prefix, &ranges[b], &shared.alphabet),
        );
        sb.partial_cmp(&sa).unwrap_or(std::cmp::Ordering::Equal)
    });
    for i in candidates {
        let victim = &ranges[i];
        let Some(mid) = split_key(
            &shared.prefix,
            &victim.cur,
            victim.end.as_deref(),
            &shared.alphabet,
        ) else {
            continue;
        };
        let end = ranges[i].end.replace(mid.clone());
        ranges[i].dense = false;
        ranges.push(Range {
            cur: mid,
            end,
            done: false,
            dense: false,
        });
        return Some(ranges.len() - 1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digits() -> Vec<char> {
        ('0'..='9').collect()
    }

    #[test]
    fn evenly_spread_names_split_in_the_middle() {
        let mid = split_key("d/", "d/0000", Some("d/9999"), &digits()).unwrap();
        assert!(mid.as_str() > "d/4" && mid.as_str() < "d/5", "{mid}");
        let mid = split_key("d/", "d/1000", Some("d/2000"), &digits()).unwrap();
        assert!(mid.as_str() > "d/14" && mid.as_str() < "d/16", "{mid}");
    }

    #[test]
    fn a_long_shared_prefix_splits_after_it() {
        let p = format!("data/{}", "shared_prefix_of_many_bytes_".repeat(8));
        let seen: Vec<String> = (0..1000).map(|i| format!("{p}000{i:03}")).collect();
        let alphabet = alphabet_of("data/", seen.iter().map(String::as_str));
        let cur = format!("{p}000123");
        let end = format!("{p}999999");
        let mid = split_key("data/", &cur, Some(&end), &alphabet).unwrap();
        assert!(mid.starts_with(&p), "{mid}");
        let tail = &mid[p.len()..];
        assert!(tail > "3" && tail < "6", "midway after the prefix: {tail}");
    }

    #[test]
    fn an_open_end_splits_midway_through_the_alphabet() {
        let hex: Vec<char> = "0123456789abcdef".chars().collect();
        let mid = split_key("d/", "d/00af", None, &hex).unwrap();
        assert!(mid.as_str() > "d/7" && mid.as_str() < "d/9", "{mid}");
    }

    #[test]
    fn keys_are_strictly_inside_and_narrow_ranges_still_split() {
        let a = digits();
        for (cur, end) in [("a1", "a2"), ("a", "a1"), ("x/y", "x/y1"), ("k9", "l")] {
            let mid = split_key("", cur, Some(end), &a).unwrap_or_else(|| panic!("{cur}..{end}"));
            assert!(
                cur < mid.as_str() && mid.as_str() < end,
                "{cur} < {mid} < {end}"
            );
        }
        assert_eq!(split_key("", "a", Some("a"), &a), None);
        assert_eq!(split_key("", "b", Some("a"), &a), None);
    }

    #[test]
    fn non_ascii_names_split_into_valid_keys() {
        let mid = split_key("d/", "d/é", Some("d/日本"), &[]).unwrap();
        assert!("d/é" < mid.as_str() && mid.as_str() < "d/日本", "{mid}");
    }

    #[test]
    fn resuming_skips_a_listed_prefix_and_repeats_an_object() {
        assert_eq!(resume_after("d/sub/"), "d/sub0");
        assert_eq!(resume_after("d/file"), "d/file");
    }

    #[test]
    fn the_largest_span_is_the_earliest_parting() {
        let a = digits();
        let r = |cur: &str, end: &str| Range {
            cur: cur.into(),
            end: Some(end.into()),
            done: false,
            dense: true,
        };
        let span = |r: &Range| span("d/", r, &a);
        assert!(span(&r("d/1", "d/9")) > span(&r("d/11", "d/19")));
        assert!(span(&r("d/1", "d/9")) > span(&r("d/1", "d/2")));
        let open = |cur: &str| Range {
            cur: cur.into(),
            end: None,
            done: false,
            dense: true,
        };
        // The end of the directory is the top of the alphabet, not infinitely far.
        assert!(span(&open("d/1")) > span(&r("d/5", "d/9")));
        assert!(span(&open("d/5")) < span(&r("d/0", "d/9")));
    }
}
