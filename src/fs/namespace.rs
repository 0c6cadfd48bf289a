//! The namespace operations of [`Fs`]: unlink, mkdir, rmdir and rename, mapped onto the
//! hierarchical namespace of a Rapid bucket: files and links are objects (DeleteObject,
//! MoveObject), directories are folders of the Storage Control API
//! (Create/Delete/RenameFolder), so an empty directory made by mkdir stays visible (listings
//! include folders as prefixes).
//!
//! After each change the superblock is told (created, removed, renamed), and it corrects the
//! caches that could answer for the old state: the listing of every directory involved,
//! negative entries of new names, and the inode table (an inode follows its object through a
//! rename, since the kernel keeps using it under the new name). The kernel updates its own
//! dentries from our answers.
//!
//! Touches the client and the superblock; no kernel types.

use super::dir::ListedEntry;
use super::error::{log_err, Errno, FsResult};
use super::inode::{Inode, Kind};
use super::{names, Entry, Fs};
use crate::gcs::{self, ListRequest};
use std::sync::Arc;

/// `renameat2` flags this filesystem understands.
const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;

/// What `dir_contents` found in a directory.
enum DirContents {
    /// Entries a listing shows.
    Entries,
    /// None; only these aside objects (name, generation).
    Empty { asides: Vec<(String, i64)> },
}

