//! The superblock: all the mount knows of names. It owns the inode table, the cached
//! listings (and which directories are too large to list whole), the negative cache, their
//! TTLs and the name rules; it answers lookups and listings; and it is told of every change
//! as a named event (`created`, `removed`, `renamed`, `written`) that drops exactly the
//! cached answers the change made wrong. No handles, no bytes.

use super::dir::{list_dir, merge, ListOptions, ListedEntry, ShadowWarnings};
use super::dir_changes::DirChanges;
use super::error::{self, Errno, FsResult};
use super::inode::{Inode, InodeTable, Kind, ObjMeta, PENDING_GENERATION};
use super::list_parallel::list_request;
use super::listing::{EntryRef, Listing};
use super::removed_names::RemovedNames;
use super::unanswered::{self, Unanswered};
use super::{lock, names};
use crate::config::FsConfig;
use crate::gcs::{self, Client, ListRequest};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The listing request that tells whether directory `dkey` ("a/b/") exists, empty folders
/// included: names from `dkey` on under the prefix `dkey` without its slash, one entry. Any
/// object under the directory, or its folder, comes first and groups into the prefix `dkey`;
/// anything else ("a/b0") means there is no such directory. (A listing under `dkey` itself
/// would not show an empty folder: the folder is the prefix, not an entry of it.)
fn dir_probe(dkey: &str) -> ListRequest {
    ListRequest {
        prefix: dkey.trim_end_matches('/').to_string(),
        delimiter: Some("/".to_string()),
        page_size: 1,
        lexicographic_start: dkey.to_string(),
        include_folders_as_prefixes: true,
        ..Default::default()
    }
}

/// Entries a name probe asks for: room for the object itself, a few names that sort between
/// it and its folder (`name.bak`, `name-1`, ...) and the folder. A fuller page is asked again.
const NAME_PROBE_PAGE: i32 = 16;

/// The one call that answers a lookup of `fkey` in a directory too large to list: every name
/// from `fkey` itself up to its folder `fkey/` and no further (`0` follows `/`), the folder
/// collapsed by the delimiter (empty folders too). Its page holds the object of that name, if
/// any, and the folder, if any, unless it comes back with a next page.
fn name_probe(fkey: &str) -> ListRequest {
    ListRequest {
        prefix: fkey.to_string(),
        delimiter: Some("/".to_string()),
        page_size: NAME_PROBE_PAGE,
        lexicographic_start: fkey.to_string(),
        lexicographic_end: format!("{fkey}0"),
        include_folders_as_prefixes: true,
        ..Default::default()
    }
}

/// Name probes in a large directory after which it is listed whole, in the background: from
/// then on the listing answers its lookups from memory, on the FUSE thread, at one list call
/// per page of names instead of one call per name. It lists a directory whose lookups come
/// too slowly to be listed by one (`PROBES_BEFORE_RELIST`); one known to hold more than
/// `EDITABLE_PAGES` pages is left to its probes.
const PROBES_BEFORE_LISTING: u32 = 128;

/// Pages a listing started by name probes may take: a directory of more names (100,000 at
/// the default page size) keeps its probes, its listing would cost more memory and calls
/// than the probes it saves.
const MOST_PAGES_AFTER_PROBES: usize = 100;

/// Name probes in a large directory, all within one negative TTL, after which a lookup lists
/// it whole when it holds at most `EDITABLE_PAGES` pages; after that, as many probes as that
/// listing took pages (at least these): a writer creating files in it then pays for a
/// listing every negative TTL rather than for a probe per file (every create asks a lookup
/// of its new name first), and a listing never costs more calls than the probes made before
/// it. Fewer in a negative TTL stay probes, up to `PROBES_BEFORE_LISTING`: a listing vouches
/// for missing names no longer than that, and would cost more calls than it saves.
const PROBES_BEFORE_RELIST: u32 = 16;

/// Pages of entries up to which a cached listing is edited on a change rather than dropped
/// (an edit copies one chunk of it, see `listing.rs`), and up to which a lookup in a large
/// directory lists it whole: as many as a listing started by probes may take.
const EDITABLE_PAGES: usize = MOST_PAGES_AFTER_PROBES;

/// What the mount knows of a directory found to hold more than one page.
#[derive(Debug)]
struct LargeDir {
    /// Name probes in it since it was found large, or since its last listing: the background
    /// listing starts at `PROBES_BEFORE_LISTING` of them.
    probes: AtomicU32,
    /// The probes of the current negative TTL: when the first was made, and how many.
    recent: Mutex<(Instant, u32)>,
    /// It held more than `EDITABLE_PAGES` pages: lookups do not list it.
    past_editable: AtomicBool,
    /// Pages its last listing by a lookup took (0 before the first).
    pages: AtomicUsize,
}

impl Default for LargeDir {
    fn default() -> Self {
        LargeDir {
            probes: AtomicU32::new(0),
            recent: Mutex::new((Instant::now(), 0)),
            past_editable: AtomicBool::new(false),
            pages: AtomicUsize::new(0),
        }
    }
}

impl LargeDir {
    /// Counts a probe: one more since the last listing, and one more in the current negative
    /// TTL (`ttl`), which starts afresh once its first probe is older than that. The count
    /// since the last listing, before this probe.
    fn probed(&self, ttl: Duration) -> u32 {
        let mut recent = lock(&self.recent);
        if recent.0.elapsed() >= ttl {
            *recent = (Instant::now(), 0);
        }
        recent.1 += 1;
        self.probes.fetch_add(1, Ordering::Relaxed)
    }

