//! Directory listings: one directory's entries from paged `ListObjects` with delimiter `/`,
//! merged under the name rules (a directory wins over a same-named object, names POSIX cannot
//! show are hidden), objects their metadata marks as symbolic links listed as links, sorted
//! by name so lookups can search them. A directory found large while
//! listing page by page is listed the rest of the way in parallel (`list_parallel`).

use super::inode::{Kind, ObjMeta};
use super::list_parallel::{self, list_request, ParallelOptions};
use super::listing::Listing;
use super::names::is_visible;
use crate::config::FsConfig;
use crate::gcs::{self, Client, ListPage};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// The service's largest page.
const MAX_PAGE_SIZE: u32 = 1000;

/// How directories are listed (from `[fs]`).
#[derive(Debug, Clone, Copy)]
pub struct ListOptions {
    /// Entries per page.
    pub page_size: i32,
    /// Entries listed page by page before the rest goes parallel.
    pub parallel_threshold: u64,
    /// Concurrent calls of a parallel listing; 1 never goes parallel.
    pub workers: usize,
}

impl ListOptions {
    /// The options `[fs]` sets, within what the service allows.
    pub fn from_config(fs: &FsConfig) -> ListOptions {
        ListOptions {
            page_size: fs.list_page_size.clamp(1, MAX_PAGE_SIZE) as i32,
            parallel_threshold: fs.parallel_list_threshold,
            workers: fs.parallel_list_workers.max(1) as usize,
        }
    }
}

/// One visible entry of a directory, as listing pages give it and edits bring it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedEntry {
    /// The name inside the directory.
    pub name: String,
    /// File, directory or symbolic link.
    pub kind: Kind,
    /// The object's metadata, for files and links.
    pub meta: Option<ObjMeta>,
    /// A link's target, when its object's metadata gives it.
    pub target: Option<Arc<str>>,
}

/// Remembers which shadowed objects were already warned about, so each gets one warning.
#[derive(Debug, Default)]
pub struct ShadowWarnings(Mutex<HashSet<String>>);

impl ShadowWarnings {
    /// Logs, once per key, that object `key` is hidden by the directory `key/`.
    pub fn warn(&self, key: &str) {
        let first = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string());
        if first {
            tracing::warn!(
                object = key,
                "object hidden: a directory of the same name exists and wins"
            );
        }
    }
}

/// Lists directory `prefix` completely: page by page while it looks small, then, past
/// `opts.parallel_threshold` entries, the rest with `opts.workers` concurrent calls.
pub async fn list_dir(
    client: &Client,
    bucket: &str,
    prefix: &str,
    warnings: &ShadowWarnings,
    opts: ListOptions,
) -> gcs::Result<Listing> {
    let mut pages = Vec::new();
    let mut req = list_request(prefix, opts.page_size);
    let mut seen = 0u64;
    loop {
        let page = client.list_page(bucket, &req).await?;
        seen += (page.objects.len() + page.prefixes.len()) as u64;
        let token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            break;
        }
        if opts.workers > 1 && seen > opts.parallel_threshold {
            let start = pages
                .iter()
                .rev()
                .find_map(|p| {
                    let o = p.objects.last().map(|o| o.name.as_str());
                    o.max(p.prefixes.last().map(String::as_str))
                })
                .map(list_parallel::resume_after);
            if let Some(start) = start {
                let names = pages.iter().flat_map(|p| {
                    let objects = p.objects.iter().map(|o| o.name.as_str());
                    objects.chain(p.prefixes.iter().map(String::as_str))
                });
                let alphabet = list_parallel::alphabet_of(prefix, names);
                let parallel = ParallelOptions {
                    workers: opts.workers,
                    page_size: opts.page_size,
                };
                let dir = prefix.to_string();
                let mut runs = list_parallel::list_from(
                    client,
                    bucket,
                    prefix,
                    start,
                    alphabet,
                    parallel,
                    move |page| page_entries(&dir, page),
                )
                .await?;
                runs.extend(pages.into_iter().map(|p| page_entries(prefix, p)));
                return Ok(merge_runs(prefix, runs, warnings));
            }
        }
        req.page_token = token;
    }
    Ok(merge(prefix, pages, warnings))
}

/// Merges listing pages of directory `prefix` (in any order, entries possibly repeated, as
/// a parallel listing returns them) into its visible entries.
pub fn merge(prefix: &str, pages: Vec<ListPage>, warnings: &ShadowWarnings) -> Listing {
    let runs = pages.into_iter().map(|p| page_entries(prefix, p)).collect();
    merge_runs(prefix, runs, warnings)
}

/// The visible entries of one page of directory `prefix`, sorted (see `entry_order`). Names
/// are trimmed in place.
pub fn page_entries(prefix: &str, page: ListPage) -> Vec<ListedEntry> {
    let below = |mut name: String| {
        name.starts_with(prefix).then(|| {
            name.drain(..prefix.len());
            name
        })
    };
    let mut entries = Vec::with_capacity(page.objects.len() + page.prefixes.len());
    for p in page.prefixes {
        let Some(mut name) = below(p).filter(|n| n.ends_with('/')) else {
            continue;
        };
        name.pop();
        if is_visible(&name) {
            entries.push(ListedEntry {
                name,
                kind: Kind::Dir,
                meta: None,
                target: None,
            });
        }
    }
    for mut o in page.objects {
        let meta = ObjMeta::from(&o);
        let (kind, target) = Kind::of_object(&o);
        // The directory's own marker object (`prefix` itself) is not an entry.
        let Some(name) = below(std::mem::take(&mut o.name)).filter(|n| is_visible(n)) else {
            continue;
        };
        entries.push(ListedEntry {
            name,
            kind,
            meta: Some(meta),
            target,
        });
    }
    entries.sort_by(entry_order);
    entries
}