impl Fs {
    /// Refuses `name` for a new entry when no file could have it (ENAMETOOLONG past 255
    /// bytes, EINVAL for a name a listing would hide).
    pub(super) fn check_name(name: &str) -> FsResult<()> {
        if name.len() > names::NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        if !names::is_visible(name) {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }

    /// Refuses the object (or folder) name `key` of a new entry before the service would,
    /// with the errno a local filesystem gives: ENAMETOOLONG for a name longer than the
    /// service holds (a folder of more than 512 bytes, more than 50 levels, an object name
    /// of more than 1,024 bytes), EINVAL where its naming rules forbid the name (a carriage
    /// return or line feed in it). A create answers before the service does, so its refusal
    /// would only come at the close.
    pub(super) fn check_key(key: &str) -> FsResult<()> {
        if key.len() > names::KEY_MAX
            || names::parent_dir(key).len() > names::FOLDER_MAX
            || key.matches('/').count() > names::DEPTH_MAX
        {
            return Err(Errno::ENAMETOOLONG);
        }
        if !names::is_storable(key) {
            return Err(Errno::EINVAL);
        }
        Ok(())
    }

    /// What `name` in `parent` is now (None: nothing), without keeping a kernel lookup on it.
    pub(super) async fn existing(&self, parent: u64, name: &str) -> FsResult<Option<Inode>> {
        match self.lookup(parent, name).await {
            Ok(e) => {
                let inode = self.inode(e.attr.ino);
                self.forget(e.attr.ino, 1);
                inode.map(Some)
            }
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `unlink(2)`: deletes the object, exactly the generation this mount knows (or, when it
    /// knows none or that one is gone already, the one live now).
    pub async fn unlink(&self, parent: u64, name: &str) -> FsResult<()> {
        self.writable()?;
        let dir = self.dir_inode(parent)?;
        let i = &self.inner;
        let key = names::file_key(&dir.key(), name);
        let held = i.sb.held(&key, Kind::File);
        if let Some(n) = &held {
            // Its create may still be on its way: a delete could overtake it. Only the
            // answer matters; a create that failed left nothing to delete.
            let _ = self.settle_created(n).await;
            // Open for writing: the handles go on with a staged copy once the object is gone.
            i.writes.stage_for_unlink(n.ino).await;
        }
        let known = held.as_ref().and_then(|n| n.meta().0).map(|m| m.generation);
        let mut tries = match known {
            Some(g) => vec![Some(g), None],
            None => vec![None],
        };
        tries.reverse();
        // Whether the last delete found no object (rather than another generation).
        let mut found_none = false;
        loop {
            let Some(want) = tries.pop() else {
                if found_none {
                    return Err(self.gone(parent, name, &key, Kind::File));
                }
                return Err(Errno::ENOENT);
            };
            let generation = match want {
                Some(g) => g,
                None => match i.client.get_object(&i.bucket, &key).await {
                    Ok(m) => m.generation,
                    Err(gcs::Error::NotFound(_)) => {
                        return Err(self.gone(parent, name, &key, Kind::File))
                    }
                    Err(e) => return Err(log_err("unlink", &key, &e)),
                },
            };
            match i
                .client
                .delete_object(&i.bucket, &key, Some(generation))
                .await
            {
                Ok(()) => break,
                Err(gcs::Error::NotFound(_)) => found_none = true,
                Err(gcs::Error::PreconditionFailed(_)) => found_none = false,
                Err(e) => return Err(log_err("unlink", &key, &e)),
            }
        }
        if let Some(n) = &held {
            i.writes.unlinked(n.ino).await;
        }
        i.sb.removed(parent, name, &key, Kind::File);
        Ok(())
    }

    /// `mkdir(2)`: creates the folder (and any missing parent folder); counts one lookup.
    pub async fn mkdir(&self, parent: u64, name: &str) -> FsResult<Entry> {
        self.writable()?;
        Self::check_name(name)?;
        let dir = self.dir_inode(parent)?;
        let i = &self.inner;
        let dkey = names::dir_key(&dir.key(), name);
        Self::check_key(&dkey)?;
        i.client
            .create_folder(&i.bucket, &dkey, true)
            .await
            .map_err(|e| match e {
                gcs::Error::AlreadyExists(_) | gcs::Error::PreconditionFailed(_) => {
                    Errno(libc::EEXIST)
                }
                e => log_err("mkdir", &dkey, &e),
            })?;
        i.sb.created(
            parent,
            ListedEntry {
                name: name.into(),
                kind: Kind::Dir,
                meta: None,
                target: None,
            },
        );
        let inode = i.sb.found(&dkey, Kind::Dir, None);
        Ok(self.entry(&inode))
    }

    /// Whether directory `dkey` holds anything but its marker and the unfinalized aside
    /// objects of uploads (`gcs::is_aside_name`, which listings hide); those it returns, as
    /// (name, generation), for a removal of the directory to delete.
    async fn dir_contents(&self, dkey: &str) -> FsResult<DirContents> {
        let i = &self.inner;
        let mut req = ListRequest {
            prefix: dkey.to_string(),
            delimiter: Some("/".to_string()),
            page_size: 2,
            include_folders_as_prefixes: true,
            ..Default::default()
        };
        let mut asides = Vec::new();
        loop {
            let page = i
                .client
                .list_page(&i.bucket, &req)
                .await
                .map_err(|e| log_err("rmdir", dkey, &e))?;
            if !page.prefixes.is_empty() {
                return Ok(DirContents::Entries);
            }
            // The directory's own marker object (`dkey` itself) is not an entry.
            for o in page.objects.into_iter().filter(|o| o.name != dkey) {
                // A finalized one may be the only copy of a file whose old version was
                // deleted before a move that failed (`Client::move_into_place`): kept.
                if o.finalized || !gcs::is_aside_name(names::base_name(&o.name)) {
                    return Ok(DirContents::Entries);
                }
                asides.push((o.name, o.generation));
            }
            // A page may be shorter than asked for, even empty, with more to come.
            if page.next_page_token.is_empty() {
                return Ok(DirContents::Empty { asides });
            }
            req.page_token = page.next_page_token;
        }
    }

    /// Deletes the empty directory `dkey`: its folder and any marker object.
    async fn remove_dir(&self, dkey: &str) -> FsResult<()> {
        let i = &self.inner;
        // A file created in it may not have reached the service yet (one whose create
        // failed is not there, which the listing below shows).
        let _ = self.settle_created_under(dkey).await;
        let asides = match self.dir_contents(dkey).await? {
            DirContents::Entries => return Err(Errno(libc::ENOTEMPTY)),
            DirContents::Empty { asides } => asides,
        };
        // What a directory that shows empty still holds is an upload's leftover (a daemon
        // killed mid-upload) or one about to land in it, which the removal wins as it would
        // win over a create racing it. The service would refuse to delete a folder with it.
        for (aside, generation) in asides {
            i.client.discard(&i.bucket, &aside, generation).await;
        }
        // The marker first: the service counts it as content of the folder, which it would
        // then refuse to delete.
        let marker = i.client.delete_object(&i.bucket, dkey, None).await;
        let folder = i.client.delete_folder(&i.bucket, dkey).await;
        match (folder, marker) {
            (Ok(()), _) | (Err(gcs::Error::NotFound(_)), Ok(())) => Ok(()),
            (Err(gcs::Error::PreconditionFailed(_)), _) => Err(Errno(libc::ENOTEMPTY)),
            (Err(gcs::Error::NotFound(_)), Err(gcs::Error::NotFound(_))) => Err(Errno::ENOENT),
            (Err(gcs::Error::NotFound(_)), Err(e)) | (Err(e), _) => Err(log_err("rmdir", dkey, &e)),
        }
    }

    /// `rmdir(2)`: ENOTEMPTY unless the directory is empty.
    pub async fn rmdir(&self, parent: u64, name: &str) -> FsResult<()> {
        self.writable()?;
        let dir = self.dir_inode(parent)?;
        let dkey = names::dir_key(&dir.key(), name);
        match self.remove_dir(&dkey).await {
            Err(Errno::ENOENT) => return Err(self.gone(parent, name, &dkey, Kind::Dir)),
            removed => removed?,
        }
        self.inner.sb.removed(parent, name, &dkey, Kind::Dir);
        Ok(())
    }

    /// Open files go on reading what they read after it moved: each read side whose object
    /// (name, generation) `moved` maps to a new name and generation reads the same bytes
    /// there from now on. POSIX leaves open descriptors alone across a rename.
    fn readers_follow(&self, moved: impl Fn((&str, i64)) -> Option<(String, i64)>) {
        let i = &self.inner;
        let replaced = i.handles.repoint_reads(|h| {
            let (key, generation) = moved(h.object())?;
            Some(Arc::new(i.reads.moved(h, &key, generation)))
        });
        for old in replaced {
            i.reads.release(&old);
        }
    }

    /// Name `name` of `parent` (`key`) was deleted elsewhere before this mount could: it
    /// leaves the caches, which would go on showing it for their TTLs. ENOENT, to return.
    fn gone(&self, parent: u64, name: &str, key: &str, kind: Kind) -> Errno {
        self.inner.sb.removed(parent, name, key, kind);
        Errno::ENOENT
    }

    /// `rename(2)`: a file or link with MoveObject (atomically replacing a file or link of the
    /// target name), a directory with RenameFolder (replacing an empty directory of the target
    /// name), with the POSIX errors: EISDIR, ENOTDIR, ENOTEMPTY, and EEXIST for
    /// RENAME_NOREPLACE.
    pub async fn rename(
        &self,
        parent: u64,
        name: &str,
        newparent: u64,
        newname: &str,
        flags: u32,
    ) -> FsResult<()> {
        self.writable()?;
        if flags & !RENAME_NOREPLACE != 0 {
            return Err(Errno::EINVAL);
        }
        Self::check_name(newname)?;
        self.dir_inode(parent)?;
        let to_dir = self.dir_inode(newparent)?;
        // Before any call; a directory's key (one slash longer) is checked once known.
        Self::check_key(&names::file_key(&to_dir.key(), newname))?;
        let src = self.existing(parent, name).await?.ok_or(Errno::ENOENT)?;
        let dst = self.existing(newparent, newname).await?;
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
            return Ok(());
        }
        if dst.is_some() && flags & RENAME_NOREPLACE != 0 {
            return Err(Errno(libc::EEXIST));
        }
        let from = src.key();
        match src.kind {
            // A link's object moves like a file's and keeps its metadata, so it stays a link.
            Kind::File | Kind::Symlink => {
                if dst.as_ref().is_some_and(|d| d.kind == Kind::Dir) {
                    return Err(Errno::EISDIR);
                }
                let to = names::file_key(&to_dir.key(), newname);
                if let Some(d) = &dst {
                    // A create of the target still on its way would land after the move; one
                    // that failed left nothing there.
                    let _ = self.settle_created(d).await;
                    // Open for writing: its handles go on with a staged copy once it is
                    // replaced, as after an unlink.
                    self.inner.writes.stage_for_unlink(d.ino).await;
                }
                let renamed = || {
                    self.inner.sb.renamed(
                        (parent, name),
                        (newparent, newname),
                        (&from, &to),
                        src.kind,
                    )
                };
                self.move_file(&src, &to, flags & RENAME_NOREPLACE != 0, renamed)
                    .await?;
                if let Some(d) = &dst {
                    self.inner.writes.unlinked(d.ino).await;
                }
                Ok(())
            }
            Kind::Dir => {
                if dst.as_ref().is_some_and(|d| d.kind != Kind::Dir) {
                    return Err(Errno::ENOTDIR);
                }
                let to = names::dir_key(&to_dir.key(), newname);
                Self::check_key(&to)?;
                if to.starts_with(&from) {
                    return Err(Errno::EINVAL);
                }
                if dst.is_some() {
                    self.remove_dir(&to).await?;
                }
                // Files created inside still on their way would land under the old name;
                // one whose create failed left nothing to move.
                let _ = self.settle_created_under(&from).await;
                let i = &self.inner;
                // Files open for writing inside go on under the new name, as after a file's
                // rename: their streams would be fenced by the move.
                i.writes
                    .moving_under(&from, || async {
                        i.client
                            .rename_folder(&i.bucket, &from, &to)
                            .await
                            .map_err(|e| match e {
                                gcs::Error::AlreadyExists(_) => Errno(libc::ENOTEMPTY),
                                e => log_err("rename", &from, &e),
                            })?;
                        i.sb.renamed((parent, name), (newparent, newname), (&from, &to), src.kind);
                        // A folder's objects keep their generations as they move.
                        self.readers_follow(|(key, generation)| {
                            let rest = key.strip_prefix(from.as_str())?;
                            Some((format!("{to}{rest}"), generation))
                        });
                        Ok(())
                    })
                    .await
            }
        }
    }

    /// Moves file `src` to key `to`, then `renamed` tells the superblock, which moves the
    /// inode along: streamed writes are made durable first, and none comes in until the inode
    /// has its new key (`Writes::moving`). The source must still be the generation this
    /// mount knows (retried once with the live one when it changed).
    async fn move_file(
        &self,
        src: &Inode,
        to: &str,
        noreplace: bool,
        renamed: impl FnOnce(),
    ) -> FsResult<()> {
        let i = &self.inner;
        i.writes
            .moving(src.ino, || async {
                let from = src.key();
                let known = src.meta().0.map(|m| gcs::MoveSource {
                    generation: m.generation,
                    size: m.size,
                    crc32c: None,
                });
                let dst_pre = noreplace.then_some(0);
                // The generation that moved, when it is the one this mount knows.
                let mut moved_generation = known.map(|k| k.generation);
                let moved = match i
                    .client
                    .move_object(&i.bucket, &from, to, known, dst_pre)
                    .await
                {
                    // The source was replaced since this mount learned it, or (with
                    // `noreplace`) the destination exists: the retry with the live source
                    // tells which.
                    Err(gcs::Error::PreconditionFailed(_)) if known.is_some() => {
                        moved_generation = None;
                        i.client
                            .move_object(&i.bucket, &from, to, None, dst_pre)
                            .await
                    }
                    r => r,
                };
                let meta = moved.map_err(|e| match e {
                    gcs::Error::PreconditionFailed(_) if noreplace => Errno(libc::EEXIST),
                    e => log_err("rename", &from, &e),
                })?;
                // The inode's new key first: a reader that sees its new generation
                // (`Fs::follow`) then reads it under that key.
                renamed();
                src.replace(super::inode::ObjMeta::from(&meta));
                if let Some(old) = moved_generation {
                    self.readers_follow(|(key, generation)| {
                        (key == from && generation == old)
                            .then(|| (to.to_string(), meta.generation))
                    });
                }
                Ok(meta.generation)
            })
            .await
    }
}