    /// Probes made within the current negative TTL (`ttl`).
    fn recent_probes(&self, ttl: Duration) -> u32 {
        let recent = lock(&self.recent);
        if recent.0.elapsed() >= ttl {
            0
        } else {
            recent.1
        }
    }

    /// Listed: counting starts afresh.
    fn listed(&self) {
        *lock(&self.recent) = (Instant::now(), 0);
        self.probes.store(0, Ordering::Relaxed);
    }
}

/// Caches `listing` of directory `dkey` unless the directory changed through the mount
/// since its count was `since` (read before it was listed): that change's edit found no
/// cached listing to edit, so this one may lack it (a created file missing, a removed one
/// back). The check and the insert are one step with respect to edits of the same listing.
/// Whether it was cached.
fn keep_listing(
    cache: &moka::sync::Cache<String, Arc<Listing>>,
    changes: &DirChanges,
    since: u64,
    dkey: &str,
    listing: &Arc<Listing>,
) -> bool {
    let mut kept = false;
    cache.entry_by_ref(dkey).and_compute_with(|_| {
        if changes.count(dkey) == since {
            kept = true;
            moka::ops::compute::Op::Put(listing.clone())
        } else {
            moka::ops::compute::Op::Nop
        }
    });
    kept
}

/// The listing cache: by directory key, weighed by the bytes the listing holds so that
/// `cap_bytes` bounds the memory of all listings together, least recently used first out.
/// Entries it drops are counted toward giving the memory back (`reclaim`).
fn listing_cache(ttl: Duration, cap_bytes: u64) -> Option<moka::sync::Cache<String, Arc<Listing>>> {
    (!ttl.is_zero()).then(|| {
        moka::sync::Cache::builder()
            .max_capacity(cap_bytes)
            .weigher(|dkey: &String, l: &Arc<Listing>| {
                u32::try_from(dkey.len() + l.heap_bytes()).unwrap_or(u32::MAX)
            })
            // An edit replaces a listing with a copy that shares all its chunks but one:
            // counting the whole listing as freed would have every create in a large
            // directory ask for the memory to be given back.
            .eviction_listener(|_, l: Arc<Listing>, cause| {
                if cause != moka::notification::RemovalCause::Replaced {
                    super::reclaim::freed(l.len() as u64)
                }
            })
            .time_to_live(ttl)
            .build()
    })
}

/// What the mount knows of its large directories, each forgotten once unused for `ttl` (a
/// directory in use keeps what its listings taught: its size, and the probes since).
fn large_dir_cache(ttl: Duration) -> Option<moka::sync::Cache<String, Arc<LargeDir>>> {
    (!ttl.is_zero()).then(|| {
        moka::sync::Cache::builder()
            .max_capacity(4096)
            .time_to_idle(ttl)
            .build()
    })
}

/// One directory's `list_whole` call, shared by everyone who wants it while it runs.
type ListingCall = Arc<tokio::sync::OnceCell<Option<Arc<Listing>>>>;

/// A TTL cache, or none when the TTL is zero (nothing is cached).
fn ttl_cache<K, V>(ttl: Duration, capacity: u64) -> Option<moka::sync::Cache<K, V>>
where
    K: std::hash::Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    (!ttl.is_zero()).then(|| {
        moka::sync::Cache::builder()
            .max_capacity(capacity)
            .time_to_live(ttl)
            .build()
    })
}

/// What the metadata of a mount holds, for `stats` and the tests of its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MetadataUsage {
    /// Inodes the kernel holds lookups on, the root included.
    pub inodes: u64,
    /// The memory they take (estimated from their keys): with the listings' weight, bounded
    /// by `fs.metadata_cache_mb`, past which the kernel is asked to let go of some.
    pub inode_bytes: u64,
    /// Directory listings cached.
    pub listings: u64,
    /// Their weight in bytes, bounded by `fs.metadata_cache_mb`.
    pub listing_bytes: u64,
}

/// What the mount knows of names (see the module doc).
pub(super) struct Superblock {
    client: Client,
    bucket: String,
    /// The key of the mount's root directory (`only_dir`), empty or ending in `/`.
    pub(super) root_key: String,
    inodes: InodeTable,
    stat_ttl: Duration,
    /// Listings by directory key (not inode: prefetch lists directories the kernel has not
    /// looked up yet).
    listings: Option<moka::sync::Cache<String, Arc<Listing>>>,
    /// The listing cache's cap in bytes (`fs.metadata_cache_mb`).
    metadata_cap: u64,
    /// Directories found to hold more than one page, with the name probes made in each:
    /// lookups in them are name probes until `PROBES_BEFORE_RELIST` within a negative TTL
    /// (up to `EDITABLE_PAGES`) or `PROBES_BEFORE_LISTING` in all.
    large_dirs: Option<moka::sync::Cache<String, Arc<LargeDir>>>,
    /// `list_whole` calls in flight, by directory key.
    listing_now: Mutex<HashMap<String, ListingCall>>,
    list_options: ListOptions,
    negative: Option<moka::sync::Cache<(u64, String), ()>>,
    /// How long a name found missing stays missing, in the negative cache or in a listing.
    negative_ttl: Duration,
    warnings: Arc<ShadowWarnings>,
    /// The changes made through this mount (creates, removals, renames, writes), counted
    /// per directory: a listing is cached only if its directory did not change while it was
    /// taken (see `keep_listing`).
    changes: Arc<DirChanges>,
    /// Names removed through this mount lately, which directory handles reading on from an
    /// older listing leave out.
    removed_names: RemovedNames,
    /// Directory renames so far: each drops every cached listing at once, and an edit that
    /// read a listing before one must not put it back.
    dir_renames: AtomicU64,
    /// Files created whose create may not have reached the service: every listing fetched
    /// gets them.
    unanswered: Arc<Unanswered>,
    /// Names, (parent directory's inode, name), whose version a read found gone from the
    /// bucket (`version_gone`): the kernel is asked to let go of them (`inodes_to_shed`).
    gone_names: Mutex<HashSet<(u64, String)>>,
}

