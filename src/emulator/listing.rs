//! ListObjects over one bucket's index: prefix, delimiter (objects grouped into prefixes),
//! folders as prefixes, lexicographic start/end, and pages with opaque tokens. Pure: reads
//! the index it is given.

use super::store::{to_proto, BucketState};
use crate::proto::storage::{ListObjectsRequest, ListObjectsResponse};
use std::ops::Bound;
use tonic::Status;

/// Items per page when the request does not say.
const DEFAULT_PAGE_SIZE: usize = 1000;

/// One listed item.
enum Item {
    Object(String),
    Prefix(String),
}

/// Where the next search starts.
#[derive(Clone)]
enum From {
    Included(String),
    Excluded(String),
}

impl From {
    fn bound(&self) -> (Bound<&str>, Bound<&str>) {
        match self {
            From::Included(s) => (Bound::Included(s.as_str()), Bound::Unbounded),
            From::Excluded(s) => (Bound::Excluded(s.as_str()), Bound::Unbounded),
        }
    }

    fn token(&self) -> String {
        let (tag, key) = match self {
            From::Included(s) => ('i', s),
            From::Excluded(s) => ('x', s),
        };
        let mut out = String::from(tag);
        for b in key.as_bytes() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    fn parse(token: &str) -> Result<From, Status> {
        let bad = || Status::invalid_argument(format!("invalid page_token {token:?}"));
        let (tag, hex) = token.split_at_checked(1).ok_or_else(bad)?;
        if hex.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        let key = String::from_utf8(bytes).map_err(|_| bad())?;
        match tag {
            "i" => Ok(From::Included(key)),
            "x" => Ok(From::Excluded(key)),
            _ => Err(bad()),
        }
    }
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

/// Lists `b` as the request asks.
pub(crate) fn list(
    bucket: &str,
    b: &BucketState,
    req: &ListObjectsRequest,
) -> Result<ListObjectsResponse, Status> {
    if req.page_size < 0 {
        return Err(Status::invalid_argument("page_size is negative"));
    }
    let page_size = if req.page_size == 0 {
        DEFAULT_PAGE_SIZE
    } else {
        req.page_size as usize
    };
    let prefix = req.prefix.as_str();
    let delimiter = req.delimiter.as_str();
    let folders = req.include_folders_as_prefixes && !delimiter.is_empty();
    let mut from = if req.page_token.is_empty() {
        From::Included(prefix.max(req.lexicographic_start.as_str()).to_string())
    } else {
        From::parse(&req.page_token)?
    };
    let end = req.lexicographic_end.as_str();
    let mut resp = ListObjectsResponse::default();
    let mut count = 0;
    loop {
        let obj = b
            .objects
            .range::<str, _>(from.bound())
            .next()
            .map(|(k, _)| k);
        let fold = if folders {
            b.folders
                .range::<str, _>(from.bound())
                .next()
                .map(|(k, _)| k)
        } else {
            None
        };
        let (key, is_folder) = match (obj, fold) {
            (Some(o), Some(f)) if f < o => (f, true),
            (Some(o), _) => (o, false),
            (None, Some(f)) => (f, true),
            (None, None) => break,
        };
        if !key.starts_with(prefix) || (!end.is_empty() && key.as_str() >= end) {
            break;
        }
        let rest = &key[prefix.len()..];
        let group = if delimiter.is_empty() {
            None
        } else {
            rest.find(delimiter)
                .map(|i| &key[..prefix.len() + i + delimiter.len()])
        };
        let (item, next) = match group {
            Some(g) => (
                Item::Prefix(g.to_string()),
                match successor(g) {
                    Some(s) => From::Included(s),
                    None => break,
                },
            ),
            // A folder that is not below a delimiter is the prefix itself: not listed.
            None if is_folder => {
                from = From::Excluded(key.clone());
                continue;
            }
            None => (Item::Object(key.clone()), From::Excluded(key.clone())),
        };
        if count == page_size {
            resp.next_page_token = from.token();
            break;
        }
        match item {
            Item::Object(name) => {
                if let Some(e) = b.objects.get(&name) {
                    resp.objects.push(to_proto(bucket, &name, e));
                }
            }
            Item::Prefix(p) => resp.prefixes.push(p),
        }
        count += 1;
        from = next;
    }
    Ok(resp)
}
