//! The built-in emulator: the server side of the `google.storage.v2` wire, serving a local
//! directory (or memory) as buckets. Depends only on `crate::proto`; shares no state with the
//! client.