impl Superblock {
    /// The metadata of a mount of `bucket` as `fs` configures it.
    pub(super) fn new(client: Client, bucket: &str, fs: &FsConfig) -> Superblock {
        let ms = crate::config::ttl;
        let root = names::dir_prefix(fs.only_dir.as_deref());
        Superblock {
            client,
            bucket: bucket.to_string(),
            inodes: InodeTable::new(root.clone()),
            root_key: root,
            stat_ttl: ms(fs.stat_ttl_ms),
            listings: listing_cache(ms(fs.list_ttl_ms), fs.metadata_cache_mb << 20),
            metadata_cap: fs.metadata_cache_mb << 20,
            large_dirs: large_dir_cache(ms(fs.list_ttl_ms)),
            listing_now: Mutex::new(HashMap::new()),
            list_options: ListOptions::from_config(fs),
            negative: ttl_cache(ms(fs.negative_ttl_ms), 100_000),
            negative_ttl: ms(fs.negative_ttl_ms),
            warnings: Arc::default(),
            changes: Arc::default(),
            removed_names: RemovedNames::default(),
            dir_renames: AtomicU64::new(0),
            unanswered: Arc::default(),
            gone_names: Mutex::default(),
        }
    }

    pub(super) fn inode(&self, ino: u64) -> FsResult<Inode> {
        self.inodes.get(ino).ok_or(Errno::ENOENT)
    }

    pub(super) fn dir_inode(&self, ino: u64) -> FsResult<Inode> {
        let inode = self.inode(ino)?;
        if inode.kind != Kind::Dir {
            return Err(Errno::ENOTDIR);
        }
        Ok(inode)
    }

    /// Resolves `name` in directory `parent`, counting one kernel lookup on the result.
    pub(super) async fn lookup(&self, parent: u64, name: &str) -> FsResult<Inode> {
        let dir = self.dir_inode(parent)?;
        if name.len() > names::NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if !names::is_visible(name) {
            return Err(Errno::ENOENT);
        }
        if let Some(found) = self.listed(&dir, name) {
            return found;
        }
        if let Some(pending) = self.pending_file(&names::file_key(&dir.key(), name)) {
            return Ok(pending);
        }
        let neg_key = (parent, name.to_string());
        if self
            .negative
            .as_ref()
            .is_some_and(|c| c.contains_key(&neg_key))
        {
            return Err(Errno::ENOENT);
        }
        let fkey = names::file_key(&dir.key(), name);
        let dkey = names::dir_key(&dir.key(), name);
        // A directory not known to be large is listed (one page): when that page is the whole
        // directory it answers this lookup and every later one in the directory (a dataset's
        // class folder costs one call, not two per file).
        if let Some(listing) = self.whole_listing(&dir.key()).await {
            return self.lookup_in(&dir, &listing, name);
        }
        // A large directory whose names are asked for by the dozen (a writer filling it, a
        // reader walking it) is listed rather than probed name by name.
        if let Some(listing) = self.relisted(&dir.key()).await {
            return self.lookup_in(&dir, &listing, name);
        }
        self.count_probe_and_list(&dir.key());
        // One call finds the object and the folder of that name together; only a page
        // crowded with names between the two (`name.1`, `name.2`, ...) needs two calls.
        let asked = Instant::now();
        let (obj, sub) = match self
            .client
            .list_page(&self.bucket, &name_probe(&fkey))
            .await
        {
            Ok(page) if page.next_page_token.is_empty() => {
                let obj = page.objects.iter().find(|o| o.name == fkey).cloned();
                let missing = || gcs::Error::NotFound(fkey.clone());
                (obj.ok_or_else(missing), Ok(page))
            }
            Err(e) => return Err(error::log_err("lookup", &fkey, &e)),
            Ok(_) => {
                // Finds empty folders too (see `dir_probe`).
                let probe = dir_probe(&dkey);
                tokio::join!(
                    self.client.get_object(&self.bucket, &fkey),
                    self.client.list_page(&self.bucket, &probe)
                )
            }
        };
        match (obj, sub) {
            (obj, Ok(page)) if page.prefixes.contains(&dkey) => {
                if obj.is_ok() {
                    self.warnings.warn(&fkey);
                }
                let inode = self.inodes.lookup(&dkey, Kind::Dir, None);
                Ok(inode)
            }
            (Ok(meta), _) => {
                let (kind, target) = Kind::of_object(&meta);
                let meta = Some(ObjMeta::from(&meta));
                let inode = self.inodes.lookup_as_of(&fkey, kind, meta, asked);
                if let Some(target) = target {
                    inode.set_target(target);
                }
                Ok(inode)
            }
            (Err(gcs::Error::NotFound(_)), Ok(_) | Err(gcs::Error::NotFound(_))) => {
                if let Some(c) = &self.negative {
                    c.insert(neg_key, ());
                }
                Err(Errno::ENOENT)
            }
            (Err(gcs::Error::NotFound(_)), Err(e)) | (Err(e), _) => {
                Err(error::log_err("lookup", &fkey, &e))
            }
        }
    }