/// By name; a directory before a file or link of the same name, so that it wins in
/// `merge_runs`.
fn entry_order(a: &ListedEntry, b: &ListedEntry) -> std::cmp::Ordering {
    a.name
        .cmp(&b.name)
        .then_with(|| (a.kind != Kind::Dir).cmp(&(b.kind != Kind::Dir)))
}

/// Merges the sorted runs of entries of directory `prefix` (`page_entries` of its pages, in
/// any order, entries possibly repeated across runs) into its listing. Runs of disjoint key
/// ranges put in order of their first names are already in order, so the usual cost is one
/// pass that checks it and one that drops repeats: a large directory's merge is a serial
/// step after all its listing calls.
pub fn merge_runs(
    prefix: &str,
    mut runs: Vec<Vec<ListedEntry>>,
    warnings: &ShadowWarnings,
) -> Listing {
    runs.retain(|r| !r.is_empty());
    runs.sort_by(|a, b| entry_order(&a[0], &b[0]));
    let mut entries = Vec::with_capacity(runs.iter().map(Vec::len).sum());
    for run in runs {
        entries.extend(run);
    }
    if !entries.is_sorted_by(|a, b| entry_order(a, b).is_le()) {
        entries.sort_by(entry_order);
    }
    entries.dedup_by(|later, kept| {
        if later.name != kept.name {
            return false;
        }
        if kept.kind == Kind::Dir && later.kind != Kind::Dir {
            warnings.warn(&format!("{prefix}{}", later.name));
        }
        true
    });
    Listing::new(entries, std::time::Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gcs::ObjectMeta;
    use std::time::SystemTime;

    fn obj(name: &str, size: u64) -> ObjectMeta {
        ObjectMeta {
            name: name.to_string(),
            generation: 7,
            metageneration: 1,
            size,
            finalized: true,
            crc32c: None,
            create_time: SystemTime::UNIX_EPOCH,
            update_time: SystemTime::UNIX_EPOCH,
            symlink: None,
            mtime: None,
        }
    }

    #[test]
    fn directories_win_and_odd_names_hide() {
        let pages = vec![
            ListPage {
                objects: vec![obj("d/", 0), obj("d/a", 1), obj("d/sub", 2)],
                prefixes: vec!["d/sub/".into(), "d//".into(), "d/../".into()],
                next_page_token: "t".into(),
            },
            ListPage {
                objects: vec![obj("d/z", 3), obj(&format!("d/{}", "x".repeat(256)), 1)],
                prefixes: vec!["d/implicit/".into()],
                next_page_token: String::new(),
            },
        ];
        let w = ShadowWarnings::default();
        let l = merge("d/", pages, &w);
        let names: Vec<_> = l.iter().map(|e| e.name).collect();
        assert_eq!(names, ["a", "implicit", "sub", "z"]);
        assert_eq!(l.find("sub").map(|e| e.kind), Some(Kind::Dir));
        assert_eq!(l.find("a").and_then(|e| e.meta).map(|m| m.size), Some(1));
        assert!(l.find("nope").is_none());
        assert!(w.0.lock().unwrap().contains("d/sub"));
    }

    #[test]
    fn marked_objects_list_as_links_with_what_their_metadata_says() {
        let legacy = ObjectMeta {
            symlink: Some(crate::gcs::Symlink::Target("../t".into())),
            ..obj("d/old", 0)
        };
        let standard = ObjectMeta {
            symlink: Some(crate::gcs::Symlink::InContent),
            ..obj("d/new", 4)
        };
        let page = ListPage {
            objects: vec![legacy, standard, obj("d/plain", 1)],
            prefixes: vec![],
            next_page_token: String::new(),
        };
        let l = merge("d/", vec![page], &ShadowWarnings::default());
        let old = l.find("old").expect("old");
        assert_eq!(
            (old.kind, old.target.map(|t| &**t)),
            (Kind::Symlink, Some("../t"))
        );
        let new = l.find("new").expect("new");
        assert_eq!((new.kind, new.target), (Kind::Symlink, None));
        assert_eq!(l.find("plain").map(|e| e.kind), Some(Kind::File));
    }

    #[test]
    fn pages_in_any_order_with_repeats_merge_once_in_order() {
        let page = |objects: Vec<ObjectMeta>, prefixes: Vec<&str>| ListPage {
            objects,
            prefixes: prefixes.into_iter().map(String::from).collect(),
            next_page_token: String::new(),
        };
        // As two ranges cut inside `d/s/` return them: the prefix on both sides of the cut,
        // the object a resumed request starts from twice, the later range first.
        let pages = vec![
            page(vec![obj("d/m", 5), obj("d/z", 6)], vec!["d/s/"]),
            page(vec![obj("d/a", 1), obj("d/m", 5)], vec!["d/k/", "d/s/"]),
        ];
        let l = merge("d/", pages, &ShadowWarnings::default());
        let names: Vec<_> = l.iter().map(|e| e.name).collect();
        assert_eq!(names, ["a", "k", "m", "s", "z"]);
        assert_eq!(l.find("s").map(|e| e.kind), Some(Kind::Dir));
    }
}
