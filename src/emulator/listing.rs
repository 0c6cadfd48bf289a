//! ListObjects over one bucket's index: prefix, delimiter (objects grouped into prefixes),
//! folders as prefixes, lexicographic start/end, read masks, and pages with opaque tokens.
//! Pure: reads the index it is given.

use super::faults::Faults;
use super::object_proto::{lag_behind_appends, to_proto_masked, ObjectFields};
use super::store::{BucketState, Entry};
use crate::proto::storage::{ListObjectsRequest, ListObjectsResponse};
use std::collections::btree_map::Range;
use std::iter::Peekable;
use std::ops::Bound;
use std::time::SystemTime;
use tonic::Status;

/// Items per page when the request does not say.
const DEFAULT_PAGE_SIZE: usize = 1000;

/// A page token: the name the next page starts at (inclusive), hex-encoded so that any name
/// survives the round trip.
fn token(resume_at: &str) -> String {
    resume_at.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The name a page token resumes at.
fn parse_token(token: &str) -> Result<String, Status> {
    let bad = || Status::invalid_argument(format!("invalid page_token {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// The smallest string greater than every string starting with `p`.
fn successor(p: &str) -> Option<String> {
    let mut chars: Vec<char> = p.chars().collect();
    while let Some(c) = chars.pop() {
        let mut n = c as u32 + 1;
        if (0xD800..0xE000).contains(&n) {
            n = 0xE000;
        }
        if let Some(next) = char::from_u32(n) {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

/// Objects and folders from one key on, in key order; skipping to a later key re-seeks.
struct Cursor<'a> {
    b: &'a BucketState,
    objects: Peekable<Range<'a, String, Entry>>,
    folders: Option<Peekable<Range<'a, String, SystemTime>>>,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a BucketState, from: &str, with_folders: bool) -> Self {
        let bounds = (Bound::Included(from), Bound::Unbounded);
        Cursor {
            b,
            objects: b.objects.range::<str, _>(bounds).peekable(),
            folders: with_folders.then(|| b.folders.range::<str, _>(bounds).peekable()),
        }
    }

    /// The next key, with its entry when it is an object (an object wins over a folder of the
    /// same name).
    fn peek(&mut self) -> Option<(&'a str, Option<&'a Entry>)> {
        let obj = self.objects.peek().map(|(k, e)| (k.as_str(), *e));
        let fold = self
            .folders
            .as_mut()
            .and_then(|f| f.peek())
            .map(|(k, _)| k.as_str());
        match (obj, fold) {
            (Some((o, _)), Some(f)) if f < o => Some((f, None)),
            (Some((o, e)), _) => Some((o, Some(e))),
            (None, Some(f)) => Some((f, None)),
            (None, None) => None,
        }
    }

    /// Moves past `key` (in both indexes).
    fn advance_past(&mut self, key: &str) {
        if self.objects.peek().is_some_and(|(k, _)| k.as_str() == key) {
            self.objects.next();
        }
        if let Some(f) = self.folders.as_mut() {
            if f.peek().is_some_and(|(k, _)| k.as_str() == key) {
                f.next();
            }
        }
    }

    /// Moves to the first key at or after `from`.
    fn seek(&mut self, from: &str) {
        *self = Cursor::new(self.b, from, self.folders.is_some());
    }
}

/// Lists `b` as the request asks (and as `faults` distort it). Walks the index once,
/// re-seeking only to skip the rest of a group that became a prefix.
pub(crate) fn list(
    bucket: &str,
    b: &BucketState,
    req: &ListObjectsRequest,
    faults: &Faults,
) -> Result<ListObjectsResponse, Status> {
    if req.page_size < 0 {
        return Err(Status::invalid_argument("page_size is negative"));
    }
    let asked = if req.page_size == 0 {
        DEFAULT_PAGE_SIZE
    } else {
        req.page_size as usize
    };
    let page_size = faults
        .list_page_limit
        .map_or(asked, |limit| asked.min(limit.max(1) as usize));
    let prefix = req.prefix.as_str();
    let delimiter = req.delimiter.as_str();
    let fields = ObjectFields::from_mask(req.read_mask.as_ref());
    let from = if req.page_token.is_empty() {
        prefix.max(req.lexicographic_start.as_str()).to_string()
    } else {
        parse_token(&req.page_token)?
    };
    let end = req.lexicographic_end.as_str();
    let mut cursor = Cursor::new(
        b,
        &from,
        req.include_folders_as_prefixes && !delimiter.is_empty(),
    );
    let mut resp = ListObjectsResponse::default();
    let mut count = 0;
    while let Some((key, entry)) = cursor.peek() {
        if !key.starts_with(prefix) || (!end.is_empty() && key >= end) {
            break;
        }
        let rest = &key[prefix.len()..];
        let group = if delimiter.is_empty() {
            None
        } else {
            rest.find(delimiter)
                .map(|i| &key[..prefix.len() + i + delimiter.len()])
        };
        match (group, entry) {
            // A folder that is not below a delimiter is the prefix itself: not listed.
            (None, None) => {
                cursor.advance_past(key);
                continue;
            }
            _ if count == page_size => {
                resp.next_page_token = token(group.unwrap_or(key));
                break;
            }
            (Some(g), _) => {
                resp.prefixes.push(g.to_string());
                match successor(g) {
                    Some(next) => cursor.seek(&next),
                    None => break,
                }
            }
            (None, Some(e)) => {
                let mut o = to_proto_masked(bucket, key, e, &fields);
                if faults.stale_unfinalized_size {
                    lag_behind_appends(&mut o, e);
                }
                resp.objects.push(o);
                cursor.advance_past(key);
            }
        }
        count += 1;
    }
    Ok(resp)
}