    /// A fresh listing of directory `dkey` when one page holds all of it (see `list_whole`).
    /// `None`: the directory is large, listings are not cached, or the call failed; the
    /// caller asks for what it needs by name.
    pub(super) async fn whole_listing(&self, dkey: &str) -> Option<Arc<Listing>> {
        if self.large_dirs.as_ref()?.contains_key(dkey) {
            return None;
        }
        self.list_whole(dkey, 1).await
    }

    /// A fresh listing of large directory `dkey`, listed whole once `PROBES_BEFORE_RELIST`
    /// name probes (or, after its first such listing, as many as that listing took pages)
    /// have been made in it within a negative TTL, when it holds at most `EDITABLE_PAGES`
    /// pages: from then on the edits of this mount's changes keep it, and it answers lookups
    /// as `whole_listing`'s does. `None`: not yet, not that small, no negative TTL (every
    /// missing name is asked afresh, and a probe is the cheapest way to ask), or the call
    /// failed (tried again after as many probes).
    async fn relisted(&self, dkey: &str) -> Option<Arc<Listing>> {
        let large = self.large_dirs.as_ref()?.get(dkey)?;
        let pages = u32::try_from(large.pages.load(Ordering::Relaxed)).unwrap_or(u32::MAX);
        if self.negative_ttl.is_zero()
            || large.past_editable.load(Ordering::Relaxed)
            || large.recent_probes(self.negative_ttl) < PROBES_BEFORE_RELIST.max(pages)
        {
            return None;
        }
        // A listing the warm-up or a readdir cached says how large the directory is.
        if self
            .cached_listing(dkey)
            .is_some_and(|l| l.len() > self.most_edited())
        {
            large.past_editable.store(true, Ordering::Relaxed);
            return None;
        }
        let listing = self.list_whole(dkey, EDITABLE_PAGES).await;
        if let Some(l) = &listing {
            let pages = l.len().div_ceil(self.page_entries());
            large.pages.store(pages, Ordering::Relaxed);
        }
        large.listed();
        listing
    }

    /// Directory `dkey` listed whole when it holds at most `most_pages` pages: the cached
    /// listing while it is younger than the negative TTL, or else one call that every
    /// concurrent caller shares (a lookup joins the listing prefetch started, and the other
    /// way round). A directory found larger is marked so (`large_dirs`).
    async fn list_whole(&self, dkey: &str, most_pages: usize) -> Option<Arc<Listing>> {
        let listings = self.listings.as_ref()?;
        let call = {
            let mut now = lock(&self.listing_now);
            match now.get(dkey) {
                Some(call) => call.clone(),
                None => {
                    // Checked under the lock: a call that has just ended cached its listing
                    // before it left `listing_now`, so a caller arriving after it finds that
                    // listing instead of listing the directory again. Only while it still
                    // vouches for the names it lacks (see `listed`).
                    if let Some(listing) = listings
                        .get(dkey)
                        .filter(|l| l.listed_at.elapsed() < self.negative_ttl)
                    {
                        return Some(listing);
                    }
                    now.entry(dkey.to_string()).or_default().clone()
                }
            }
        };
        let listing = call
            .get_or_init(|| async {
                let since = self.changes.count(dkey);
                let pending = self.unanswered.in_dir(dkey);
                let mut req = list_request(dkey, self.list_options.page_size);
                let mut pages = Vec::new();
                loop {
                    match self.client.list_page(&self.bucket, &req).await {
                        Ok(page) => {
                            req.page_token = page.next_page_token.clone();
                            pages.push(page);
                        }
                        Err(e) => {
                            tracing::debug!(dir = dkey, error = %e, "listing failed");
                            return None;
                        }
                    }
                    if req.page_token.is_empty() {
                        break;
                    }
                    if pages.len() >= most_pages {
                        self.found_larger(dkey, most_pages);
                        return None;
                    }
                }
                let listing = merge(dkey, pages, &self.warnings);
                let listing = Arc::new(self.completed(dkey, listing, &pending));
                keep_listing(listings, &self.changes, since, dkey, &listing);
                Some(listing)
            })
            .await
            .clone();
        let mut now = lock(&self.listing_now);
        if now.get(dkey).is_some_and(|c| Arc::ptr_eq(c, &call)) {
            now.remove(dkey);
        }
        listing
    }

    /// Directory `dkey` holds more than `pages` pages: large from now on, and past
    /// `EDITABLE_PAGES` not listed whole by lookups either.
    fn found_larger(&self, dkey: &str, pages: usize) {
        let Some(large) = &self.large_dirs else {
            return;
        };
        let dir = large.get_with_by_ref(dkey, Arc::default);
        if pages >= EDITABLE_PAGES {
            dir.past_editable.store(true, Ordering::Relaxed);
        }
    }

