//! Directory listings: one directory's entries from paged `ListObjects` with delimiter `/`,
//! merged under the name rules (a directory wins over a same-named object, names POSIX cannot
//! show are hidden), sorted by name so lookups can search them.

use super::inode::{Kind, ObjMeta};
use super::names::is_visible;
use crate::gcs::{self, Client, ListPage, ListRequest};
use futures::StreamExt;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

/// Objects per ListObjects page (the service's largest page).
const PAGE_SIZE: i32 = 1000;

/// One visible entry of a directory.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedEntry {
    /// The name inside the directory.
    pub name: String,
    /// File or directory.
    pub kind: Kind,
    /// The object's metadata, for files.
    pub meta: Option<ObjMeta>,
}

/// A directory's visible entries, sorted by name.
#[derive(Debug, Default, PartialEq)]
pub struct Listing {
    /// The entries, sorted by name (byte order), names unique.
    pub entries: Vec<ListedEntry>,
}

impl Listing {
    /// The entry called `name`, if the directory holds one.
    pub fn find(&self, name: &str) -> Option<&ListedEntry> {
        self.entries
            .binary_search_by(|e| e.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i])
    }
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

/// Lists directory `prefix` completely.
pub async fn list_dir(
    client: &Client,
    bucket: &str,
    prefix: &str,
    warnings: &ShadowWarnings,
) -> gcs::Result<Listing> {
    let mut pages = Vec::new();
    let mut stream = Box::pin(client.list(bucket, list_request(prefix, PAGE_SIZE)));
    while let Some(page) = stream.next().await {
        pages.push(page?);
    }
    Ok(merge(prefix, &pages, warnings))
}

/// Merges listing pages of directory `prefix` into its visible entries.
pub fn merge(prefix: &str, pages: &[ListPage], warnings: &ShadowWarnings) -> Listing {
    let mut entries: BTreeMap<String, ListedEntry> = BTreeMap::new();
    for page in pages {
        for p in &page.prefixes {
            let Some(name) = p
                .strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix('/'))
            else {
                continue;
            };
            if !is_visible(name) {
                continue;
            }
            if let Some(old) = entries.get(name) {
                if old.kind == Kind::File {
                    warnings.warn(&format!("{prefix}{name}"));
                }
            }
            entries.insert(
                name.to_string(),
                ListedEntry {
                    name: name.to_string(),
                    kind: Kind::Dir,
                    meta: None,
                },
            );
        }
        for o in &page.objects {
            let Some(name) = o.name.strip_prefix(prefix) else {
                continue;
            };
            // The directory's own marker object (`prefix` itself) is not an entry.
            if !is_visible(name) {
                continue;
            }
            match entries.get(name) {
                Some(e) if e.kind == Kind::Dir => warnings.warn(&o.name),
                _ => {
                    entries.insert(
                        name.to_string(),
                        ListedEntry {
                            name: name.to_string(),
                            kind: Kind::File,
                            meta: Some(ObjMeta::from(o)),
                        },
                    );
                }
            }
        }
    }
    Listing {
        entries: entries.into_values().collect(),
    }
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
        let l = merge("d/", &pages, &w);
        let names: Vec<_> = l.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["a", "implicit", "sub", "z"]);
        assert_eq!(l.find("sub").map(|e| e.kind), Some(Kind::Dir));
        assert_eq!(l.find("a").and_then(|e| e.meta).map(|m| m.size), Some(1));
        assert!(l.find("nope").is_none());
        assert!(w.0.lock().unwrap().contains("d/sub"));
    }
}