    /// Counts a name probe in large directory `dkey`; the probe that reaches
    /// `PROBES_BEFORE_LISTING` starts listing the directory whole in the background, page by
    /// page up to `MOST_PAGES_AFTER_PROBES`, into the listing cache (weighed against its cap
    /// like any listing). A listing that failed, or that a change through this mount may
    /// have made stale, is tried again after as many probes; a directory past the pages is
    /// left to its probes.
    fn count_probe_and_list(&self, dkey: &str) {
        let (Some(large), Some(listings)) = (&self.large_dirs, &self.listings) else {
            return;
        };
        let Some(dir) = large.get(dkey) else {
            return;
        };
        if dir.probed(self.negative_ttl) != PROBES_BEFORE_LISTING - 1
            || dir.past_editable.load(Ordering::Relaxed)
        {
            return;
        }
        let (client, bucket, dkey) = (self.client.clone(), self.bucket.clone(), dkey.to_string());
        let (warnings, listings, changes, unanswered) = (
            self.warnings.clone(),
            listings.clone(),
            self.changes.clone(),
            self.unanswered.clone(),
        );
        let mut req = list_request(&dkey, self.list_options.page_size);
        tokio::spawn(async move {
            let since = changes.count(&dkey);
            if !unanswered.in_dir(&dkey).is_empty() {
                // It could come back without a file just created; as many probes later, again.
                dir.probes.store(0, Ordering::Relaxed);
                return;
            }
            let mut pages = Vec::new();
            loop {
                let page = match client.list_page(&bucket, &req).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::debug!(dir = dkey, error = %e, "listing failed");
                        dir.probes.store(0, Ordering::Relaxed);
                        return;
                    }
                };
                req.page_token = page.next_page_token.clone();
                pages.push(page);
                if req.page_token.is_empty() {
                    break;
                }
                if pages.len() >= MOST_PAGES_AFTER_PROBES {
                    return;
                }
            }
            let listing = Arc::new(merge(&dkey, pages, &warnings));
            if !keep_listing(&listings, &changes, since, &dkey, &listing) {
                // The directory changed meanwhile: try again after as many probes.
                dir.probes.store(0, Ordering::Relaxed);
            }
        });
    }

    /// `lookup` as far as the directory's cached listing answers it, with no call to make:
    /// what the FUSE thread can answer at once. `None`: ask `lookup`.
    pub(super) fn lookup_cached(&self, parent: u64, name: &str) -> Option<FsResult<Inode>> {
        let dir = self.dir_inode(parent).ok()?;
        if name.len() > names::NAME_MAX || !names::is_visible(name) {
            return None;
        }
        self.listed(&dir, name)
    }

    /// What the cached listing of `dir` says of `name`, if it vouches for it.
    fn listed(&self, dir: &Inode, name: &str) -> Option<FsResult<Inode>> {
        let listing = self.listings.as_ref()?.get(&dir.key())?;
        // A listing answers for the names it holds as long as it is kept, but for a name it
        // lacks only as long as a negative entry would: an object created elsewhere then
        // shows up as soon as it would without the listing.
        match self.lookup_in(dir, &listing, name) {
            Err(Errno::ENOENT) if listing.listed_at.elapsed() >= self.negative_ttl => None,
            found => Some(found),
        }
    }

    /// Resolves `name` from `listing`, the listing of directory `dir`.
    fn lookup_in(&self, dir: &Inode, listing: &Listing, name: &str) -> FsResult<Inode> {
        let found = listing.find(name).ok_or(Errno::ENOENT)?;
        Ok(self.found_listed(&dir.key(), found, listing.listed_at))
    }

    /// The inode of entry `e` of the listing of directory `dkey`, counting one kernel lookup.
    /// A listing vouches for what the service said at `listed_at`: an inode that learned a
    /// newer size since (written through this mount) keeps it.
    pub(super) fn found_listed(&self, dkey: &str, e: EntryRef<'_>, listed_at: Instant) -> Inode {
        if e.kind == Kind::Dir {
            return self
                .inodes
                .lookup(&names::dir_key(dkey, e.name), Kind::Dir, None);
        }
        let inode =
            self.inodes
                .lookup_as_of(&names::file_key(dkey, e.name), e.kind, e.meta, listed_at);
        if let Some(target) = e.target {
            inode.set_target(target.clone());
        }
        inode
    }

    /// Concurrent listings of a parallel listing, or of the warm-up.
    pub(super) fn list_workers(&self) -> usize {
        self.list_options.workers
    }

    /// Names (parent directory's inode, name) of the files the kernel should let go of, the
    /// least recently looked up first, when the inodes it holds (each counted with its key)
    /// and the cached listings together take more memory than `fs.metadata_cache_mb`: the
    /// inodes down to four fifths of what the listings leave, so that a walk creating inodes
    /// fast needs a round (a scan of every inode) only every so many thousand. The kernel
    /// holds an inode as long as it keeps its name's dentry, which only memory pressure on
    /// the kernel's side ends: a walk of ten million files would otherwise leave two
    /// gigabytes here, charged to the daemon (a sidecar's memory limit), not the walker.
    ///
    /// The names whose version a read found gone come first.
    pub(super) fn inodes_to_shed(&self) -> Vec<(u64, String)> {
        let mut shed: Vec<_> = lock(&self.gone_names).drain().collect();
        let listed = self.listings.as_ref().map_or(0, |c| c.weighted_size());
        let room = self.metadata_cap.saturating_sub(listed);
        let held = self.inodes.bytes();
        if held <= room {
            return shed;
        }
        let average = held / (self.inodes.len() as u64).max(1);
        let over = held - room / 5 * 4;
        let excess = usize::try_from(over / average.max(1)).unwrap_or(usize::MAX);
        shed.extend(
            self.inodes
                .least_recent_files(excess)
                .iter()
                .filter_map(|key| self.name_of(key)),
        );
        shed
    }

    /// (parent directory's inode, name) of `key`, while the kernel holds its directory.
    fn name_of(&self, key: &str) -> Option<(u64, String)> {
        let dir = self.inodes.find(names::parent_dir(key), Kind::Dir)?;
        Some((dir.ino, names::base_name(key).to_string()))
    }

    /// Event: a read of generation `generation` of `inode` found it gone from the bucket,
    /// replaced or deleted by another mount or client. Its name is found anew at the next
    /// open: the cached listing of its directory is dropped, and the kernel is asked to let
    /// go of the name, whose inode it would otherwise open again for its entry TTL, each
    /// read failing with ESTALE, as a reader polling a checkpoint another node replaces
    /// would. Only for the version the name leads to (a read of one this mount has moved or
    /// replaced since says nothing of the name), and once until the kernel is told: a
    /// reader retrying meanwhile does not list the directory again each time.
    pub(super) fn version_gone(&self, inode: &Inode, generation: i64) {
        let current = inode.meta().0.map(|m| m.generation);
        if !inode.is_named() || current != Some(generation) || generation == PENDING_GENERATION {
            return;
        }
        let key = inode.key();
        let Some(name) = self.name_of(&key) else {
            return;
        };
        if !lock(&self.gone_names).insert(name) {
            return;
        }
        let dkey = names::parent_dir(&key);
        self.changes.changed(dkey);
        self.drop_listing(dkey);
    }

    /// What the metadata holds now: inodes, cached listings and their weight.
    pub(super) fn usage(&self) -> MetadataUsage {
        let (listings, listing_bytes) = self.listings.as_ref().map_or((0, 0), |c| {
            c.run_pending_tasks();
            (c.entry_count(), c.weighted_size())
        });
        MetadataUsage {
            inodes: self.inodes.len() as u64,
            inode_bytes: self.inodes.bytes(),
            listings,
            listing_bytes,
        }
    }

    /// The kernel dropped `n` lookups of `ino`.
    pub(super) fn forget(&self, ino: u64, n: u64) {
        if self.inodes.forget(ino, n) {
            super::reclaim::freed(1);
        }
    }

    /// The inode of `key` as found by a listing or a call (`meta` for a file), counting one
    /// kernel lookup: a new one when the key is new or names another generation now.
    pub(super) fn found(&self, key: &str, kind: Kind, meta: Option<ObjMeta>) -> Inode {
        self.inodes.lookup(key, kind, meta)
    }

    /// The inode the kernel holds for `key`, if any, without counting a lookup.
    pub(super) fn held(&self, key: &str, kind: Kind) -> Option<Inode> {
        self.inodes.find(key, kind)
    }

    /// The inode number `key` has or will have (readdir reports it without a lookup).
    pub(super) fn ino_of(&self, key: &str, kind: Kind) -> u64 {
        self.inodes.peek_ino(key, kind)
    }

    /// Current metadata of a file or link, fetched again once older than the stat TTL. A
    /// file whose create is pending is known only here: the service would not find it.
    pub(super) async fn fresh_meta(&self, inode: &Inode) -> FsResult<ObjMeta> {
        if let Some(m) = self.cached_meta(inode) {
            return Ok(m);
        }
        if let (Some(m), _) = inode.meta() {
            // A name that no longer leads to the inode (unlinked while open, or replaced)
            // tells nothing about it: the service would answer for another object, or none.
            if self.unanswered.holds(inode.ino) || !inode.is_named() {
                return Ok(m);
            }
        }
        let asked = Instant::now();
        let meta = self
            .client
            .get_object(&self.bucket, &inode.key())
            .await
            .map_err(|e| error::log_err("stat", &inode.key(), &e))?;
        Ok(inode.refresh_as_of(ObjMeta::from(&meta), asked))
    }

    /// The inode's metadata while younger than the stat TTL.
    pub(super) fn cached_meta(&self, inode: &Inode) -> Option<ObjMeta> {
        match inode.meta() {
            (Some(m), Some(at)) if at.elapsed() < self.stat_ttl => Some(m),
            _ => None,
        }
    }

    /// The listing of directory `ino`: the cached one while fresh, else listed again.
    pub(super) async fn listing(&self, ino: u64) -> FsResult<Arc<Listing>> {
        let dir = self.dir_inode(ino)?;
        if let Some(l) = self.listings.as_ref().and_then(|c| c.get(&dir.key())) {
            return Ok(l);
        }
        let dkey = dir.key();
        let since = self.changes.count(&dkey);
        let pending = self.unanswered.in_dir(&dkey);
        let listing = list_dir(
            &self.client,
            &self.bucket,
            &dkey,
            &self.warnings,
            self.list_options,
        )
        .await
        .map(|l| Arc::new(self.completed(&dkey, l, &pending)))
        .map_err(|e| error::log_err("list", &dkey, &e))?;
        if let Some(c) = &self.listings {
            keep_listing(c, &self.changes, since, &dkey, &listing);
        }
        Ok(listing)
    }

    /// Lists directory `dkey` into the listing cache (the warm-up at mount) and returns the
    /// keys of its subdirectories and how many entries it holds; `None` when listings are
    /// not cached or the cache is nearly full, so the warm-up stops short of the cap
    /// instead of evicting what it has just listed.
    pub(super) async fn warm_listing(&self, dkey: &str) -> FsResult<Option<(Vec<String>, u64)>> {
        let Some(cache) = &self.listings else {
            return Ok(None);
        };
        // The weight is only brought up to date by the cache's pending work.
        cache.run_pending_tasks();
        if cache.weighted_size() >= self.metadata_cap / 10 * 9 {
            return Ok(None);
        }
        let since = self.changes.count(dkey);
        let pending = self.unanswered.in_dir(dkey);
        let listing = list_dir(
            &self.client,
            &self.bucket,
            dkey,
            &self.warnings,
            self.list_options,
        )
        .await
        .map(|l| self.completed(dkey, l, &pending))
        .map_err(|e| error::log_err("list", dkey, &e))?;
        let subdirs = listing
            .iter()
            .filter(|e| e.kind == Kind::Dir)
            .map(|e| names::dir_key(dkey, e.name))
            .collect();
        let n = listing.len() as u64;
        keep_listing(cache, &self.changes, since, dkey, &Arc::new(listing));
        Ok(Some((subdirs, n)))
    }

    /// The names of directory `dkey` removed through this mount at `since` or later.
    pub(super) fn names_removed_since(&self, dkey: &str, since: Instant) -> HashSet<String> {
        self.removed_names.since(dkey, since)
    }

    /// The cached listing of directory `dkey`, if one is kept.
    pub(super) fn cached_listing(&self, dkey: &str) -> Option<Arc<Listing>> {
        self.listings.as_ref()?.get(dkey)
    }

    /// Event: `entry` of directory `parent` now exists (a file created, a directory made, a
    /// link made). It is no longer missing, and the directory's cached listing gets it:
    /// dropping the listing instead would have the next lookup of a new name (every create
    /// asks one first) list the whole directory again, a cost growing with every file.
    pub(super) fn created(&self, parent: u64, entry: ListedEntry) {
        self.dir_changed(parent);
        if let Some(c) = &self.negative {
            c.invalidate(&(parent, entry.name.to_string()));
        }
        if let Ok(dir) = self.inode(parent) {
            self.removed_names.exists(&dir.key(), &entry.name);
        }
        self.edit_listing(parent, |l| l.with(&entry));
    }

    /// Changes the cached listing of directory `parent`, if one is kept, in one step with
    /// respect to other edits of it (a copy: readers keep the listing they hold). Its age
    /// stays that of the call that listed it: what it vouches for stays as old. A listing
    /// of more than `EDITABLE_PAGES` pages is dropped instead: lookups in so large a
    /// directory are name probes anyway, and every edit would copy its table of chunks.
    fn edit_listing(&self, parent: u64, edit: impl FnOnce(&Listing) -> Listing) {
        let (Some(c), Ok(dir)) = (&self.listings, self.inode(parent)) else {
            return;
        };
        let most = self.most_edited();
        let renames = self.dir_renames.load(Ordering::Acquire);
        c.entry(dir.key()).and_compute_with(|cached| match cached {
            Some(_) if self.dir_renames.load(Ordering::Acquire) != renames => {
                moka::ops::compute::Op::Remove
            }
            Some(l) if l.value().len() <= most => {
                moka::ops::compute::Op::Put(Arc::new(edit(l.value())))
            }
            Some(_) => moka::ops::compute::Op::Remove,
            None => moka::ops::compute::Op::Nop,
        });
    }

    /// The most entries a cached listing may hold and still be edited on a change.
    fn most_edited(&self) -> usize {
        self.page_entries().saturating_mul(EDITABLE_PAGES)
    }

    /// Entries in a full listing page (the config keeps it at 1 to 1,000).
    fn page_entries(&self) -> usize {
        usize::try_from(self.list_options.page_size)
            .unwrap_or(1)
            .max(1)
    }

    /// Event: `key` (a file, or a directory with everything below it), name `name` of
    /// directory `parent`, is gone.
    pub(super) fn removed(&self, parent: u64, name: &str, key: &str, kind: Kind) {
        self.dir_changed(parent);
        self.inodes.unlink(key, kind);
        if kind == Kind::Dir {
            self.changes.changed(key);
            self.drop_listing(key);
            // An object of the same name, hidden by the directory until now, may show: the
            // parent is listed again rather than edited.
            self.name_changed(parent, name);
        } else {
            if let Some(c) = &self.negative {
                c.invalidate(&(parent, name.to_string()));
            }
            self.edit_listing(parent, |l| l.without(name));
        }
        self.note_removed(parent, name);
    }

    /// Records name `name` of `parent` as removed, once its cached listing no longer holds
    /// it (see `RemovedNames::removed`).
    fn note_removed(&self, parent: u64, name: &str) {
        if let Ok(dir) = self.inode(parent) {
            self.removed_names.removed(&dir.key(), name);
        }
    }

    /// Event: `from` (name `name` of `parent`) is now `to` (name `newname` of `newparent`);
    /// its inode follows it.
    pub(super) fn renamed(
        &self,
        (parent, name): (u64, &str),
        (newparent, newname): (u64, &str),
        (from, to): (&str, &str),
        kind: Kind,
    ) {
        self.dir_changed(parent);
        self.dir_changed(newparent);
        self.inodes.rename(from, to, kind);
        if kind == Kind::Dir {
            self.changes.all_changed();
            // Every listing below the directory named it by its old key. Edits in flight
            // see the count move and drop theirs rather than put it back.
            self.dir_renames.fetch_add(1, Ordering::AcqRel);
            if let Some(c) = &self.listings {
                c.invalidate_all();
            }
        }
        self.name_changed(parent, name);
        self.name_changed(newparent, newname);
        self.note_removed(parent, name);
        if let Ok(dir) = self.inode(newparent) {
            self.removed_names.exists(&dir.key(), newname);
        }
    }

    /// Event: file `inode` was written (its size changed): its directory's cached listing,
    /// taken while it grew, holds an old size, and gets the inode's (or is dropped, when the
    /// name no longer leads to the inode). No other listing changed.
    pub(super) fn written(&self, inode: &Inode) {
        // A create still unanswered (a truncate through another handle, before the first
        // flush) stays added to the listings fetched.
        if inode
            .meta()
            .0
            .is_none_or(|m| m.generation != PENDING_GENERATION)
        {
            self.unanswered.remove(inode);
        }
        let key = inode.key();
        let (dkey, name) = (names::parent_dir(&key), names::base_name(&key));
        self.changes.changed(dkey);
        let Some(c) = &self.listings else {
            return;
        };
        // An inode its name no longer leads to (unlinked, replaced by a rename, or forgotten)
        // would put the metadata of a version that is gone, or not its own, under that name.
        let Some(meta) = inode.meta().0.filter(|_| inode.is_named()) else {
            self.drop_listing(dkey);
            return;
        };
        let most = self.most_edited();
        let renames = self.dir_renames.load(Ordering::Acquire);
        c.entry_by_ref(dkey).and_compute_with(|cached| {
            let Some(l) = cached else {
                return moka::ops::compute::Op::Nop;
            };
            if self.dir_renames.load(Ordering::Acquire) != renames {
                return moka::ops::compute::Op::Remove;
            }
            let l = l.value();
            if l.len() > most {
                return moka::ops::compute::Op::Remove;
            }
            match l.find(name) {
                Some(e) if e.kind == inode.kind => {
                    let mut e = e.to_owned();
                    e.meta = Some(meta);
                    moka::ops::compute::Op::Put(Arc::new(l.with(&e)))
                }
                // Not in the listing as this file: let the next lookup ask.
                _ => moka::ops::compute::Op::Remove,
            }
        });
    }

    /// The inode of file `key`, just created through this mount as `meta` says: a new one,
    /// counted once. A create the service has not answered yet (`PENDING_GENERATION`) is
    /// added to the listings fetched until its writer's first release, should they overtake
    /// it; call this before `created`, which tells them the directory changed.
    pub(super) fn created_file(&self, key: &str, meta: ObjMeta) -> Inode {
        let inode = self.inodes.created(key, meta);
        if meta.generation == PENDING_GENERATION {
            self.unanswered.add(&inode);
        }
        inode
    }

    /// The inode file `key` names while its create is pending (see `unanswered.rs`),
    /// counting one kernel lookup: the service would not find it.
    fn pending_file(&self, key: &str) -> Option<Inode> {
        let named = self.inodes.find(key, Kind::File)?;
        self.unanswered
            .holds(named.ino)
            .then(|| self.inodes.lookup(key, Kind::File, None))
    }

    /// Files in directory `dkey` or below whose create the service may not have seen yet.
    pub(super) fn pending_under(&self, dkey: &str) -> Vec<Inode> {
        self.unanswered.under(dkey)
    }

    /// `listing` of `dkey`, fetched from the service, with the files `pending` before it
    /// was asked for that it lacks (see `unanswered.rs`).
    fn completed(&self, dkey: &str, listing: Listing, pending: &[Inode]) -> Listing {
        if pending.is_empty() {
            return listing;
        }
        unanswered::complete(listing, dkey, pending, |key, inode| {
            self.inodes
                .find(key, Kind::File)
                .is_some_and(|named| named.ino == inode.ino)
        })
    }

    /// Directory `parent` changed through the mount; called before its listing is edited.
    fn dir_changed(&self, parent: u64) {
        if let Ok(dir) = self.inode(parent) {
            self.changes.changed(&dir.key());
        }
    }

    /// The name `name` in `parent` changed: forget what the caches say of it and of the
    /// directory's listing.
    fn name_changed(&self, parent: u64, name: &str) {
        if let Some(c) = &self.negative {
            c.invalidate(&(parent, name.to_string()));
        }
        if let Ok(dir) = self.inode(parent) {
            self.drop_listing(&dir.key());
        }
    }

    /// Drops the cached listing of `dkey` in one step with respect to its edits: a plain
    /// invalidate could land between an edit's read of the listing and its put, and the
    /// edit would bring back the listing it dropped (with a renamed file's old name).
    fn drop_listing(&self, dkey: &str) {
        if let Some(c) = &self.listings {
            c.entry_by_ref(dkey)
                .and_compute_with(|_| moka::ops::compute::Op::Remove);
        }
    }
}
